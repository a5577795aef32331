"""Issue 18's proof: one real agent (the real Mosquitto on loopback, a small signed bundle) takes every hostile
input in turn, and after each one it still answers an inference request and still publishes telemetry windows
numbered without a gap; its RSS stays bounded through the local API's body and header abuse.

The inputs, in order: a command with a 5,000-character id, a 5,000-deep payload, a retained poison command, a
replayed command id, a deploy whose failure names 3,000 files, a downgrade, forbidden ``file://`` and
``http://`` sources, hostile tars, local API abuse (16 connections claiming 64 MB bodies, oversized headers,
malformed request lines, deep JSON, absurd shapes) and non-finite outputs."""

from __future__ import annotations

import hashlib
import http.client
import json
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from edgekit.bundle.signing import sign_bundle
from edgekit_runtime.agent.bounded import MAX_EVENT_BYTES
from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.agent.telemetry import utc_timestamp
from edgekit_runtime.schemas import validate_message
from edgekit_runtime.signing import encode_signature, load_private_key
from tests.runtime.agent_service.bundles import make_bundle, pack_tar, tar_with_member
from tests.runtime.agent_service.test_agent_service_mqtt import BROKER, broker_up

pytestmark = pytest.mark.skipif(not broker_up(), reason="no MQTT broker on 127.0.0.1:1883 (apt-get install mosquitto)")

MB = 1024 * 1024
X = np.random.default_rng(3).standard_normal((1, 1, 8, 8)).astype(np.float32)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class FleetSide:
    """The fleet's end of the broker: publishes commands (raw bytes too) and keeps the device's telemetry and
    events with the size of each payload on the wire."""

    def __init__(self, fleet: str, device: str) -> None:
        self.prefix = f"edgekit/v1/{fleet}/{device}"
        self.telemetry: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: list[tuple[dict[str, Any], int]] = []
        self._lock = threading.Lock()
        subscribed = threading.Event()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"fleet-side-{uuid.uuid4().hex[:8]}")
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *args: subscribed.set()
        self.client.connect(*BROKER)
        self.client.loop_start()
        self.client.subscribe([(f"{self.prefix}/telemetry", 1), (f"{self.prefix}/events", 1)])
        assert subscribed.wait(10)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        payload = json.loads(message.payload)
        if message.topic.endswith("/telemetry"):
            self.telemetry.put(payload)
        else:
            with self._lock:
                self.events.append((payload, len(message.payload)))

    def publish(self, payload: bytes, *, retain: bool = False) -> None:
        self.client.publish(f"{self.prefix}/cmd", payload, qos=1, retain=retain).wait_for_publish(5)

    def command(self, command: str, args: dict[str, Any] | None = None, *, command_id: str | None = None) -> str:
        command_id = command_id or uuid.uuid4().hex
        payload = {"schema": "edgekit.command/1", "id": command_id, "command": command, "issued_at": utc_timestamp(),
                   **({"args": args} if args is not None else {})}  # fmt: skip
        self.publish(json.dumps(payload).encode())
        return command_id

    def matching(self, predicate: Callable[[dict[str, Any]], bool]) -> list[tuple[dict[str, Any], int]]:
        with self._lock:
            return [(event, size) for event, size in self.events if predicate(event)]

    def event(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0) -> dict[str, Any]:
        """The first event that matches, with ``wire_bytes`` (its payload's size) added; validated as event.v1."""
        deadline = time.monotonic() + timeout_s
        while not (found := self.matching(predicate)):
            if time.monotonic() > deadline:
                kinds = [(e["kind"], e.get("message", "")[:80]) for e, _ in self.matching(lambda e: True)][-8:]
                raise AssertionError(f"no matching event within {timeout_s} s; the last ones: {kinds}")
            time.sleep(0.02)
        event, size = found[0]
        validate_message(event, "event.v1")
        return {**event, "wire_bytes": size}

    def answer(self, command_id: str, kind: str | None = None) -> dict[str, Any]:
        """The event that ends command ``command_id`` (a deploy's deploy_result, else the first answer)."""
        return self.event(lambda e: e.get("command_id") == command_id and (kind is None or e["kind"] == kind)
                          and e["kind"] not in ("deploy_progress",))  # fmt: skip

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class Liveness:
    """After each hostile input: the agent answers an inference request, and publishes the next telemetry window
    (every window numbered one more than the one before, none missing)."""

    def __init__(self, service: AgentService, fleet: FleetSide) -> None:
        self.service, self.fleet = service, fleet
        self.seqs: list[int] = []
        self.steps: list[str] = []

    def check(self, step: str) -> None:
        logits = AgentClient(self.service.api_address, timeout_s=10).infer({"image": X})["logits"]
        assert logits.shape == (1, 10) and np.isfinite(logits).all(), step
        while True:  # what was published during the step, then one window published after it
            try:
                self._take(self.fleet.telemetry.get_nowait(), step)
            except queue.Empty:
                break
        try:
            self._take(self.fleet.telemetry.get(timeout=10), step)
        except queue.Empty:
            raise AssertionError(f"after {step}: no telemetry window within 10 s (last seq {self.seqs[-1:]})") from None
        health = self.service.health()
        assert health["broker"]["connected"], (step, health["broker"])
        assert all(t["restarts"] == 0 for t in health["threads"].values()), (step, health["threads"])
        self.steps.append(step)

    def _take(self, window: dict[str, Any], step: str) -> None:
        validate_message(window, "telemetry.v1")
        if self.seqs:
            assert window["seq"] == self.seqs[-1] + 1, f"after {step}: window {window['seq']} follows {self.seqs[-1]}"
        self.seqs.append(window["seq"])


def raw_http(address: str, request: bytes) -> tuple[int, bytes]:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, response.read()


def post_infer(address: str, body: bytes, *, accept: str | None = None) -> tuple[int, bytes, dict[str, str]]:
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("POST", "/v1/infer", body=body,
                           headers={"Content-Type": "application/json", **({"Accept": accept} if accept else {})})  # fmt: skip
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


def test_the_agent_keeps_serving_and_reporting_through_every_hostile_input(
    agent_config: Callable[..., Path], fleet_keys: tuple[Path, Path], tmp_path: Path,
) -> None:  # fmt: skip
    fleet_id, device = f"fleet-{uuid.uuid4().hex[:10]}", f"dev-{uuid.uuid4().hex[:10]}"
    sources = tmp_path / "src"

    def signed(name: str, folder: str, **options: Any) -> Path:
        root = make_bundle(sources / folder, name=name, **options)
        sign_bundle(root, fleet_keys[0])
        return root

    config_path = agent_config(
        fleet=fleet_id, device_id=device, broker={"url": "mqtt://127.0.0.1:1883", "keepalive_s": 10},
        bundles={"dir": str(tmp_path / "bundles"), "public_key": str(fleet_keys[1]), "allowed_sources": [str(sources)]},
        api={"address": "127.0.0.1:0", "max_request_mb": 64},
        telemetry={"interval_s": 0.3, "spool": {"path": str(tmp_path / "spool" / "spool.db")}},
    )  # fmt: skip
    assert agent_main(["install", str(signed("tiny-a", "tiny-a-v2000", bundle_version=2000)), "--config", str(config_path)]) == 0
    fleet = FleetSide(fleet_id, device)
    service = AgentService(load_config(config_path)).start()
    live = Liveness(service, fleet)
    try:
        live.check("start")
        rss_start = rss_mb()

        # 1-2. An id past the schema's 128 characters, and 5,000 nested '[': each rejected once, bounded.
        fleet.publish(json.dumps({"schema": "edgekit.command/1", "id": "x" * 5000, "command": "ping",
                                  "issued_at": utc_timestamp()}).encode())  # fmt: skip
        long_id = fleet.event(lambda e: e["kind"] == "command_rejected" and "5000 characters is longer than 128" in e["message"])
        assert long_id["details"]["id_excerpt"] == "x" * 49 + "...[truncated: 5000 characters]"
        live.check("a 5,000-character command id")
        fleet.publish(b"[" * 5000)
        deep = fleet.event(lambda e: e["kind"] == "command_rejected" and "5000 levels deep" in e["message"])
        assert deep["message"] == "command payload nests arrays and objects 5000 levels deep, more than the limit of 16"
        assert deep["wire_bytes"] < 4096
        live.check("a 5,000-deep command payload")

        # 3. A retained poison command is consumed once; the host clears it.
        fleet.publish(b"[" * 4000, retain=True)
        fleet.event(lambda e: "4000 levels deep" in e.get("message", ""))
        fleet.publish(b"", retain=True)
        live.check("a retained poison command")
        assert len(fleet.matching(lambda e: "4000 levels deep" in e.get("message", ""))) == 1

        # 4. A command id seen before, sent again with a fresh issued_at: refused as replayed.
        ping = fleet.command("ping")
        assert fleet.answer(ping)["kind"] == "pong"
        fleet.command("ping", command_id=ping)
        replayed = fleet.event(lambda e: e.get("command_id") == ping and e["kind"] == "command_rejected")
        assert replayed["details"]["reason"] == "replayed", replayed
        live.check("a replayed command id")

        # 5. A deploy whose failure names 3,000 missing files: a bounded deploy_result still arrives.
        huge = make_bundle(sources / "huge", name="tiny-huge")
        manifest = json.loads((huge / "manifest.json").read_text())
        for index in range(3000):
            manifest["files"][f"{'n' * 200}-{index:04d}.npz"] = "0" * 64
        (huge / "manifest.json").write_text(json.dumps(manifest))
        signature = load_private_key(fleet_keys[0]).sign((huge / "manifest.json").read_bytes())
        (huge / "manifest.sig").write_text(encode_signature(signature) + "\n")
        tar = pack_tar(huge, sources / "huge.tar")
        result = fleet.answer(fleet.command("deploy", {"bundle_id": "tiny-huge", "url": tar.as_uri(),
                                                       "sha256": hashlib.sha256(tar.read_bytes()).hexdigest()}), "deploy_result")  # fmt: skip
        assert result["details"]["outcome"] == "failed" and result["wire_bytes"] <= MAX_EVENT_BYTES
        assert result["details"]["truncated_from_bytes"] > 256 * 1024
        live.check("a deploy failure naming 3,000 files")

        # 6. A downgrade: the same bundle, validly signed, with an older bundle_version.
        old = pack_tar(signed("tiny-a", "tiny-a-v1000", bundle_version=1000), sources / "old.tar")
        result = fleet.answer(fleet.command("deploy", {"bundle_id": "tiny-a", "url": old.as_uri(),
                                                       "sha256": hashlib.sha256(old.read_bytes()).hexdigest()}), "deploy_result")  # fmt: skip
        assert result["details"]["outcome"] == "failed" and result["details"]["step"] == "version"
        assert "refusing a downgrade" in result["message"]
        assert service.deployer.served is not None and service.deployer.served.name == "tiny-a"
        live.check("a downgrade")

        # 7. Sources outside the allowed ones: one text whether the file exists or not, nothing fetched.
        refusals = {}
        for url in ("file:///etc/passwd", "file:///etc/no-such-file", "http://127.0.0.1:9/bundle.tar",
                    "http://169.254.169.254/latest/meta-data/"):  # fmt: skip
            answer = fleet.answer(fleet.command("deploy", {"bundle_id": "x", "url": url, "sha256": "0" * 64}), "deploy_result")
            assert answer["details"]["outcome"] == "failed" and "deploy source refused" in answer["message"], answer
            assert "nothing was read or fetched" in answer["message"]
            refusals[url] = answer["message"].replace(url, "URL")
        assert refusals["file:///etc/passwd"] == refusals["file:///etc/no-such-file"]
        passwd_sha256 = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
        assert not fleet.matching(lambda e: passwd_sha256 in json.dumps(e))
        live.check("forbidden file:// and http:// sources")

        # 8. Hostile tars: a member climbing out, and a link.
        for tar, member in ((tar_with_member(sources / "climb.tar", "../escape.txt"), "../escape.txt"),
                            (tar_with_member(sources / "link.tar", "bundle/model.onnx", symlink_to="/etc/passwd"), "bundle/model.onnx")):  # fmt: skip
            answer = fleet.answer(fleet.command("deploy", {"bundle_id": "evil", "url": tar.as_uri(),
                                                           "sha256": hashlib.sha256(tar.read_bytes()).hexdigest()}), "deploy_result")  # fmt: skip
            assert answer["details"]["outcome"] == "failed" and member in answer["message"], answer
        assert not (tmp_path / "bundles" / "escape.txt").exists() and not (tmp_path / "escape.txt").exists()
        assert list((tmp_path / "bundles" / "staging").iterdir()) == []
        live.check("hostile tars")

        # 9. Local API abuse. 16 connections each claim a 64 MB body and send one byte, held open meanwhile.
        address = service.api_address
        host, port = address.rsplit(":", 1)
        rss_before_api = rss_mb()
        held = []
        for _ in range(16):
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(b"POST /v1/infer HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n{" % (64 * MB))  # fmt: skip
            held.append(sock)
        time.sleep(0.5)
        live.check("16 open connections claiming 64 MB bodies")  # served while they are held
        rss_held = rss_mb()
        for sock in held:
            sock.close()
        status, body = raw_http(address, b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * 20000 + b"\r\n\r\n")
        assert status == 431 and json.loads(body)["error"] == "headers_too_large"
        status, body = raw_http(address, b"POST /v1/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: -1e9\r\n\r\n")
        assert status == 400 and json.loads(body)["error"] == "bad_content_length"
        assert "Content-Length '-1e9' is not a non-negative decimal number of bytes" in json.loads(body)["message"]
        # a malformed request line: a 400 with a status line and the reason (not http.server's HTTP/0.9 answer)
        status, body = raw_http(address, b"GET /v1/health HTTP/1.1 and more\r\n\r\n")
        assert status == 400 and json.loads(body)["error"] == "bad_request_line"
        assert json.loads(body)["message"].startswith("malformed request line 'GET /v1/health HTTP/1.1 and more'")
        status, body = raw_http(address, b"POST /v1/infer HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % (65 * MB))
        assert status == 413 and json.loads(body)["error"] == "too_large"
        deep_json = b'{"inputs": {"image": {"dtype": "float32", "data": ' + b"[" * 5_000 + b"]" * 5_000 + b"}}}"
        for request_body, fragment in ((deep_json, "nests JSON arrays or objects too deeply"),
                                       (b'{"inputs": {"image": {"dtype": "float32", "shape": [0, 1e30], "data": []}}}',
                                        "malformed application/json request")):  # fmt: skip
            status, body, _ = post_infer(address, request_body)
            assert status == 400 and json.loads(body)["error"] == "input_signature" and fragment in json.loads(body)["message"]
        live.check("oversized headers, bodies and malformed requests")

        # 10. A model output of NaN and Infinity: valid JSON (strings), counted in a header.
        x = X.copy()
        x[0, 0, 0, 0] = np.nan
        request_body = json.dumps({"inputs": {"image": {"dtype": "float32", "shape": list(x.shape),
                                                        "data": [[[[None if np.isnan(v) else float(v) for v in row] for row in plane]
                                                                  for plane in sample] for sample in x.tolist()]}}}).replace("null", "NaN")  # fmt: skip
        status, body, headers = post_infer(address, request_body.encode(), accept="application/json")
        assert status == 200, body[:300]
        outputs = json.loads(body, parse_constant=lambda name: pytest.fail(f"invalid JSON constant {name}"))
        assert int(headers["X-Edgekit-Non-Finite"]) == 10 and outputs["outputs"]["logits"]["data"] == [["NaN"] * 10]
        live.check("non-finite outputs")

        rss_end = rss_mb()
        assert rss_held - rss_before_api < 48, f"RSS grew {rss_held - rss_before_api:.0f} MB with 16 x 64 MB claims held"
        assert rss_end - rss_start < 100, f"RSS grew from {rss_start:.0f} to {rss_end:.0f} MB through the hostile inputs"
        print(f"\nRSS (test process and agent): {rss_start:.0f} MB at start, {rss_before_api:.0f} MB before the API abuse, "
              f"{rss_held:.0f} MB with 16 x 64 MB claims held, {rss_end:.0f} MB at the end; "
              f"{len(live.steps)} checks, windows {live.seqs[0]}..{live.seqs[-1]} without a gap")  # fmt: skip
    finally:
        service.stop()
        fleet.close()
    assert live.seqs == list(range(live.seqs[0], live.seqs[0] + len(live.seqs)))
