#!/usr/bin/env python
"""The agent as a server under concurrent batch-1 clients, beside a bare in-process ONNX Runtime loop.

    .venv/bin/python scripts/bench_serving.py --model digits-cnn|minilm [--bundle DIR] [--seconds 4] [--rounds 2]
        [--concurrency 1,4,16] [--protocols http,grpc] [--max-delay-ms 0.5[,1,...]] [--max-batch N]
        [--perf-analyzer PATH | --load-generator tritonclient] [--compare-runtime OTHER_TREE/runtime]
        [--spinning spin10[,off,on,bundle,spin<N>]] [--intra-op-threads N] [--analyzer-modes sync[,async]] [--out docs/benchmarks/serving.json --key NAME]

Agents run as processes (``edgekit-agent run``) with the bundle installed, HTTP and gRPC on loopback:
``plain`` (no ``batching`` section: one runner call per request) and one ``batched_<delay>`` per
``--max-delay-ms`` value (``batching: {max_delay_ms}``, max batch from the bundle unless ``--max-batch``), and
with ``--compare-runtime`` a ``before_<delay>`` agent run from another tree's ``edgekit_runtime`` (``PYTHONPATH``;
e.g. ``git archive COMMIT runtime | tar -x -C DIR``; its config has no ``runner`` section, so it keeps the bundle's
ONNX Runtime options), so that a change and what it replaced share one run. This tree's agents get ``runner:
{intra_op_spinning, intra_op_spin_us}`` from the first ``--spinning`` value (``spin<N>``: spin N microseconds, the
agent's default being ``spin10``; ``off``; ``on``: ONNX Runtime's own spin length; ``bundle``: the bundle's setting)
and ``intra_op_threads`` from ``--intra-op-threads``; each further ``--spinning`` value adds a
``batched_<delay>_spinning_<value>`` agent.
For each protocol and concurrency, in every round, the cases run back to back for ``--seconds`` each:
``bare`` (``session.run`` at batch 1 in a loop in this process, on a session made from the bundle with its
manifest's options, as the agent makes it), then each agent, then ``bare`` again; each agent case's ratio is
to the mean of the two bare runs around it, so they see the same stretch of a shared host. The request is the first item of the bundle's
first golden input (real token ids for MiniLM). The load comes from perf_analyzer (the tritonclient 2.41.0
wheel's ``bin/perf_analyzer``; ``libb64.so.0d`` and ``libcudart.so.12`` in a ``lib`` folder beside it or on
``LD_LIBRARY_PATH``), with the same request as its input data: ``--perf-analyzer PATH``, else
``$EDGEKIT_PERF_ANALYZER_DIR/bin/perf_analyzer`` or ``/var/cache/edgekit/perf_analyzer/bin/perf_analyzer``
(where ``scripts/install_perf_analyzer.sh`` puts it), else ``perf_analyzer`` on ``PATH``; without one (or with
``--load-generator tritonclient``) one tritonclient per thread (binary tensors over HTTP). Each agent's p50 less one bare call (the inverse of the
bare rate) is its request overhead (``<agent>_overhead_p50_us``); its p50 less the mean time of its own runner
calls (``compute_infer`` of its statistics, ``<agent>_compute_us_mean``: the model on the agent's session options,
which may differ from the bare session's, e.g. intra-op spinning off) is ``<agent>_overhead_beyond_compute_p50_us``. Each agent case also records the agent
process's CPU a request (``<agent>_cpu_us_per_request``: its user and system time over the requests its
statistics counted, every thread) and perf_analyzer's (``<agent>_client_cpu_us_per_request``), each with its kernel
(system time) part (``<agent>_cpu_system_us_per_request``, ``<agent>_client_cpu_system_us_per_request``): the
sockets and wake-ups any server pays, which a faster (e.g. native) front end would not remove. Beside it, the
host's bound for that agent: the model's own CPU an item at the batch size the agent ran (``<agent>_compute_cpu_us_per_item``,
timed in this process on a session made with the agent's runner options), and ``<agent>_bound_per_s`` = cores / (client
CPU + model CPU) a request, the most any server could answer with the load generator on the same cores, were its own
work free; ``<agent>_bound_ratio`` is that to the bare loop (below 1.0 the 1.0x goal cannot be met on this host). The report says
which binary ran and where it came from (the install's ``SOURCE`` file), the process's niceness and whether
``/tmp/quiet.lock`` was held (``flock /tmp/quiet.lock nice -n -20 ...``: the house's quiet measurement). Prints a table; writes JSON (CPU flags, load
averages before and after every row) under ``runs.<key>`` of ``--out``, keeping the other runs.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import resource
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
import shutil

from edgekit_runtime.agent.config_types import DEFAULT_SERVING_SPIN_US
from edgekit_runtime.backends import create_runner
from edgekit_runtime.backends.onnxruntime import MAX_SPIN_US
from edgekit_runtime.bundle import open_bundle

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_setup import ensure_bundle, host_conditions  # noqa: E402

RECIPES = {"digits-cnn": "recipes/digits-cnn.yaml", "minilm": "recipes/minilm.yaml"}
#: where scripts/install_perf_analyzer.sh installs perf_analyzer (bin/, lib/, SOURCE)
PERF_ANALYZER_CACHE = Path("/var/cache/edgekit/perf_analyzer")
QUIET_LOCK = Path("/tmp/quiet.lock")
#: --spinning values -> the agent config's runner options (bundle: the bundle's setting, ORT's default); spin<N> (e.g.
#: spin10) spins for N microseconds (runner.intra_op_spin_us)
SPINNING: dict[str, dict[str, Any]] = {"off": {"intra_op_spinning": False},
                                       "on": {"intra_op_spinning": True, "intra_op_spin_us": None},
                                       "bundle": {"intra_op_spinning": None, "intra_op_spin_us": None}}  # fmt: skip


def spinning_options(value: str) -> dict[str, Any] | None:
    """The runner options of one ``--spinning`` value; None if it is not one."""
    found = re.fullmatch(r"spin(\d+)", value)
    if found is not None and 1 <= int(found.group(1)) <= MAX_SPIN_US:
        return {"intra_op_spinning": True, "intra_op_spin_us": int(found.group(1))}
    return SPINNING.get(value)


def find_perf_analyzer(given: str | None) -> tuple[str | None, str]:
    """The perf_analyzer to run and where it came from: ``given``, the install script's cache folder
    (``$EDGEKIT_PERF_ANALYZER_DIR`` or :data:`PERF_ANALYZER_CACHE`), or ``PATH``; ``(None, why)`` without one."""
    if given:
        return given, f"--perf-analyzer {given}"
    folder = Path(os.environ.get("EDGEKIT_PERF_ANALYZER_DIR") or PERF_ANALYZER_CACHE)
    binary = folder / "bin" / "perf_analyzer"
    if os.access(binary, os.X_OK):
        source = folder / "SOURCE"
        origin = source.read_text(encoding="utf-8").strip().replace("\n", "; ") if source.is_file() else "no SOURCE file"
        return str(binary), f"{binary} ({origin})"
    on_path = shutil.which("perf_analyzer")
    if on_path:
        return on_path, f"{on_path} (PATH)"
    return None, f"no perf_analyzer in {binary} nor on PATH (run scripts/install_perf_analyzer.sh)"


def quiet_lock_held() -> bool:
    """Whether someone (the ``flock`` this run was started under, normally) holds :data:`QUIET_LOCK`."""
    try:
        with open(QUIET_LOCK, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def children_cpu_split_s() -> tuple[float, float]:
    """User and system (kernel) CPU seconds this process's finished children (the perf_analyzer runs) have used."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Agent:
    """An ``edgekit-agent run`` process serving ``bundle`` on free loopback ports."""

    def __init__(self, root: Path, bundle: Path, batching: dict[str, float] | None, runtime: Path | None = None,
                 runner: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.batching, self.runner = batching, runner
        env = dict(os.environ)
        if runtime is not None:  # another tree's edgekit_runtime (--compare-runtime): before/after in one run
            env["PYTHONPATH"] = f"{runtime}:{env.get('PYTHONPATH', '')}"
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
        if runner is not None:  # left out for --compare-runtime (an older agent may not know the section)
            config["runner"] = runner
        path = root / "agent.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        command = [sys.executable, "-m", "edgekit_runtime.agent.cli"]
        subprocess.run([*command, "install", "--config", str(path), str(bundle)], check=True, stdout=subprocess.DEVNULL, env=env)
        self.process = subprocess.Popen([*command, "run", "--config", str(path)], stdout=subprocess.DEVNULL,
                                        stderr=open(root / "agent.log", "wb"), env=env)  # fmt: skip
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

    def cpu_split_s(self) -> tuple[float, float]:
        """User and system (kernel: sockets, epoll, futexes) CPU seconds of the agent process, every thread."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rpartition(")")[2].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return int(fields[11]) / ticks, int(fields[12]) / ticks

    def inferences(self, model: str) -> int:
        """Requests the agent has answered for ``model`` (its OIP statistics)."""
        return self.statistics(model)[0]

    def statistics(self, model: str) -> tuple[int, int, int]:
        """(requests answered, requests timed, their runner calls' time in ns) for ``model``, from its OIP statistics
        (``compute_infer``: each request counts the whole runner call that served it)."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/models/{model}/stats", timeout=10) as reply:
            stats = json.loads(reply.read())["model_stats"][0]
        compute = stats["inference_stats"]["compute_infer"]
        return int(stats["inference_count"]), int(compute["count"]), int(compute["ns"])

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def request_feeds(bundle: Any, item: int, dims: dict[str, int]) -> dict[str, np.ndarray]:
    """Item ``item`` of the bundle's first golden input batch (batch-first inputs), cut to ``dims`` along the
    axes whose signature names them (MiniLM's golden sentences are padded to 128 tokens; a client sends one
    sentence unpadded)."""
    with np.load(bundle.root / "golden" / "inputs_000.npz") as arrays:
        feeds = {tensor.name: arrays[tensor.name][item : item + 1] for tensor in bundle.io.inputs}
    for tensor in bundle.io.inputs:
        for axis, name in enumerate(tensor.shape):
            if name in dims:
                feeds[tensor.name] = feeds[tensor.name].take(range(dims[name]), axis=axis)
    return {name: np.ascontiguousarray(array) for name, array in feeds.items()}


def bare_loop(session: Any, feeds: dict[str, np.ndarray], seconds: float) -> dict[str, float]:
    names = [output.name for output in session.get_outputs()]
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        session.run(names, feeds)
        count += 1
    return {"throughput_per_s": count / elapsed}


def batched_compute_cpu_us(bundle: Any, feeds: dict[str, np.ndarray], items: int, runner_options: dict[str, Any],
                           seconds: float = 0.5) -> float:  # fmt: skip
    """The model's own CPU an item (this process's user and system time, every ONNX Runtime thread) in calls of
    ``items`` copies of ``feeds`` (batch-first inputs), on a session made as the agent makes it (the bundle's
    options with ``runner_options``): what one request costs the agent's runner alone at that batch size."""
    runner = create_runner(bundle, **{key: value for key, value in runner_options.items() if value is not None})
    runner.load()
    session = getattr(runner, "session")  # noqa: B009
    batch = {name: np.ascontiguousarray(np.repeat(array, items, axis=0)) for name, array in feeds.items()}
    names = [output.name for output in session.get_outputs()]
    for _ in range(5):
        session.run(names, batch)
    calls, cpu_before, started = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - started < seconds:
        session.run(names, batch)
        calls += 1
    cpu_us = (time.process_time() - cpu_before) * 1e6 / (calls * items)
    runner.close()
    return cpu_us


def perf_analyzer_input(feeds: dict[str, np.ndarray], folder: Path) -> tuple[Path, list[str]]:
    """perf_analyzer's ``--input-data`` JSON holding ``feeds`` (without the batch dim) and its ``--shape`` flags."""
    entry = {name: {"content": array[0].ravel().tolist(), "shape": list(array.shape[1:])} for name, array in feeds.items()}
    path = folder / "perf_analyzer_input.json"
    path.write_text(json.dumps({"data": [entry]}), encoding="utf-8")
    shapes = [flag for name, array in feeds.items() for flag in ("--shape", f"{name}:{','.join(map(str, array.shape[1:]))}")]
    return path, shapes


def perf_analyzer(binary: str, model: str, url: str, protocol: str, concurrency: int, seconds: float,
                  data: tuple[Path, list[str]], mode: str = "sync") -> dict[str, float]:  # fmt: skip
    """One perf_analyzer window set; ``mode`` ``sync`` (a thread a concurrent request, its default) or ``async`` (``-a``:
    a few threads keep ``concurrency`` requests in flight)."""
    command = [binary, "-m", model, "-u", url, "-i", protocol, "--concurrency-range", str(concurrency), f"--{mode}",
               "--measurement-interval", str(int(seconds * 1000)), "-s", "1000", "-r", "3",  # a shared host moves latency by over 100 % between windows
               "--input-data", str(data[0]), *data[1]]  # fmt: skip
    env = dict(os.environ)
    here = Path(binary).resolve().parent
    for lib in (here / "lib", here.parent / "lib"):  # beside it, or the install script's bin/ and lib/
        if lib.is_dir():
            env["LD_LIBRARY_PATH"] = f"{lib}:{env.get('LD_LIBRARY_PATH', '')}"
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds * 10 + 60, env=env)
    found = re.search(r"Throughput: ([\d.]+) infer/sec", done.stdout)
    if found is None:
        raise SystemExit(f"perf_analyzer failed ({done.returncode}): {done.stdout[-800:]} {done.stderr[-800:]}")
    p50 = re.search(r"p50 latency: (\d+) usec", done.stdout)
    calls = re.search(r"Inference count: (\d+)\s+Execution count: (\d+)", done.stdout)
    result = {"throughput_per_s": float(found.group(1)), "p50_us": float(p50.group(1)) if p50 else float("nan")}
    if calls is not None and int(calls.group(2)):
        result["items_per_call"] = int(calls.group(1)) / int(calls.group(2))
    return result


def tritonclient_load(model: str, url: str, protocol: str, concurrency: int, seconds: float,
                      feeds: dict[str, np.ndarray]) -> dict[str, float]:  # fmt: skip
    """``concurrency`` threads, one tritonclient each, batch-1 requests for ``seconds``."""
    from tritonclient.utils import np_to_triton_dtype

    if protocol == "http":
        import tritonclient.http as client_module
    else:
        import tritonclient.grpc as client_module
    counts, latencies = [0] * concurrency, [[] for _ in range(concurrency)]  # type: list[int], list[list[float]]
    stop = threading.Event()

    def worker(index: int) -> None:
        client = client_module.InferenceServerClient(url=url)
        items = []
        for name, array in feeds.items():
            item = client_module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            item.set_data_from_numpy(array, **({"binary_data": True} if protocol == "http" else {}))
            items.append(item)
        while not stop.is_set():
            started = time.perf_counter()
            client.infer(model, items)
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


def write_report(path: Path, key: str, report: dict[str, Any]) -> None:
    """``report`` as ``runs[key]`` of the JSON at ``path``, the other runs kept."""
    existing: dict[str, Any] = {}
    if path.is_file():
        existing = json.loads(path.read_text(encoding="utf-8"))
    runs = existing.get("runs", {}) if isinstance(existing, dict) else {}
    runs[key] = report
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": runs}, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(RECIPES), default="digits-cnn", help="the demo recipe to serve")
    parser.add_argument("--bundle", type=Path, help="a built bundle of --model (default: built into --workdir)")
    parser.add_argument("--workdir", type=Path, default=Path("out/bench_serving"))
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--max-batch", type=int, help="batching.max_batch (default: the bundle's bound)")
    parser.add_argument("--max-delay-ms", default="0.5", help="batching.max_delay_ms; a comma list sweeps it")
    parser.add_argument("--item", type=int, default=0, help="which item of the first golden batch is the request")
    parser.add_argument("--dims", default="", help="cut the request to these dim sizes, e.g. seq=48")
    parser.add_argument("--perf-analyzer", help="path of perf_analyzer (default: the install script's, else PATH)")
    parser.add_argument("--load-generator", choices=("perf_analyzer", "tritonclient"), default="perf_analyzer",
                        help="tritonclient: one tritonclient per thread even where perf_analyzer is installed")  # fmt: skip
    parser.add_argument("--compare-runtime", type=Path, help="also run a batched agent (first --max-delay-ms) from this "
                        "edgekit_runtime source folder, e.g. an earlier commit's runtime/ from git archive; named before_<delay>")
    parser.add_argument("--spinning", default=f"spin{DEFAULT_SERVING_SPIN_US}", help="runner.intra_op_spinning of this tree's agents "
                        "(off, on, bundle, spin<microseconds>: the default is the agent's); "
                        "a comma list adds a batched agent (first --max-delay-ms) for each further value")
    parser.add_argument("--intra-op-threads", type=int, help="runner.intra_op_threads of this tree's agents (default: the bundle's)")
    parser.add_argument("--analyzer-modes", default="sync", help="perf_analyzer's modes, a comma list of sync and async; "
                        "each mode after the first adds every agent again as <agent>_<mode>")
    parser.add_argument("--out", type=Path, default=Path("out/bench_serving.json"))
    parser.add_argument("--key", help="the name of this run in --out (default: --model)")
    args = parser.parse_args()
    modes = args.analyzer_modes.split(",")
    if not modes or any(mode not in ("sync", "async") for mode in modes):
        parser.error(f"--analyzer-modes {args.analyzer_modes}: a comma list of sync and async")
    unknown = [value for value in args.spinning.split(",") if spinning_options(value) is None]
    if unknown:
        parser.error(f"--spinning {','.join(unknown)}: use {', '.join(SPINNING)} or spin<microseconds>, e.g. spin10")
    analyzer, analyzer_origin = find_perf_analyzer(args.perf_analyzer)
    if args.load_generator == "tritonclient":
        analyzer, analyzer_origin = None, "--load-generator tritonclient"
    print(f"load generator: {'perf_analyzer ' + analyzer_origin if analyzer else 'tritonclient threads (' + analyzer_origin + ')'}"
          f"; niceness {os.nice(0)}, {QUIET_LOCK} {'held' if quiet_lock_held() else 'not held'}", flush=True)  # fmt: skip
    bundle_dir = ensure_bundle(RECIPES[args.model], args.bundle, args.workdir)
    bundle = open_bundle(bundle_dir, verify=True)
    runner = create_runner(bundle)
    runner.load()
    session = getattr(runner, "session")  # the onnxruntime runner's InferenceSession  # noqa: B009
    dims = {name: int(size) for name, _, size in (pair.partition("=") for pair in args.dims.split(",") if pair)}
    feeds = request_feeds(bundle, args.item, dims)
    delays = [float(value) for value in args.max_delay_ms.split(",")]
    rows: list[dict[str, Any]] = []
    conditions = host_conditions()
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as scratch:
        data = perf_analyzer_input(feeds, Path(scratch))
        spinnings = args.spinning.split(",")
        threads = {} if args.intra_op_threads is None else {"intra_op_threads": args.intra_op_threads}
        runner = {**spinning_options(spinnings[0]), **threads}  # type: ignore[dict-item]
        agents = {"plain": Agent(Path(scratch) / "plain", bundle_dir, None, runner=runner)}
        for delay in delays:
            batching: dict[str, float] = {"max_delay_ms": delay}
            if args.max_batch is not None:
                batching["max_batch"] = args.max_batch
            agents[f"batched_{delay:g}"] = Agent(Path(scratch) / f"batched_{delay:g}", bundle_dir, batching, runner=runner)
        for spinning in spinnings[1:]:
            batching = {"max_delay_ms": delays[0], **({"max_batch": args.max_batch} if args.max_batch is not None else {})}
            agents[f"batched_{delays[0]:g}_spinning_{spinning}"] = Agent(Path(scratch) / f"spinning_{spinning}", bundle_dir, batching,
                                                                        runner={**spinning_options(spinning), **threads})  # type: ignore[dict-item]  # fmt: skip
        if args.compare_runtime is not None:
            batching = {"max_delay_ms": delays[0], **({"max_batch": args.max_batch} if args.max_batch is not None else {})}
            agents[f"before_{delays[0]:g}"] = Agent(Path(scratch) / "before", bundle_dir, batching, args.compare_runtime.resolve())
        model = bundle.name
        try:
            for round_index in range(args.rounds):
                for protocol in args.protocols.split(","):
                    for concurrency in [int(value) for value in args.concurrency.split(",")]:
                        bare = bare_loop(session, feeds, args.seconds)
                        row: dict[str, Any] = {"round": round_index, "protocol": protocol, "concurrency": concurrency,
                                               "bare_per_s": bare["throughput_per_s"], "load_before": os.getloadavg()[0]}  # fmt: skip
                        line = [f"r{round_index} {protocol:4} c={concurrency:<2} bare {row['bare_per_s']:7.0f}/s"]
                        cases = [(name if mode == modes[0] else f"{name}_{mode}", agent, mode) for mode in modes
                                 for name, agent in agents.items()]  # fmt: skip
                        for kind, agent, mode in cases:
                            cpu_before, client_before = agent.cpu_split_s(), children_cpu_split_s()
                            count_before, timed_before, compute_ns_before = agent.statistics(model)
                            if analyzer:
                                result = perf_analyzer(analyzer, model, agent.url(protocol), protocol, concurrency, args.seconds, data, mode)
                            else:
                                result = tritonclient_load(model, agent.url(protocol), protocol, concurrency, args.seconds, feeds)
                            count_after, timed_after, compute_ns_after = agent.statistics(model)
                            answered = count_after - count_before
                            if timed_after > timed_before:  # the agent's own runner-call time a request, mean
                                row[f"{kind}_compute_us_mean"] = (compute_ns_after - compute_ns_before) / 1e3 / (timed_after - timed_before)
                            if answered:  # the agent's CPU (every thread: the loop, handlers, ONNX Runtime's pool) a request
                                user, system = (after - before for after, before in zip(agent.cpu_split_s(), cpu_before))
                                row[f"{kind}_cpu_us_per_request"] = (user + system) * 1e6 / answered
                                row[f"{kind}_cpu_system_us_per_request"] = system * 1e6 / answered  # the kernel's part
                                if analyzer:  # perf_analyzer's own CPU (a child of this process) over the same requests
                                    user, system = (after - before for after, before in zip(children_cpu_split_s(), client_before))
                                    row[f"{kind}_client_cpu_us_per_request"] = (user + system) * 1e6 / answered
                                    row[f"{kind}_client_cpu_system_us_per_request"] = system * 1e6 / answered
                            row[f"{kind}_per_s"] = result["throughput_per_s"]
                            row[f"{kind}_p50_us"] = result["p50_us"]
                            row[f"{kind}_ratio"] = result["throughput_per_s"] / bare["throughput_per_s"]
                            if "items_per_call" in result:
                                row[f"{kind}_items_per_call"] = result["items_per_call"]
                            client_us = row.get(f"{kind}_client_cpu_us_per_request")
                            if client_us is not None and agent.runner is not None:  # the host's bound at this batch size
                                items = max(1, round(result.get("items_per_call", 1.0)))
                                compute_us = batched_compute_cpu_us(bundle, feeds, items, agent.runner)
                                row[f"{kind}_compute_cpu_us_per_item"] = compute_us
                                row[f"{kind}_bound_per_s"] = (os.cpu_count() or 1) * 1e6 / (client_us + compute_us)
                            line.append(f"{kind} {result['throughput_per_s']:7.0f}/s ({row[f'{kind}_ratio']:.2f}x, "
                                        f"p50 {result['p50_us']:.0f} us, {result.get('items_per_call', float('nan')):.1f}/call, "
                                        f"compute {row.get(f'{kind}_compute_us_mean', float('nan')):.0f} us, "
                                        f"cpu {row.get(f'{kind}_cpu_us_per_request', float('nan')):.0f} us/req "
                                        f"(kernel {row.get(f'{kind}_cpu_system_us_per_request', float('nan')):.0f}), "
                                        f"client {row.get(f'{kind}_client_cpu_us_per_request', float('nan')):.0f} "
                                        f"(kernel {row.get(f'{kind}_client_cpu_system_us_per_request', float('nan')):.0f}))")  # fmt: skip
                        bare_after = bare_loop(session, feeds, args.seconds)["throughput_per_s"]
                        row["bare_after_per_s"] = bare_after  # the ratios are to the mean of the bare runs around them
                        for kind, _, _ in cases:
                            row[f"{kind}_ratio"] = row[f"{kind}_per_s"] / ((row["bare_per_s"] + bare_after) / 2)
                            if f"{kind}_bound_per_s" in row:
                                row[f"{kind}_bound_ratio"] = row[f"{kind}_bound_per_s"] / ((row["bare_per_s"] + bare_after) / 2)
                            # the p50 round trip less the model's own time (one bare batch-1 call): the request's overhead
                            row[f"{kind}_overhead_p50_us"] = row[f"{kind}_p50_us"] - 2e6 / (row["bare_per_s"] + bare_after)
                            if f"{kind}_compute_us_mean" in row:  # less the agent's own runner call instead (its session options)
                                row[f"{kind}_overhead_beyond_compute_p50_us"] = row[f"{kind}_p50_us"] - row[f"{kind}_compute_us_mean"]
                        bounds = [f"{kind} {row[f'{kind}_bound_ratio']:.2f}x" for kind, _, _ in cases if f"{kind}_bound_ratio" in row]
                        if bounds:
                            line.append("bound " + ", ".join(bounds))
                        line.append(f"bare after {bare_after:7.0f}/s")
                        row["load_after"] = os.getloadavg()[0]
                        rows.append(row)
                        print("  ".join(line) + f"  load {row['load_before']:.1f}-{row['load_after']:.1f}", flush=True)
        finally:
            for agent in agents.values():
                agent.stop()
    report = {"bundle": bundle.name, "model": args.model, "host": conditions, "cpu_flags": conditions["cpu_flags"],
              "cores": os.cpu_count(), "intra_op_threads": bundle.backend.get("intra_op_threads"),
              "request": {name: list(array.shape) for name, array in feeds.items()},
              "load_generator": "perf_analyzer" if analyzer else "tritonclient threads", "analyzer_modes": modes, "load_generator_source": analyzer_origin,
              "niceness": os.nice(0), "quiet_lock_held": quiet_lock_held(),
              "compare_runtime": None if args.compare_runtime is None else str(args.compare_runtime),
              "seconds": args.seconds, "batching": {name: agent.batching for name, agent in agents.items()},
              "runner": {name: agent.runner for name, agent in agents.items()},
              "rows": rows}  # fmt: skip
    write_report(args.out, args.key or args.model, report)
    print(f"cpu flags {' '.join(report['cpu_flags'])}; load now {os.getloadavg()[0]:.1f}; wrote runs.{args.key or args.model} of {args.out}")


if __name__ == "__main__":
    main()
