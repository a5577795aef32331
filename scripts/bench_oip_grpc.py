#!/usr/bin/env python3
"""What the agent's optional gRPC server (``api.grpc``, the ``edgekit-runtime[grpc]`` extra) costs.

1. Idle RSS: ``edgekit-agent run`` serving digits-cnn with ``api.grpc`` off and on (alternating
   processes, ``--rss-runs`` each; the median). Each serves 3 requests (on: 3 over gRPC too), then
   settles, then ``VmRSS`` is read.
2. Per-request overhead at batch 1, gRPC ``ModelInfer`` (raw contents, a plain stub over tritonclient's
   messages) against the HTTP Open Inference Protocol binary path (one kept-alive ``http.client``
   connection, bench_agent's ``OipBinaryClient``), interleaved round by round against one agent process
   with both on. Overhead = client wall time - the server's compute time (``X-Edgekit-Compute-Ms`` /
   trailing ``x-edgekit-compute-ms``), so it counts the protocol, the API and the queue.

    python scripts/bench_oip_grpc.py [--bundle DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent


def load_bench_agent() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_agent", REPO / "scripts" / "bench_agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_agent"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def write_config(bench: ModuleType, directory: Path, *, port: int, grpc_port: int | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    api: dict[str, Any] = {"address": f"127.0.0.1:{port}"}
    if grpc_port is not None:
        api["grpc"] = {"listen": f"127.0.0.1:{grpc_port}"}
    data = {"device_id": directory.name, "fleet": "bench", "bundles": {"dir": str(directory / "bundles"), "allow_unsigned": True},
            "api": api, "telemetry": {"interval_s": 60, "spool": {"path": str(directory / "spool.db")}},
            "power": {"sensor": "none"}}  # fmt: skip
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


class GrpcClient:
    """ModelInfer with raw contents over one channel; ``last_compute_ms`` from the trailing metadata."""

    def __init__(self, address: str, model: str) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self._channel = grpc.insecure_channel(address)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._pb2, self._model = service_pb2, model
        self.last_compute_ms = 0.0

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from edgekit_runtime.agent.oip import DATATYPES, datatype_of

        request = self._pb2.ModelInferRequest(model_name=self._model)
        for name, array in feeds.items():
            request.inputs.add(name=name, datatype=datatype_of(array.dtype), shape=array.shape)
            request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
        response, call = self._stub.ModelInfer.with_call(request, timeout=60)
        self.last_compute_ms = float(dict(call.trailing_metadata()).get("x-edgekit-compute-ms", 0.0))
        return {output.name: np.frombuffer(blob, DATATYPES[output.datatype]).reshape(list(output.shape))
                for output, blob in zip(response.outputs, response.raw_output_contents, strict=True)}  # fmt: skip

    def close(self) -> None:
        self._channel.close()


def start_agent(bench: ModuleType, directory: Path, bundle: Path, *, grpc: bool) -> tuple[subprocess.Popen[bytes], int, int | None]:
    port = bench.free_port()
    grpc_port = bench.free_port() if grpc else None
    config = write_config(bench, directory, port=port, grpc_port=grpc_port)
    bench.install_bundle(config, bundle)
    log = (directory / "agent.log").open("wb")
    process = subprocess.Popen(bench.agent_command("run", "--config", str(config)), stdout=log, stderr=subprocess.STDOUT, cwd=directory)
    client = bench.AgentClient(f"127.0.0.1:{port}", timeout_s=60.0)
    deadline_s = time.monotonic() + 120
    while True:
        try:
            if client.health()["status"] == "ok":
                return process, port, grpc_port
        except bench.AgentApiError:
            pass
        if process.poll() is not None or time.monotonic() > deadline_s:
            raise SystemExit(f"agent did not come up; see {directory / 'agent.log'}")
        time.sleep(0.1)


def stop_agent(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def idle_rss(bench: ModuleType, workdir: Path, bundle: Path, model: str, feeds: dict[str, np.ndarray], *, runs: int,
             settle_s: float) -> dict[str, Any]:  # fmt: skip
    samples: dict[str, list[float]] = {"off": [], "on": []}
    for run in range(runs):
        for label in ("off", "on"):
            process, port, grpc_port = start_agent(bench, workdir / f"rss-{label}-{run}", bundle, grpc=label == "on")
            try:
                http = bench.AgentClient(f"127.0.0.1:{port}", timeout_s=60.0)
                for _ in range(3):
                    http.infer(feeds)
                if grpc_port is not None:
                    client = GrpcClient(f"127.0.0.1:{grpc_port}", model)
                    for _ in range(3):
                        client.infer(feeds)
                    client.close()
                time.sleep(settle_s)
                samples[label].append(bench.read_memory(process.pid)["rss_mb"])
            finally:
                stop_agent(process)
    off, on = statistics.median(samples["off"]), statistics.median(samples["on"])
    return {"rss_mb_off": samples["off"], "rss_mb_on": samples["on"], "median_off_mb": off, "median_on_mb": on, "added_mb": on - off}


def overhead(bench: ModuleType, workdir: Path, bundle: Path, model: str, feeds: dict[str, np.ndarray], expected: np.ndarray,
             *, rounds: int, per_round: int) -> dict[str, Any]:  # fmt: skip
    process, port, grpc_port = start_agent(bench, workdir / "overhead", bundle, grpc=True)
    try:
        clients = {"oip_http_binary": bench.OipBinaryClient(f"127.0.0.1:{port}", model),
                   "oip_grpc": GrpcClient(f"127.0.0.1:{grpc_port}", model)}  # fmt: skip
        for client in clients.values():  # warm-up, and both answer with the golden numbers
            for _ in range(50):
                outputs = client.infer(feeds)
            np.testing.assert_allclose(next(iter(outputs.values())), expected, rtol=1e-5, atol=1e-5)
        overhead_us: dict[str, list[float]] = {name: [] for name in clients}
        for round_index in range(rounds):
            order = list(clients) if round_index % 2 == 0 else list(reversed(clients))
            for name in order:
                client = clients[name]
                for _ in range(per_round):
                    started = time.perf_counter_ns()
                    client.infer(feeds)
                    wall_us = (time.perf_counter_ns() - started) / 1000
                    overhead_us[name].append(wall_us - client.last_compute_ms * 1000)
        clients["oip_grpc"].close()
    finally:
        stop_agent(process)
    result = {name: {"overhead_us_median": statistics.median(values), "overhead_us_p90": float(np.percentile(values, 90)),
                     "requests": len(values)} for name, values in overhead_us.items()}  # fmt: skip
    result["grpc_minus_http_us"] = result["oip_grpc"]["overhead_us_median"] - result["oip_http_binary"]["overhead_us_median"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, help="a digits-cnn bundle (default: edgekit build recipes/digits-cnn.yaml)")
    parser.add_argument("--rss-runs", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=300)
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    bench = load_bench_agent()
    with tempfile.TemporaryDirectory(prefix="bench-oip-grpc-") as temp:
        workdir = Path(temp)
        bundle = bench.ensure_bundle("recipes/digits-cnn.yaml", args.bundle, workdir)
        opened = bench.open_bundle(bundle, verify=False)
        feeds = bench.make_feeds(opened.io, {"batch": 1})
        import onnxruntime

        session = onnxruntime.InferenceSession(str(opened.model_path), providers=["CPUExecutionProvider"])
        expected = session.run(None, feeds)[0]  # the bundle's model run directly: the golden output
        result = {
            "host": bench.host_description(),
            "model": "digits-cnn",
            "batch": 1,
            "idle_rss": idle_rss(bench, workdir, bundle, opened.name, feeds, runs=args.rss_runs, settle_s=args.settle_s),
            "per_request": overhead(bench, workdir, bundle, opened.name, feeds, expected, rounds=args.rounds, per_round=args.per_round),
        }
    text = json.dumps(result, indent=2, default=str)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
