#!/usr/bin/env python3
"""N collectors over ``$share`` into one PostgreSQL: windows stored per second at 1, 2 and 4 collectors.

For each N (``--collectors 1,2,4``), on loopback:

1. a scratch PostgreSQL database on the running server (``createdb``; dropped afterwards) and a private
   Mosquitto on a free port (no queue or in-flight bound, as docs/fleet.md's Delivery asks);
2. **drain**: N persistent sessions in one shared group are created and left (the broker queues for
   them, round robin), simulated devices (:class:`~edgekit.fleet.simulate.FleetSimulator`, one MQTT
   connection each) publish a fixed backlog (``--devices`` x ``--windows``, QoS 1, built beforehand)
   while no collector runs; then N collector processes (imported beforehand, so process start-up is
   not timed) resume those sessions and are timed until the store holds every window;
3. **live**: with the N collectors running, the devices publish the same backlog again (the next
   seqs) and the run is timed from the first publish until every window is stored (the devices'
   publishing shares the host with the collectors, the broker and PostgreSQL).

Stored and lost are counted in the store (``device_summaries``), never on the collectors' counters.
CPU seconds of the collector processes, of Mosquitto and of the PostgreSQL backends serving the
collectors (``pg_stat_activity`` of the scratch database) are read from /proc around each phase.
The broker and collector set-up is :mod:`scripts.bench_fleet`'s (``_prime_session``,
``_collector_process``, ``COLLECTOR_OPTIONS``). Writes JSON (``--out``) and prints a table. Device
figures are SYNTHETIC (the simulator's).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgekit.fleet.simulate import FleetSimulator, SimulationConfig  # noqa: E402
from edgekit.fleet.store import open_store  # noqa: E402
from scripts.bench_fleet import COLLECTOR_OPTIONS, _collector_process, _count_windows, _prime_session  # noqa: E402
from tests.runtime.agent.mosquitto import MosquittoBroker  # noqa: E402

FLEET = "bench"  # bench_fleet's collectors collect this fleet, in the shared group of the same name
BROKER_CONFIG = ["max_queued_messages 0", "max_inflight_messages 0", "max_queued_bytes 0"]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def postgres_backend_pids(store: Any) -> list[int]:
    """The server processes serving the collectors: every backend connected to the store's database except
    the one this script counts windows with (the server's own background processes are left out too)."""
    rows = store._connection.execute(  # noqa: SLF001 - a benchmark reads the store's own connection
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()
    return [int(row[0]) for row in rows]


def host_facts() -> dict[str, Any]:
    flags: list[str] = []
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags") and not flags:
            flags = line.split(":", 1)[1].split()
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
    git = lambda *args: subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return {"machine": platform.machine(), "cpu_model": model, "cores": os.cpu_count(), "cpu_flags": flags,
            "python": platform.python_version(), "load_average_at_start": list(os.getloadavg()),
            "commit": git("rev-parse", "HEAD"),
            "store_files_changed_since_commit": git("status", "--short", "edgekit/fleet/store").splitlines(),
            "postgres": subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-Atc", "SHOW server_version"],
                                       capture_output=True, text=True).stdout.strip()}  # fmt: skip


class ScratchDatabase:
    """``createdb`` on the running PostgreSQL, ``dropdb --force`` afterwards."""

    def __init__(self, host: str, user: str) -> None:
        self.host, self.user = host, user
        self.name = f"edgekit_bench_collectors_{os.getpid()}_{secrets.token_hex(3)}"

    def __enter__(self) -> str:
        subprocess.run(["createdb", "-h", self.host, "-U", self.user, self.name], check=True, timeout=60)
        return f"postgresql://{self.user}@{self.host}:5432/{self.name}"

    def __exit__(self, *exc_info: object) -> None:
        subprocess.run(["dropdb", "-h", self.host, "-U", self.user, "--force", self.name], check=False, timeout=60)


def wait_stored(store: Any, expected: int, timeout_s: float, start: float, stall_s: float = 60.0) -> tuple[int, float, float | None]:
    """(windows in the store, seconds from ``start`` until ``expected`` were there or the count stalled for
    ``stall_s``, seconds until the first window was stored or None)."""
    last, last_change, first = -1, start, None
    baseline = _count_windows(store)
    while time.monotonic() - start < timeout_s:
        count = _count_windows(store)
        now = time.monotonic()
        if count != last:
            last, last_change = count, now
            if first is None and count > baseline:
                first = now - start
        if count >= expected or now - last_change > stall_s:
            return count, last_change - start, first
        time.sleep(0.1)
    return last, time.monotonic() - start, first


def _profiled_collector_process(profile_path: str, *args: Any) -> None:
    """bench_fleet's ``_collector_process`` under cProfile, every thread of it (the MQTT network thread and the
    writer do the work) timed in thread CPU seconds; the merged stats go to ``profile_path`` when it stops."""
    import cProfile
    import pstats
    import threading

    profilers: list[cProfile.Profile] = []

    def profile_this_thread(*_: Any) -> None:  # called once in each new thread: hands over to cProfile
        profiler = cProfile.Profile(time.thread_time)  # CPU time of that thread: waits and a busy host left out
        profilers.append(profiler)
        profiler.enable()

    threading.setprofile(profile_this_thread)
    main = cProfile.Profile(time.thread_time)
    try:
        main.runcall(_collector_process, *args)
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        pstats.Stats(main, *profilers).dump_stats(profile_path)


def bench_collectors(collectors: int, store_url: str, workdir: Path, devices: int, windows: int,
                     mqtt_version: str, profile_dir: Path | None = None) -> dict[str, Any]:  # fmt: skip
    context = multiprocessing.get_context("spawn")
    options = {**COLLECTOR_OPTIONS, "mqtt_version": mqtt_version}
    result: dict[str, Any] = {"collectors": collectors, "devices": devices, "windows_per_device": windows}
    with MosquittoBroker(workdir / "mosquitto", extra_config=BROKER_CONFIG) as broker:
        store = open_store(store_url)  # creates the schema before the collectors open it
        ids = [f"bench-collector-{i}" for i in range(collectors)]
        for client_id in ids:  # persistent sessions in the shared group: the broker queues for each
            _prime_session(broker, client_id, FLEET, shared_group=FLEET, mqtt_version=mqtt_version)
        go, stop = context.Event(), context.Event()
        readies = [context.Event() for _ in ids]
        if profile_dir is None:
            processes = [context.Process(target=_collector_process, args=(broker.url, store_url, cid, options, go, ready, stop))
                         for cid, ready in zip(ids, readies)]  # fmt: skip
        else:
            profile_dir.mkdir(parents=True, exist_ok=True)
            processes = [context.Process(target=_profiled_collector_process,
                                         args=(str(profile_dir / f"n{collectors}-{cid}.prof"), broker.url, store_url, cid,
                                               options, go, ready, stop))
                         for cid, ready in zip(ids, readies)]  # fmt: skip
        for process in processes:
            process.start()
        simulator = FleetSimulator(SimulationConfig(broker.url, devices=devices, rate_per_s=0.001, fleet=FLEET, seed=7,
                                                    mqtt_version="3.1.1", load=0.5))  # fmt: skip
        simulator.start(telemetry=False)
        time.sleep(3.0)  # the collector processes finish importing meanwhile
        try:
            for phase in ("drain", "live"):
                before = _count_windows(store)
                if phase == "live":
                    for ready in readies:
                        ready.wait(300)
                pids = [p.pid for p in processes] + [broker._process.pid]  # type: ignore[union-attr]
                backends: dict[int, float] = {}  # the collectors' PostgreSQL backends: CPU seconds last seen

                def sample() -> tuple[list[float], float]:
                    if phase == "live" or go.is_set():
                        for pid in postgres_backend_pids(store):
                            backends[pid] = cpu_seconds(pid)
                    for pid in backends:  # a backend gone since keeps its last reading
                        backends[pid] = max(backends[pid], cpu_seconds(pid))
                    return [cpu_seconds(pid) for pid in pids], sum(backends.values())
                cpu_before = sample()  # live: the publishing is counted too (collectors store meanwhile)
                t_publish = time.monotonic()
                sent = simulator.publish_backlog(windows)
                acked = simulator.flush(600)
                publish_s = time.monotonic() - t_publish
                if phase == "drain":
                    cpu_before = sample()  # drain: from the collectors' go (the broker's receiving not counted)
                if phase == "drain":
                    t0 = time.monotonic()
                    go.set()  # the collectors connect, resume their sessions and get the queued backlog
                else:
                    t0 = t_publish
                stored, seconds, first_s = wait_stored(store, before + sent, 600, t0)
                cpu_after = sample()
                new = stored - before
                deltas = [round(a - b, 2) for a, b in zip(cpu_after[0], cpu_before[0])]
                collector_cpu, broker_cpu = deltas[:-1], deltas[-1]
                result[phase] = {
                    "sent": sent, "all_acked_by_broker": acked, "stored": new, "lost": sent - new,
                    "seconds": round(seconds, 2), "first_stored_after_s": None if first_s is None else round(first_s, 2),
                    "stored_per_s": round(new / seconds, 1) if seconds > 0 else None,
                    # from the first window stored to the last: leaves out the collectors' connecting (drain) and
                    # the devices' building of the backlog before they send anything (live)
                    "stored_per_s_after_first": (round(new / (seconds - first_s), 1)
                                                 if first_s is not None and seconds > first_s else None),
                    "publish_per_s": round(sent / publish_s, 1) if publish_s > 0 else None,
                    "cpu_s": {"collectors": collector_cpu, "collectors_total": round(sum(collector_cpu), 2),
                              "mosquitto": broker_cpu,
                              "postgres_backends": round(cpu_after[1] - cpu_before[1], 2)},
                    "load_average_1m_after": os.getloadavg()[0],
                }  # fmt: skip
                result[phase]["cpu_s"]["counted"] = ("from the collectors' go to the last window stored (the broker's "
                                                     "receiving of the backlog not included)" if phase == "drain" else
                                                     "from the first publish to the last window stored")  # fmt: skip
                print(f"  {collectors} collector(s) {phase}: {result[phase]}", flush=True)
        finally:
            simulator.stop()
            stop.set()
            for process in processes:
                process.join(60)
                if process.is_alive():
                    process.kill()
            store.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collectors", default="1,2,4", help="comma-separated collector counts (default 1,2,4)")
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--windows", type=int, default=40, help="telemetry windows per device per phase")
    parser.add_argument("--mqtt-version", default="3.1.1", choices=("3.1.1", "5"))
    parser.add_argument("--pg-host", default="127.0.0.1")
    parser.add_argument("--pg-user", default="postgres")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "collectors.json")
    parser.add_argument("--profile-dir", type=Path, help="run every collector under cProfile and write its stats here "
                        "(pstats files, one per collector and run; profiling slows them: not for the rates)")
    args = parser.parse_args()
    counts = [int(n) for n in args.collectors.split(",")]
    results: dict[str, Any] = {"host": host_facts(), "synthetic": True, "store": "postgresql", "runs": []}
    import tempfile

    with tempfile.TemporaryDirectory(prefix="edgekit-bench-collectors-") as tmp:
        for n in counts:
            print(f"{n} collector(s), {args.devices} devices x {args.windows} windows per phase", flush=True)
            with ScratchDatabase(args.pg_host, args.pg_user) as store_url:
                results["runs"].append(bench_collectors(n, store_url, Path(tmp) / f"n{n}", args.devices, args.windows,
                                                        args.mqtt_version, args.profile_dir))  # fmt: skip
    results["host"]["load_average_at_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("\n| collectors | drain windows/s (after the first) | live windows/s (after the first) | lost (drain, live) | "
          "collector CPU s (drain) | PostgreSQL CPU s (drain) |\n| --- | --- | --- | --- | --- | --- |")  # fmt: skip
    for run in results["runs"]:
        d, live = run["drain"], run["live"]
        print(f"| {run['collectors']} | {d['stored_per_s']} ({d['stored_per_s_after_first']}) | {live['stored_per_s']} "
              f"({live['stored_per_s_after_first']}) | {d['lost']}, {live['lost']} | "
              f"{d['cpu_s']['collectors_total']} | {d['cpu_s']['postgres_backends']} |")  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
