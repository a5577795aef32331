#!/usr/bin/env python
"""The agent as a server under concurrent batch-1 clients, beside a bare in-process ONNX Runtime loop.

    .venv/bin/python scripts/bench_serving.py --bundle DIR [--seconds 6] [--rounds 2] [--concurrency 1,4,16]
        [--protocols http,grpc] [--max-batch 16] [--max-delay-ms 1.0] [--perf-analyzer PATH] [--out FILE]

Two agents run as processes (``edgekit-agent run``) with the bundle installed, HTTP and gRPC on
loopback: ``plain`` (no ``batching`` section: one runner call per request) and ``batched`` (``batching:
{max_batch, max_delay_ms}``: concurrent requests combined). For each protocol and concurrency, in
every round, three cases run back to back for ``--seconds`` each: ``bare`` (``session.run`` at batch 1
in a loop in this process, on a session made from the bundle with its manifest's options, as the agent
makes it), then ``plain``, then ``batched``; each agent case's ratio is to the ``bare`` run just before
it, so the three see the same moment of a shared host. The load comes from perf_analyzer (the
tritonclient 2.41.0 wheel's ``bin/perf_analyzer``, with libb64 and the CUDA runtime on
``LD_LIBRARY_PATH``) when ``--perf-analyzer`` is given, else from one tritonclient per thread (binary
tensors over HTTP). Prints a table, and writes JSON with the CPU flags and load averages to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from edgekit_runtime.backends import create_runner
from edgekit_runtime.bundle import open_bundle

CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "amx_tile")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_flags() -> list[str]:
    text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    return sorted({flag for flag in CPU_FLAGS if re.search(rf"\b{flag}\b", text)})


class Agent:
    """An ``edgekit-agent run`` process serving ``bundle`` on free loopback ports."""

    def __init__(self, root: Path, bundle: Path, batching: dict[str, float] | None) -> None:
        root.mkdir(parents=True)
        self.http_port, self.grpc_port = free_port(), free_port()
        config: dict[str, Any] = {
            "device_id": root.name, "fleet": "bench", "power": {"sensor": "none"},
            "bundles": {"dir": str(root / "bundles"), "allow_unsigned": True},
            "api": {"address": f"127.0.0.1:{self.http_port}", "grpc": {"listen": f"127.0.0.1:{self.grpc_port}"}},
            "telemetry": {"interval_s": 60, "spool": {"path": str(root / "spool.db")}},
        }  # fmt: skip
        if batching is not None:
            config["batching"] = batching
        path = root / "agent.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        command = [sys.executable, "-m", "edgekit_runtime.agent.cli"]
        subprocess.run([*command, "install", "--config", str(path), str(bundle)], check=True, stdout=subprocess.DEVNULL)
        self.process = subprocess.Popen([*command, "run", "--config", str(path)], stdout=subprocess.DEVNULL,
                                        stderr=open(root / "agent.log", "wb"))  # fmt: skip
        self._wait_ready()

    def _wait_ready(self) -> None:
        import urllib.request

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise SystemExit("the agent did not become ready in 60 s; see its agent.log")

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.http_port if protocol == 'http' else self.grpc_port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def bare_loop(session: Any, feeds: dict[str, np.ndarray], seconds: float) -> dict[str, float]:
    names = [output.name for output in session.get_outputs()]
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        session.run(names, feeds)
        count += 1
    return {"throughput_per_s": count / elapsed}


def perf_analyzer(binary: str, model: str, url: str, protocol: str, concurrency: int, seconds: float) -> dict[str, float]:
    command = [binary, "-m", model, "-u", url, "-i", protocol, "--concurrency-range", str(concurrency),
               "--measurement-interval", str(int(seconds * 1000)), "-s", "100", "-r", "3"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds * 10 + 60)
    found = re.search(r"Throughput: ([\d.]+) infer/sec", done.stdout)
    if found is None:
        raise SystemExit(f"perf_analyzer failed ({done.returncode}): {done.stdout[-800:]} {done.stderr[-800:]}")
    p50 = re.search(r"p50 latency: (\d+) usec", done.stdout)
    return {"throughput_per_s": float(found.group(1)), "p50_us": float(p50.group(1)) if p50 else float("nan")}


def tritonclient_load(model: str, url: str, protocol: str, concurrency: int, seconds: float, image: np.ndarray) -> dict[str, float]:
    """``concurrency`` threads, one tritonclient each, batch-1 requests for ``seconds``."""
    if protocol == "http":
        import tritonclient.http as client_module
    else:
        import tritonclient.grpc as client_module
    counts, latencies = [0] * concurrency, [[] for _ in range(concurrency)]  # type: list[int], list[list[float]]
    stop = threading.Event()

    def worker(index: int) -> None:
        client = client_module.InferenceServerClient(url=url)
        item = client_module.InferInput("image", list(image.shape), "FP32")
        item.set_data_from_numpy(image, **({"binary_data": True} if protocol == "http" else {}))
        while not stop.is_set():
            started = time.perf_counter()
            client.infer(model, [item])
            latencies[index].append(time.perf_counter() - started)
            counts[index] += 1
        client.close()

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    every = sorted(value for values in latencies for value in values)
    return {"throughput_per_s": sum(counts) / elapsed, "p50_us": every[len(every) // 2] * 1e6 if every else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True, help="an onnxruntime bundle with image float32[batch, ...] input")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-delay-ms", type=float, default=1.0)
    parser.add_argument("--perf-analyzer", help="path of perf_analyzer; default: a tritonclient load generator")
    parser.add_argument("--out", type=Path, default=Path("out/bench_serving.json"))
    args = parser.parse_args()
    bundle = open_bundle(args.bundle, verify=True)
    runner = create_runner(bundle)
    runner.load()
    session = getattr(runner, "session")  # the onnxruntime runner's InferenceSession  # noqa: B009
    tensor = bundle.io.inputs[0]
    image = np.random.default_rng(0).standard_normal([1 if isinstance(d, str) else d for d in tensor.shape]).astype(tensor.dtype)
    feeds = {tensor.name: image}
    batching = {"max_batch": args.max_batch, "max_delay_ms": args.max_delay_ms}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as scratch:
        agents = {"plain": Agent(Path(scratch) / "plain", args.bundle, None),
                  "batched": Agent(Path(scratch) / "batched", args.bundle, batching)}  # fmt: skip
        model = bundle.name
        try:
            for round_index in range(args.rounds):
                for protocol in args.protocols.split(","):
                    for concurrency in [int(value) for value in args.concurrency.split(",")]:
                        bare = bare_loop(session, feeds, args.seconds)
                        row: dict[str, Any] = {"round": round_index, "protocol": protocol, "concurrency": concurrency,
                                               "bare_per_s": bare["throughput_per_s"], "load_before": os.getloadavg()[0]}  # fmt: skip
                        for kind, agent in agents.items():
                            if args.perf_analyzer:
                                result = perf_analyzer(args.perf_analyzer, model, agent.url(protocol), protocol, concurrency, args.seconds)
                            else:
                                result = tritonclient_load(model, agent.url(protocol), protocol, concurrency, args.seconds, image)
                            row[f"{kind}_per_s"] = result["throughput_per_s"]
                            row[f"{kind}_p50_us"] = result["p50_us"]
                            row[f"{kind}_ratio"] = result["throughput_per_s"] / bare["throughput_per_s"]
                        row["load_after"] = os.getloadavg()[0]
                        rows.append(row)
                        print(f"r{round_index} {protocol:4} c={concurrency:<2} bare {row['bare_per_s']:7.0f}/s  "
                              f"plain {row['plain_per_s']:7.0f}/s ({row['plain_ratio']:.2f}x, p50 {row['plain_p50_us']:.0f} us)  "
                              f"batched {row['batched_per_s']:7.0f}/s ({row['batched_ratio']:.2f}x, p50 {row['batched_p50_us']:.0f} us)  "
                              f"load {row['load_before']:.1f}-{row['load_after']:.1f}", flush=True)  # fmt: skip
        finally:
            for agent in agents.values():
                agent.stop()
    report = {"bundle": str(args.bundle), "model": bundle.name, "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
              "load_generator": "perf_analyzer" if args.perf_analyzer else "tritonclient threads",
              "seconds": args.seconds, "batching": batching, "rows": rows}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"cpu flags {' '.join(report['cpu_flags'])}; wrote {args.out}")


if __name__ == "__main__":
    main()
