#!/usr/bin/env python
"""The agent's costs, side by side in one run: serving vs a bare ONNX Runtime loop, the local API, RSS, the spool.

    .venv/bin/python scripts/bench_agent.py [--digits-bundle DIR] [--minilm-bundle DIR] [--pair-s 15] [--case-s 20]
                                            [--telemetry-interval-s 0.5] [--out docs/benchmarks/agent.json]

1. Throughput (digits-cnn at batch 1 and 64, MiniLM at batch 1 and 8 with seq 128): a whole
   :class:`AgentService` runs in this process (telemetry windows every ``--telemetry-interval-s``,
   published through the MQTT link and its spool to the Mosquitto on 127.0.0.1:1883, power sampling
   on). The headline compares ``bare`` (``session.run`` in a loop on the very
   ``onnxruntime.InferenceSession`` the agent serves, checked to use the manifest's options) with
   ``agent`` (``service.server.infer``, the in-process serving path) in many short rounds back to
   back (``--pair-round-s``, order swapped every other round): the machine is shared and noisy, and
   adjacent short rounds see the same moment of it, so the headline is the median of the rounds'
   ratios agent / bare, with a 95 % bootstrap interval (target >= 0.98). Then four variants take turns
   in longer rounds: ``bare``, ``agent``, ``api_binary`` and ``api_json`` (:class:`AgentClient`
   through the local HTTP API), and ``oip_binary`` (the Open Inference Protocol's binary tensor
   path, ``/v2/models/<name>/infer``; target: at most 1.25 x ``api_binary``'s per-request overhead). A round's throughput comes from a tight loop of the variant's call
   alone; a quarter as many calls, timed one by one after it, give the wall times and the per-request
   overheads: medians of (wall time - the compute time the server measured), in microseconds.
   One session serves both, so neither two sessions' memory layouts nor whose weights the CPU cache
   holds can tell them apart; the bare loop does share this process with the agent's threads, so
   their CPU use is reported as well.
2. RSS: ``edgekit-agent run`` as its own process, without a bundle (waiting for a deploy; target
   <= 60 MB), then with each bundle installed and a few requests served; VmRSS and VmHWM from
   /proc/<pid>/status, and whether libonnxruntime is mapped. A bare Python process holding one
   ONNX Runtime session of the same bundle is measured the same way, for scale.
3. The spool: scripts/bench_spool.py's ``run`` (append, then peek + ack) with FULL and NORMAL sync.

Bundles are built with ``edgekit build recipes/<name>.yaml --target x86-64-cpu`` unless given.
Writes JSON to ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from functools import partial
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import yaml

from edgekit.bundle.manifest import host_description  # the dev host's CPU and its int8 flags (this script builds bundles)
from edgekit_runtime import __version__ as runtime_version
from edgekit_runtime.agent.client import AgentClient
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.errors import AgentApiError
from edgekit_runtime.agent.service import AgentService
from edgekit_runtime.backends.base import Runner
from edgekit_runtime.backends.onnxruntime import GRAPH_OPTIMIZATION_LEVELS, OnnxRuntimeRunner
from edgekit_runtime.bundle import Bundle, open_bundle
from edgekit_runtime.signature import IOSignature

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # scripts.* helpers

from scripts.interleaved_rounds import Variant, VariantSamples, interleave, median_interval  # noqa: E402
from scripts.shared_setup import LOCAL_BROKER as BROKER  # noqa: E402
from scripts.shared_setup import aligned_lines, broker_reachable, ensure_bundle, free_port, host_conditions, load_average  # noqa: E402,F401 (free_port: scripts/bench_oip_grpc.py)

THROUGHPUT_TARGET_RATIO = 0.98
IDLE_RSS_TARGET_MB = 60.0
VARIANTS = ("bare", "agent", "api_binary", "api_json", "oip_binary")
#: the Open Inference Protocol's binary path may cost at most this much of /v1's binary per-request overhead
OIP_OVERHEAD_TARGET_RATIO = 1.25
#: (model key, recipe, dims of each case)
CASES: tuple[tuple[str, str, tuple[dict[str, int], ...]], ...] = (
    ("digits-cnn", "recipes/digits-cnn.yaml", ({"batch": 1}, {"batch": 64})),
    ("minilm", "recipes/minilm.yaml", ({"batch": 1, "seq": 128}, {"batch": 8, "seq": 128})),
)


# -- bundles, configs, feeds ----------------------------------------------------------------------------


def write_agent_config(directory: Path, device_id: str, *, interval_s: float, power_sensor: str, port: int = 0) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    data = {
        "device_id": device_id,
        "fleet": "bench",
        "broker": {"url": f"mqtt://{BROKER[0]}:{BROKER[1]}"},
        "bundles": {"dir": str(directory / "bundles"), "allow_unsigned": True},
        "api": {"address": f"127.0.0.1:{port}"},
        # No collector runs here: with the default collector_ack every window would wait in the spool for an
        # ack that never comes and be sent again and again, which is not the agent's steady state. broker_ack
        # removes a window on the broker's PUBACK, as before collector_ack became the default (2f5de57).
        "telemetry": {"interval_s": interval_s, "delivery": "broker_ack", "spool": {"path": str(directory / "spool.db")}},
        "power": {"sensor": power_sensor},
    }
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def agent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgekit_runtime.agent.cli", *args]


def install_bundle(config_path: Path, bundle_dir: Path) -> None:
    subprocess.run(agent_command("install", "--config", str(config_path), str(bundle_dir)), check=True,
                   stdout=subprocess.DEVNULL, cwd=config_path.parent)  # fmt: skip


def make_feeds(signature: IOSignature, dims: Mapping[str, int], *, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for ``signature``: floats standard normal, ``*mask*`` integers all ones, other integers
    in [0, 1000) (valid token ids for any vocabulary of that size or more)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for tensor in signature.inputs:
        shape = [dim if isinstance(dim, int) else dims.get(dim) or signature.dims[dim].opt or 1 for dim in tensor.shape]
        dtype = np.dtype(tensor.dtype)
        if dtype.kind == "f":
            feeds[tensor.name] = rng.standard_normal(shape).astype(dtype)
        elif "mask" in tensor.name:
            feeds[tensor.name] = np.ones(shape, dtype)
        else:
            feeds[tensor.name] = rng.integers(0, 1000, size=shape).astype(dtype)
    return feeds


class OipBinaryClient:
    """Open Inference Protocol requests with the binary tensor data extension, on one kept-alive
    ``http.client`` connection like :class:`AgentClient`'s, so that the two API paths differ only in
    protocol. ``last_compute_ms`` is the server's ``X-Edgekit-Compute-Ms``."""

    def __init__(self, address: str, model: str) -> None:
        import http.client

        host, port = address.rsplit(":", 1)
        self._connection = http.client.HTTPConnection(host, int(port), timeout=60)
        self._path = f"/v2/models/{model}/infer"
        self.last_compute_ms = 0.0

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from edgekit_runtime.agent.oip import DATATYPES, HEADER_LENGTH, datatype_of

        blobs = [np.ascontiguousarray(array).tobytes() for array in feeds.values()]
        header = json.dumps({"inputs": [{"name": name, "shape": list(array.shape), "datatype": datatype_of(array.dtype),
                                         "parameters": {"binary_data_size": len(blob)}}
                                        for (name, array), blob in zip(feeds.items(), blobs, strict=True)],
                             "parameters": {"binary_data_output": True}}).encode()  # fmt: skip
        self._connection.request("POST", self._path, body=b"".join([header, *blobs]),
                                 headers={"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))})  # fmt: skip
        response = self._connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise AgentApiError(f"OIP infer answered {response.status}: {body[:300]!r}")
        self.last_compute_ms = float(response.getheader("X-Edgekit-Compute-Ms") or 0.0)
        length = int(response.getheader(HEADER_LENGTH) or len(body))
        outputs, offset = {}, length
        for output in json.loads(body[:length])["outputs"]:
            size = output["parameters"]["binary_data_size"]
            outputs[output["name"]] = np.frombuffer(body, DATATYPES[output["datatype"]], size // DATATYPES[output["datatype"]].itemsize,
                                                    offset).reshape(output["shape"])  # fmt: skip
            offset += size
        return outputs


def served_session(service: AgentService, bundle: Bundle) -> tuple[Any, dict[str, Any]]:
    """The ``InferenceSession`` the agent serves, for the bare loop, after checking that it runs with the
    manifest's options; returns it with those settings for the JSON."""
    def session_of(runner: Runner) -> Any:
        if not isinstance(runner, OnnxRuntimeRunner):
            raise SystemExit(f"{bundle.root}: the bare loop needs an onnxruntime bundle, not {runner.backend_name}")
        return runner.session

    session = service.server.call_runner(session_of)
    options = session.get_session_options()
    wanted_level = GRAPH_OPTIMIZATION_LEVELS[bundle.backend.get("graph_optimization") or "all"]
    settings = {
        "providers": list(session.get_providers()),
        "intra_op_threads": options.intra_op_num_threads,
        "graph_optimization_level": options.graph_optimization_level.name,
        "manifest": {key: bundle.backend.get(key) for key in ("execution_providers", "graph_optimization", "intra_op_threads")},
    }
    wanted_threads = bundle.backend.get("intra_op_threads")
    if options.graph_optimization_level.name != wanted_level or (wanted_threads and options.intra_op_num_threads != wanted_threads):
        raise SystemExit(f"the agent's session does not use the manifest's options: {settings}")
    return session, settings


def agent_threads_cpu_s() -> float:
    """CPU seconds used so far by this process's agent threads (named ``edgekit-*``: telemetry, power,
    commands, MQTT network, API accept loop), from /proc/self/task/<tid>/stat."""
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    total_ticks = 0
    for thread in threading.enumerate():
        if not thread.name.startswith("edgekit-") or thread.native_id is None:
            continue
        try:
            fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        total_ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total_ticks / ticks_per_s


# -- throughput and API overhead ------------------------------------------------------------------------

def measure_pair(calls: Mapping[str, Variant], items: int, *, max_rounds: int, round_s: float, pair_s: float) -> dict[str, VariantSamples]:
    """The headline comparison: ``bare`` and ``agent`` alone, in many short rounds, no timed calls. Many
    short adjacent rounds pin the median ratio down to a few tenths of a percent."""
    return interleave(calls, (("bare", "agent"),), items, timed=False, max_rounds=max_rounds, round_s=round_s, budget_s=pair_s)


def measure_case(calls: Mapping[str, Variant], items: int, *, max_rounds: int, round_s: float, case_s: float) -> dict[str, VariantSamples]:
    """All four variants: ``bare`` and ``agent``, then the two API variants, in longer rounds with timed
    calls: API throughput, wall times and overheads come from here. The two binary API paths (``/v1`` and the
    Open Inference Protocol) run back to back, so that their overheads compare the same moment."""
    return interleave(calls, (("bare", "agent"), ("api_binary", "oip_binary"), ("api_json",)), items, timed=True,
                      max_rounds=max_rounds, round_s=round_s, budget_s=case_s)  # fmt: skip


def summarise_case(model: str, dims: Mapping[str, int], pair: Mapping[str, VariantSamples],
                   samples: Mapping[str, VariantSamples]) -> dict[str, Any]:  # fmt: skip
    """``pair`` (:func:`measure_pair`) gives the agent / bare ratio, ``samples`` (:func:`measure_case`) the
    API throughput and every per-request time."""
    ratios = [agent / bare for agent, bare in zip(pair["agent"].round_items_per_s, pair["bare"].round_items_per_s, strict=True)]
    # Even rounds run bare then agent, odd rounds agent then bare (interleave swaps the order every other round).
    agent_second, agent_first = ratios[0::2], ratios[1::2]
    # A round and the next, in the two orders, as one sample: the geometric mean of their ratios cancels
    # whatever running first or second does to a variant, which a median over single rounds leaves in.
    balanced = [float(np.sqrt(even * odd)) for even, odd in zip(agent_second, agent_first)]
    variants = {name: value.summary() for name, value in samples.items()}
    headline = {name: value.summary() for name, value in pair.items()}
    agent_overhead_us = variants["agent"]["overhead_us_median"]
    low, high = median_interval(ratios)
    return {
        "model": model,
        "dims": dict(dims),
        "variants": variants,
        "pair": headline,
        "agent_vs_bare": {
            "ratio_median": statistics.median(ratios),
            "ratio_median_ci95": [low, high],
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "ratio_pooled": headline["agent"]["items_per_s_pooled"] / headline["bare"]["items_per_s_pooled"],
            "rounds": len(ratios),
            "ratio_median_agent_second": statistics.median(agent_second),
            "ratio_median_agent_first": statistics.median(agent_first),
            "ratio_median_order_balanced": statistics.median(balanced),
            "ratio_median_order_balanced_ci95": list(median_interval(balanced)),
            # the same comparison in the longer rounds of the four-variant phase, for reference
            "ratio_median_long_rounds": statistics.median(
                agent / bare for agent, bare in zip(samples["agent"].round_items_per_s, samples["bare"].round_items_per_s, strict=True)
            ),
            "target": THROUGHPUT_TARGET_RATIO,
            "meets_target": statistics.median(ratios) >= THROUGHPUT_TARGET_RATIO,
        },
        "overhead_us": {
            # wall - server compute, per request: validation, locks, timing, windows (and HTTP for the API)
            "agent_in_process": agent_overhead_us,
            "api_binary": variants["api_binary"]["overhead_us_median"],
            "api_json": variants["api_json"]["overhead_us_median"],
            # what the local API adds on top of calling the server in-process
            "api_binary_minus_in_process": variants["api_binary"]["overhead_us_median"] - agent_overhead_us,
            "api_json_minus_in_process": variants["api_json"]["overhead_us_median"] - agent_overhead_us,
            "oip_binary": variants["oip_binary"]["overhead_us_median"],
            # the Open Inference Protocol's binary path against /v1's binary path (target <= 1.25)
            "oip_vs_v1_binary_ratio": variants["oip_binary"]["overhead_us_median"] / variants["api_binary"]["overhead_us_median"],
            "oip_vs_v1_binary_target": OIP_OVERHEAD_TARGET_RATIO,
            # the in-process path against the bare loop, from wall times alone
            "agent_minus_bare_wall": variants["agent"]["wall_us_median"] - variants["bare"]["wall_us_median"],
        },
    }


def bench_model(model: str, bundle_dir: Path, dims_list: tuple[dict[str, int], ...], workdir: Path,
                args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """All throughput cases of one model against one in-process agent; returns the cases and telemetry."""
    config_path = write_agent_config(workdir / f"inproc-{model}", f"bench-{model}", interval_s=args.telemetry_interval_s,
                                     power_sensor=args.power_sensor)  # fmt: skip
    install_bundle(config_path, bundle_dir)
    bundle = open_bundle(bundle_dir, verify=False)
    output_names = list(bundle.io.output_names)
    service = AgentService(load_config(config_path)).start()
    cases: list[dict[str, Any]] = []
    try:
        service.link.wait_connected(10.0)
        session, session_settings = served_session(service, bundle)
        started_cpu_s, started_wall_s = agent_threads_cpu_s(), time.perf_counter()
        client = AgentClient(service.api_address)
        oip = OipBinaryClient(service.api_address, service.models.default.name or model)
        for dims in dims_list:
            feeds = make_feeds(bundle.io, dims)

            def agent_call(feeds: dict[str, np.ndarray] = feeds) -> float:
                return service.server.infer(feeds).timing.compute_ms

            def api_call(encoding: str, feeds: dict[str, np.ndarray] = feeds) -> float:
                client.infer(feeds, encoding=encoding)
                return client.last_timing["compute_ms"]

            def oip_call(feeds: dict[str, np.ndarray] = feeds) -> float:
                oip.infer(feeds)
                return oip.last_compute_ms

            def bare_call(feeds: dict[str, np.ndarray] = feeds) -> None:
                session.run(output_names, feeds)

            calls = {
                "bare": Variant(partial(session.run, output_names, feeds), bare_call),
                "agent": Variant(partial(service.server.infer, feeds), agent_call),
                "api_binary": Variant(partial(client.infer, feeds, encoding="binary"), partial(api_call, "binary")),
                "api_json": Variant(partial(client.infer, feeds, encoding="json"), partial(api_call, "json")),
                "oip_binary": Variant(partial(oip.infer, feeds), oip_call),
            }
            expected = session.run(output_names, feeds)[0]
            np.testing.assert_allclose(service.server.infer(feeds).outputs[output_names[0]], expected, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(oip.infer(feeds)[output_names[0]], expected, rtol=1e-5, atol=1e-5)
            pair = measure_pair(calls, dims["batch"], max_rounds=args.max_pair_rounds, round_s=args.pair_round_s, pair_s=args.pair_s)
            samples = measure_case(calls, dims["batch"], max_rounds=args.max_rounds, round_s=args.round_s, case_s=args.case_s)
            cases.append({**summarise_case(model, dims, pair, samples), "session": session_settings})
            headline = cases[-1]["agent_vs_bare"]
            print(f"  {model} {dims}: agent/bare {headline['ratio_median']:.3f} (agent second {headline['ratio_median_agent_second']:.3f}, "
                  f"first {headline['ratio_median_agent_first']:.3f}, order-balanced {headline['ratio_median_order_balanced']:.3f})", file=sys.stderr)
        threads_cpu_s, wall_s = agent_threads_cpu_s() - started_cpu_s, time.perf_counter() - started_wall_s
        service.link.flush(5.0)
        counters = service.link.counters
        telemetry = {
            "model": model,
            "interval_s": service.telemetry_interval_s,
            "delivery": service.config.telemetry.delivery,
            "power_sensor": args.power_sensor,
            "published": counters.published,
            "acked": counters.acked,
            "backlog": counters.backlog,
            "dropped": counters.dropped,
            "requests_served": service.server.totals().requests,
            # the agent's own threads, which the bare loop in this process shares too
            "agent_threads_cpu_percent": 100.0 * threads_cpu_s / wall_s,
        }
    finally:
        service.stop()
    return cases, telemetry


# -- resident memory -------------------------------------------------------------------------------------


def read_memory(pid: int) -> dict[str, Any]:
    status = Path(f"/proc/{pid}/status").read_text(encoding="ascii", errors="replace")
    values = {line.split(":")[0]: line.split()[1] for line in status.splitlines() if line.startswith(("VmRSS", "VmHWM"))}
    maps = Path(f"/proc/{pid}/maps").read_text(encoding="ascii", errors="replace")
    return {
        "rss_mb": int(values["VmRSS"]) / 1024.0,
        "hwm_mb": int(values["VmHWM"]) / 1024.0,
        "onnxruntime_mapped": "onnxruntime" in maps,
        "numpy_mapped": "numpy" in maps,
    }


def agent_rss(label: str, bundle_dir: Path | None, dims_list: tuple[dict[str, int], ...], workdir: Path,
              args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """Start ``edgekit-agent run`` as its own process, serve a few requests, read its memory."""
    port = free_port()
    config_path = write_agent_config(workdir / f"rss-{label}", f"rss-{label}", interval_s=1.0,
                                     power_sensor=args.power_sensor, port=port)  # fmt: skip
    if bundle_dir is not None:
        install_bundle(config_path, bundle_dir)
    log_path = config_path.parent / "agent.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(agent_command("run", "--config", str(config_path)), stdout=log, stderr=subprocess.STDOUT,
                                   cwd=config_path.parent)  # fmt: skip
    client = AgentClient(f"127.0.0.1:{port}", timeout_s=120.0)
    try:
        deadline_s = time.monotonic() + 120.0
        wanted = "no_model" if bundle_dir is None else "ok"
        while True:
            try:
                if client.health()["status"] == wanted:
                    break
            except AgentApiError:
                pass
            if process.poll() is not None or time.monotonic() > deadline_s:
                raise SystemExit(f"agent for '{label}' did not come up; log:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        if bundle_dir is not None:
            signature = open_bundle(bundle_dir, verify=False).io
            for dims in dims_list:
                for seed in range(3):
                    client.infer(make_feeds(signature, dims, seed=seed))
        time.sleep(args.settle_s)  # a few telemetry windows go out
        memory = read_memory(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return {"label": label, "process": "edgekit-agent run", **memory}


BARE_RSS_CHILD = """
import json, sys
import numpy as np, onnxruntime as ort
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
feeds = {}
for node in sess.get_inputs():
    shape = [d if isinstance(d, int) else int(sys.argv[2]) if i == 0 else int(sys.argv[3]) for i, d in enumerate(node.shape)]
    dtype = np.float32 if node.type == "tensor(float)" else np.int64
    feeds[node.name] = np.ones(shape, dtype)
for _ in range(3):
    sess.run(None, feeds)
rss = hwm = 0
for line in open("/proc/self/status"):
    if line.startswith("VmRSS"):
        rss = int(line.split()[1]) / 1024
    if line.startswith("VmHWM"):
        hwm = int(line.split()[1]) / 1024
print(json.dumps({"rss_mb": rss, "hwm_mb": hwm}))
"""


def bare_rss(label: str, bundle_dir: Path, dims: Mapping[str, int]) -> dict[str, Any]:
    """Python + numpy + one ONNX Runtime session of the bundle, after 3 runs at ``dims``: the floor."""
    bundle = open_bundle(bundle_dir, verify=False)
    completed = subprocess.run(
        [sys.executable, "-c", BARE_RSS_CHILD, str(bundle.model_path), str(dims["batch"]), str(dims.get("seq", 1))],
        check=True, capture_output=True, text=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    return {"label": label, "process": "python + onnxruntime session", **json.loads(completed.stdout)}


# -- spool ------------------------------------------------------------------------------------------------


def load_spool_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_spool", Path(__file__).with_name("bench_spool.py"))
    if spec is None or spec.loader is None:
        raise SystemExit("cannot load scripts/bench_spool.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_spool(workdir: Path, messages: int) -> list[dict[str, Any]]:
    module = load_spool_bench()
    directory = workdir / "spool"
    directory.mkdir(exist_ok=True)
    return [module.run(messages, 900, 16, synchronous, directory) for synchronous in ("FULL", "NORMAL")]


# -- report ------------------------------------------------------------------------------------------------


def _dims(case: Mapping[str, Any]) -> str:
    return ",".join(f"{name}={size}" for name, size in case["dims"].items())


def table(result: Mapping[str, Any]) -> str:
    throughput = [
        [case["model"], _dims(case), f"{p['bare']['items_per_s_median']:.1f}", f"{p['agent']['items_per_s_median']:.1f}",
         f"{r['ratio_median']:.3f}", "{:.3f}..{:.3f}".format(*r["ratio_median_ci95"]), f"{r['ratio_pooled']:.3f}",
         f"{r['ratio_median_long_rounds']:.3f}", "yes" if r["meets_target"] else "NO", str(r["rounds"]),
         f"{v['api_binary']['items_per_s_median']:.1f}", f"{v['api_json']['items_per_s_median']:.1f}"]
        for case in result["throughput"]
        for p, v, r in [(case["pair"], case["variants"], case["agent_vs_bare"])]
    ]  # fmt: skip
    overhead = [
        [case["model"], _dims(case), f"{v['bare']['wall_us_median']:.0f}", f"{o['agent_in_process']:.1f}",
         f"{o['api_binary']:.0f}", f"{o['api_json']:.0f}", f"{o['api_binary_minus_in_process']:.0f}",
         f"{o['api_json_minus_in_process']:.0f}", f"{o['oip_binary']:.0f}", f"{o['oip_vs_v1_binary_ratio']:.2f}"]
        for case in result["throughput"]
        for v, o in [(case["variants"], case["overhead_us"])]
    ]  # fmt: skip
    memory = [
        [f"{entry['process']} / {entry['label']}", f"{entry['rss_mb']:.1f}", f"{entry['hwm_mb']:.1f}",
         str(entry.get("onnxruntime_mapped", True))]
        for entry in result["rss"]
    ]  # fmt: skip
    spool = [
        [entry["synchronous"], f"{entry['append_per_s']:.0f}", f"{entry['ack_per_s']:.0f}", f"{entry['append_and_ack_per_s']:.0f}"]
        for entry in result["spool"]
    ]
    lines = ["Throughput (items/s, median of rounds); agent/bare: median of the short rounds' ratios with its 95 % bootstrap",
             "interval, pooled over those rounds, and the median in the long rounds the API variants run in"]
    lines += aligned_lines(["model", "dims", "bare", "agent", "ratio", "95 %", "pooled", "long", ">=0.98", "rounds", "api bin", "api json"],
                           throughput, text_columns=2)  # fmt: skip
    lines += ["", "Per-request overhead (us; wall time - the compute time the server measured, median)"]
    lines += aligned_lines(["model", "dims", "bare wall", "in-process", "api bin", "api json", "bin - in-proc", "json - in-proc",
                            "oip bin", f"oip/v1 bin (<={OIP_OVERHEAD_TARGET_RATIO:g})"],
                           overhead, text_columns=2)  # fmt: skip
    lines += ["", "Telemetry during the throughput runs"]
    lines += [f"  {t['model']}: every {t['interval_s']:g} s, {t['published']} published, {t['acked']} acked, backlog {t['backlog']}, "
              f"dropped {t['dropped']}, {t['requests_served']} requests served; agent threads used "
              f"{t['agent_threads_cpu_percent']:.1f} % of a core" for t in result["telemetry"]]  # fmt: skip
    lines += ["", f"Resident memory (MB; idle target <= {IDLE_RSS_TARGET_MB:g})"]
    lines += aligned_lines(["process / bundle", "VmRSS", "VmHWM", "onnxruntime mapped"], memory, text_columns=1)
    lines += ["", "Spool (messages/s; 900-byte payloads, acks in batches of 16)"]
    lines += aligned_lines(["synchronous", "append", "ack", "append+ack"], spool, text_columns=1)
    host = result["host"]
    lines += ["", f"Host: {host['at_start']['cpus']} CPUs, flags {' '.join(host['at_start']['cpu_flags']) or 'none of ISA_FLAGS'}, "
                  f"load average {host['at_start']['load_average']} at start, {host.get('load_average_at_end')} at end"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--digits-bundle", type=Path, help="an existing digits-cnn bundle (default: build one)")
    parser.add_argument("--minilm-bundle", type=Path, help="an existing MiniLM bundle (default: build one)")
    parser.add_argument("--max-rounds", type=int, default=40, help="most interleaved rounds per case")
    parser.add_argument("--round-s", type=float, default=0.1, help="about how long one variant's round lasts (>= 1 call)")
    parser.add_argument("--case-s", type=float, default=20.0, help="time budget of one case (at least 8 rounds run)")
    parser.add_argument("--pair-round-s", type=float, default=0.005,
                        help="about how long one round of the agent / bare comparison lasts (>= 1 call)")
    parser.add_argument("--pair-s", type=float, default=15.0, help="time budget of the agent / bare comparison of one case")
    parser.add_argument("--max-pair-rounds", type=int, default=2000, help="most rounds of the agent / bare comparison per case")
    parser.add_argument("--telemetry-interval-s", type=float, default=0.5)
    parser.add_argument("--power-sensor", default="auto", help="the agent's power.sensor")
    parser.add_argument("--settle-s", type=float, default=3.0, help="wait before reading an agent's RSS")
    parser.add_argument("--spool-messages", type=int, default=5000)
    parser.add_argument("--out", type=Path, default=REPO / "docs/benchmarks/agent.json")
    parser.add_argument("--models", default=",".join(case[0] for case in CASES),
                        help="which models to run, comma-separated (default: all; a short run: digits-cnn)")
    args = parser.parse_args()
    selected = tuple(case for case in CASES if case[0] in args.models.split(","))
    if not selected:
        raise SystemExit(f"--models {args.models!r} names none of {', '.join(case[0] for case in CASES)}")
    if not broker_reachable():
        raise SystemExit(f"no MQTT broker on {BROKER[0]}:{BROKER[1]}; start Mosquitto (apt-get install mosquitto)")

    with tempfile.TemporaryDirectory(prefix="edgekit-bench-agent-") as tmp:
        workdir = Path(tmp)
        given = {"digits-cnn": args.digits_bundle, "minilm": args.minilm_bundle}
        # absolute: the agent's install and the RSS probe run in other folders
        bundles = {model: ensure_bundle(recipe, given[model], workdir).resolve() for model, recipe, _ in selected}
        result: dict[str, Any] = {
            "benchmark": "agent",
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "edgekit_runtime": runtime_version,
            "host": {**host_description(), "cpu_count": os.cpu_count(), "onnxruntime": __import__("onnxruntime").__version__,
                     "at_start": host_conditions()},
            "settings": {"max_rounds": args.max_rounds, "round_s": args.round_s, "case_s": args.case_s,
                         "telemetry_interval_s": args.telemetry_interval_s,
                         "power_sensor": args.power_sensor, "broker": f"{BROKER[0]}:{BROKER[1]}"},
            "bundles": {name: {"path": str(path), "name": open_bundle(path, verify=False).name,
                               "precision": open_bundle(path, verify=False).precision} for name, path in bundles.items()},
            "throughput": [],
            "telemetry": [],
        }
        print("RSS without a model", file=sys.stderr)
        rss = [agent_rss("no-model", None, (), workdir, args)]
        for model, _, dims_list in selected:
            print(f"throughput: {model}", file=sys.stderr)
            cases, telemetry = bench_model(model, bundles[model], dims_list, workdir, args)
            result["throughput"] += cases
            result["telemetry"].append(telemetry)
        for model, _, dims_list in selected:
            print(f"RSS with {model}", file=sys.stderr)
            rss.append(agent_rss(model, bundles[model], dims_list, workdir, args))
            rss.append(bare_rss(model, bundles[model], dims_list[-1]))
        result["rss"] = rss
        result["rss_idle_target_mb"] = IDLE_RSS_TARGET_MB
        result["rss_idle_meets_target"] = rss[0]["rss_mb"] <= IDLE_RSS_TARGET_MB
        print("spool", file=sys.stderr)
        result["spool"] = bench_spool(workdir, args.spool_messages)

    result["host"]["load_average_at_end"] = load_average()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(result))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
