"""Host side of scripts/check_arm64.sh: talk to an edgekit agent running under arm64 emulation.

Subscribes to the agent's telemetry topic on the broker first, waits for ``/v1/health`` to say ``ok``
and for a first telemetry window, sends one ``/v1/infer`` request (JSON), compares the answer with the same bundle run here on x86, and
waits for a telemetry window that counts the request. Prints one JSON line; exit 0 when all passed.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt

from edgekit_runtime.backends import create_runner
from edgekit_runtime.bundle import open_bundle


def _image() -> np.ndarray:
    """A fixed 8x8 'two' (docs/agent.md's example), as a [1, 1, 8, 8] float32 batch."""
    rows = [[0.0, 0.0, 0.3, 0.8, 0.8, 0.2, 0.0, 0.0], [0.0, 0.2, 0.9, 0.4, 0.6, 0.7, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.6, 0.6, 0.0, 0.0], [0.0, 0.0, 0.0, 0.3, 0.9, 0.1, 0.0, 0.0],
            [0.0, 0.0, 0.2, 0.9, 0.3, 0.0, 0.0, 0.0], [0.0, 0.1, 0.8, 0.4, 0.0, 0.0, 0.0, 0.0],
            [0.0, 0.3, 1.0, 0.8, 0.8, 0.8, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]  # fmt: skip
    return np.asarray(rows, dtype=np.float32).reshape(1, 1, 8, 8)


def _http(url: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--api", required=True, help="HOST:PORT of the agent's local API")
    parser.add_argument("--broker", default="127.0.0.1:1883", help="HOST:PORT of the MQTT broker")
    parser.add_argument("--fleet", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--bundle", type=Path, required=True, help="the bundle the agent serves (host path)")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="for the agent to become healthy")
    parser.add_argument("--telemetry-timeout-s", type=float, default=120.0)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"ok": False}

    windows: list[dict[str, Any]] = []
    first_window = threading.Event()
    got_window = threading.Event()
    topic = f"edgekit/v1/{args.fleet}/{args.device}/telemetry"

    def on_message(_client: Any, _userdata: Any, message: Any) -> None:
        window = json.loads(message.payload)
        windows.append(window)
        first_window.set()
        if window.get("latency", {}).get("count", 0) >= 1:
            got_window.set()

    subscriber = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"check-arm64-{time.time_ns()}")
    subscriber.on_message = on_message
    host, port = args.broker.rsplit(":", 1)
    subscriber.connect(host, int(port))
    subscriber.subscribe(topic, qos=1)
    subscriber.loop_start()
    try:
        start = time.monotonic()
        health: dict[str, Any] = {}
        while time.monotonic() - start < args.timeout_s:
            try:
                status, health = _http(f"http://{args.api}/v1/health", timeout_s=10)
                if status == 200 and health.get("status") == "ok":
                    break
            except (OSError, ValueError):
                pass
            time.sleep(1.0)
        else:
            result["error"] = f"agent not healthy within {args.timeout_s:g} s: {health}"
            print(json.dumps(result))
            return 1
        result["healthy_after_s"] = round(time.monotonic() - start, 1)
        # The API answers before the telemetry loop opens its first window (a request then is in no
        # window), so send the request once windows are flowing.
        if not first_window.wait(args.telemetry_timeout_s):
            result["error"] = f"no telemetry window on {topic} within {args.telemetry_timeout_s:g} s"
            print(json.dumps(result))
            return 1

        image = _image()
        started = time.monotonic()
        status, reply = _http(f"http://{args.api}/v1/infer",
                              {"inputs": {"image": {"dtype": "float32", "shape": list(image.shape),
                                                    "data": image.tolist()}}})  # fmt: skip
        result["infer_ms"] = round((time.monotonic() - started) * 1000, 1)
        if status != 200:
            result["error"] = f"/v1/infer answered HTTP {status}: {reply}"
            print(json.dumps(result))
            return 1
        arm = np.asarray(reply["outputs"]["logits"]["data"], dtype=np.float32)
        runner = create_runner(open_bundle(args.bundle)).load()
        try:
            x86 = runner.infer({"image": image})["logits"]
        finally:
            runner.close()
        cosine = float(np.dot(arm.ravel(), x86.ravel()) / (np.linalg.norm(arm) * np.linalg.norm(x86)))
        result.update(arm_class=int(arm.argmax()), x86_class=int(x86.argmax()), cosine_to_x86=round(cosine, 6),
                      max_abs_diff_to_x86=float(np.abs(arm - x86).max()))  # fmt: skip
        if arm.shape != x86.shape or arm.argmax() != x86.argmax() or cosine < 0.99:
            result["error"] = "the arm64 agent's answer differs from the same bundle on x86"
            print(json.dumps(result))
            return 1

        if not got_window.wait(args.telemetry_timeout_s):
            result["error"] = (f"no telemetry window counting the request on {topic} within "
                               f"{args.telemetry_timeout_s:g} s ({len(windows)} windows without it)")  # fmt: skip
            print(json.dumps(result))
            return 1
        window = next(w for w in windows if w["latency"]["count"] >= 1)
        result.update(telemetry_windows=len(windows), telemetry_seq=window["seq"],
                      telemetry_count=window["latency"]["count"], telemetry_p50_ms=window["latency"]["p50_ms"])  # fmt: skip
        _status, health = _http(f"http://{args.api}/v1/health", timeout_s=10)
        result["broker_connected"] = bool((health.get("broker") or {}).get("connected"))
        result["ok"] = True
        print(json.dumps(result))
        return 0
    finally:
        subscriber.loop_stop()
        subscriber.disconnect()


if __name__ == "__main__":
    sys.exit(main())
