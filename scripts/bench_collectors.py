#!/usr/bin/env python3
"""N collectors over ``$share`` into one PostgreSQL: windows stored per second at 1, 2 and 4 collectors.

The configurations run interleaved over repeated rounds (``--rounds 3``: 1, 2, 4, 1, 2, 4, 1, 2, 4), each run
on the same offered load, so a busy moment of the shared host falls on every configuration alike. Each run,
on loopback:

1. a scratch PostgreSQL database on the running server (``createdb``; dropped afterwards) and a private
   Mosquitto on a free port (no queue or in-flight bound, as docs/fleet.md's Delivery asks);
2. **drain**: N persistent sessions in one shared group are created and left (the broker queues for
   them, round robin), simulated devices (:class:`~edgekit.fleet.simulate.FleetSimulator`, one MQTT
   connection each) publish a fixed backlog (``--devices`` x ``--windows``, QoS 1, built beforehand)
   while no collector runs; then N collector processes (imported beforehand, so process start-up is
   not timed) resume those sessions and are timed until the store holds every window: the whole
   backlog is offered at once, which saturates any number of collectors;
3. **live**: with the N collectors running, the devices build the same backlog again (the next seqs) and
   publish it as fast as the broker takes it (several thousand a second, more than one collector stores),
   timed until every window is stored (the devices' publishing shares the host with the collectors, the
   broker and PostgreSQL).

Stored and lost are counted in the store (``device_summaries``), never on the collectors' counters.
Where the CPU went in each phase is read from /proc: the collector processes, Mosquitto, the PostgreSQL
backends serving the collectors (``pg_stat_activity`` of the scratch database), every PostgreSQL process
(its background writers too, and other users' sessions), this script's process (the simulated devices)
and the whole host (``/proc/stat``), whose remainder is the other work sharing the machine. The summary
gives, per configuration, the median windows/s (from the first window stored), its ratio to one
collector (the median of each round's ratio, and the ratio of the medians), the windows lost, and the
collectors' windows per collector CPU-second: the per-core rate that projects to a machine with more
cores. The broker and collector set-up is :mod:`scripts.bench_fleet`'s (``_prime_session``,
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
import statistics
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


def host_busy_seconds() -> float:
    """CPU seconds every core of the host has spent busy since boot (``/proc/stat``: all but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def postgres_seconds() -> float:
    """CPU seconds of every process named ``postgres`` still running (server, backends, background workers)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    total += cpu_seconds(int(entry.name))
            except OSError:
                continue
    return total


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


def backends_waiting_on_locks(store: Any) -> int:
    """How many of the store database's backends wait on a lock now (a collector's batch waiting for the rows
    another collector's open transaction holds: ``device_latest``, the fleet buckets)."""
    rows = store._connection.execute(  # noqa: SLF001 - a benchmark reads the store's own connection
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").fetchall()
    return int(rows[0][0])


def wait_stored(store: Any, expected: int, timeout_s: float, start: float,
                stall_s: float = 60.0) -> tuple[int, float, float | None, int, float]:  # fmt: skip
    """(windows in the store, seconds from ``start`` until ``expected`` were there or the count stalled for
    ``stall_s``, seconds until the first window was stored or None, windows stored at that moment, the share of
    the polls meanwhile that found a backend waiting on a lock)."""
    last, last_change, first, first_count = -1, start, None, 0
    polls = waiting = 0
    baseline = _count_windows(store)
    while time.monotonic() - start < timeout_s:
        count = _count_windows(store)
        now = time.monotonic()
        if count != last:
            last, last_change = count, now
            if first is None and count > baseline:
                first, first_count = now - start, count - baseline
        if count >= expected or now - last_change > stall_s:
            return count, last_change - start, first, first_count, waiting / max(polls, 1)
        polls, waiting = polls + 1, waiting + (backends_waiting_on_locks(store) > 0)
        time.sleep(0.1)
    return last, time.monotonic() - start, first, first_count, waiting / max(polls, 1)


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


def cpu_split(before: dict[str, Any], after: dict[str, Any], collectors: int, stored: int) -> dict[str, Any]:
    """CPU seconds per process between two samples, the host's share of each (of wall x cores), and the collectors'
    windows per collector CPU-second."""
    delta = {key: after[key] - before[key] for key in ("postgres_backends", "postgres_all", "simulator", "host_busy")}
    process = [a - b for a, b in zip(after["processes"], before["processes"])]
    collector_cpu, broker_cpu = process[:collectors], process[collectors]
    capacity = (after["at"] - before["at"]) * (os.cpu_count() or 1)
    named = sum(collector_cpu) + broker_cpu + delta["postgres_all"] + delta["simulator"]
    split = {"collectors": sum(collector_cpu), "mosquitto": broker_cpu, "postgres_all": delta["postgres_all"],
             "simulator": delta["simulator"], "other_work_on_the_host": max(0.0, delta["host_busy"] - named),
             "idle": max(0.0, capacity - delta["host_busy"])}  # fmt: skip
    return {"collectors": [round(v, 2) for v in collector_cpu], "collectors_total": round(sum(collector_cpu), 2),
            "mosquitto": round(broker_cpu, 2), "postgres_backends": round(delta["postgres_backends"], 2),
            "postgres_all": round(delta["postgres_all"], 2), "simulator": round(delta["simulator"], 2),
            "host_busy": round(delta["host_busy"], 2), "host_capacity": round(capacity, 2),
            "share_of_host_pct": {k: round(100 * v / capacity, 1) for k, v in split.items()} if capacity else {},
            "windows_per_collector_cpu_s": round(stored / sum(collector_cpu), 1) if sum(collector_cpu) > 0 else None,
            "collector_cpu_us_per_window": round(1e6 * sum(collector_cpu) / stored, 1) if stored else None}  # fmt: skip


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

                def sample() -> dict[str, Any]:
                    if phase == "live" or go.is_set():
                        for pid in postgres_backend_pids(store):
                            backends[pid] = cpu_seconds(pid)
                    for pid in backends:  # a backend gone since keeps its last reading
                        backends[pid] = max(backends[pid], cpu_seconds(pid))
                    return {"at": time.monotonic(), "processes": [cpu_seconds(pid) for pid in pids],
                            "postgres_backends": sum(backends.values()), "postgres_all": postgres_seconds(),
                            "simulator": cpu_seconds(os.getpid()), "host_busy": host_busy_seconds()}  # fmt: skip
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
                stored, seconds, first_s, first_count, lock_waits = wait_stored(store, before + sent, 600, t0)
                cpu_after = sample()
                new = stored - before
                result[phase] = {
                    "sent": sent, "all_acked_by_broker": acked, "stored": new, "lost": sent - new,
                    "seconds": round(seconds, 2), "first_stored_after_s": None if first_s is None else round(first_s, 2),
                    "stored_per_s": round(new / seconds, 1) if seconds > 0 else None,
                    # the windows stored after the first commit seen, over the time from it to the last: leaves out the
                    # collectors' connecting (drain) and the devices' building of the backlog before they send (live)
                    "stored_per_s_after_first": (round((new - first_count) / (seconds - first_s), 1)
                                                 if first_s is not None and seconds > first_s else None),
                    "publish_per_s": round(sent / publish_s, 1) if publish_s > 0 else None,
                    "cpu_s": cpu_split(cpu_before, cpu_after, collectors, new),
                    "polls_with_a_backend_waiting_on_a_lock": round(lock_waits, 2),
                    "load_average_1m_after": os.getloadavg()[0],
                }  # fmt: skip
                result[phase]["cpu_s"]["counted"] = ("from the collectors' go to the last window stored (the broker's "
                                                     "receiving of the backlog not included)" if phase == "drain" else
                                                     "from the first publish to the last window stored")  # fmt: skip
                print(f"  {collectors} collector(s) {phase}: {result[phase]}", flush=True)
        finally:
            simulator.stop()
            stop.set()
            go.set()  # collectors interrupted before their go see the stop at once
            for process in processes:
                process.join(60)
                if process.is_alive():
                    process.kill()
            store.close()
    return result


def summarise(runs: list[dict[str, Any]], counts: list[int]) -> dict[str, Any]:
    """Per configuration and phase: median windows/s (from the first stored; whole run), the ratio to one
    collector (median of the rounds' ratios, and of the medians), lost, and the median CPU split."""
    summary: dict[str, Any] = {}
    for phase in ("drain", "live"):
        by_n = {n: [r for r in runs if r["collectors"] == n and phase in r] for n in counts}
        base = {r["round"]: r[phase]["stored_per_s_after_first"] for r in by_n.get(1, [])}
        rows = {}
        for n, found in by_n.items():
            if not found:
                continue
            rates = [r[phase]["stored_per_s_after_first"] or 0.0 for r in found]
            ratios = [r[phase]["stored_per_s_after_first"] / base[r["round"]] for r in found
                      if base.get(r["round"]) and r[phase]["stored_per_s_after_first"]]  # fmt: skip
            shares = [r[phase]["cpu_s"]["share_of_host_pct"] for r in found]
            rows[str(n)] = {
                "rounds": len(found), "stored_per_s_after_first": rates,
                "median_stored_per_s_after_first": round(statistics.median(rates), 1),
                "median_stored_per_s": round(statistics.median(r[phase]["stored_per_s"] or 0.0 for r in found), 1),
                "ratio_to_one_per_round": [round(x, 2) for x in ratios],
                "median_ratio_to_one": round(statistics.median(ratios), 2) if ratios else None,
                "lost": sum(r[phase]["lost"] for r in found),
                "median_windows_per_collector_cpu_s": round(statistics.median(
                    r[phase]["cpu_s"]["windows_per_collector_cpu_s"] or 0.0 for r in found), 1),
                "median_collector_cpu_us_per_window": round(statistics.median(
                    r[phase]["cpu_s"]["collector_cpu_us_per_window"] or 0.0 for r in found), 1),
                "median_share_of_host_pct": {key: round(statistics.median(s[key] for s in shares), 1) for key in shares[0]},
                "load_average_1m_after": [r[phase]["load_average_1m_after"] for r in found],
                "polls_with_a_backend_waiting_on_a_lock": [r[phase]["polls_with_a_backend_waiting_on_a_lock"] for r in found],
            }  # fmt: skip
        if "1" in rows:
            for row in rows.values():
                row["ratio_of_medians_to_one"] = round(row["median_stored_per_s_after_first"]
                                                       / rows["1"]["median_stored_per_s_after_first"], 2)  # fmt: skip
        summary[phase] = rows
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collectors", default="1,2,4", help="comma-separated collector counts (default 1,2,4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every configuration, interleaved (default 3)")
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--windows", type=int, default=60, help="telemetry windows per device per phase")
    parser.add_argument("--mqtt-version", default="3.1.1", choices=("3.1.1", "5"))
    parser.add_argument("--pg-host", default="127.0.0.1")
    parser.add_argument("--pg-user", default="postgres")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "collectors.json")
    parser.add_argument("--profile-dir", type=Path, help="run every collector under cProfile and write its stats here "
                        "(pstats files, one per collector and run; profiling slows them: not for the rates)")
    args = parser.parse_args()
    counts = [int(n) for n in args.collectors.split(",")]
    results: dict[str, Any] = {"host": host_facts(), "synthetic": True, "store": "postgresql",
                               "order": f"{args.rounds} rounds of {counts}, interleaved", "runs": []}  # fmt: skip
    import tempfile

    with tempfile.TemporaryDirectory(prefix="edgekit-bench-collectors-") as tmp:
        for round_ in range(1, args.rounds + 1):
            for n in counts:
                print(f"round {round_}: {n} collector(s), {args.devices} devices x {args.windows} windows per phase",
                      flush=True)  # fmt: skip
                with ScratchDatabase(args.pg_host, args.pg_user) as store_url:
                    run = bench_collectors(n, store_url, Path(tmp) / f"r{round_}n{n}", args.devices, args.windows,
                                           args.mqtt_version, args.profile_dir)  # fmt: skip
                results["runs"].append({"round": round_, **run})
    results["host"]["load_average_at_end"] = list(os.getloadavg())
    results["summary"] = summarise(results["runs"], counts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for phase, rows in results["summary"].items():
        print(f"\n{phase}: | collectors | median windows/s from the first stored (rounds) | ratio to one: median of "
              "rounds (of medians) | lost | windows per collector CPU-s | share of the 2-core host: collectors / "
              "PostgreSQL / Mosquitto / devices / other work / idle |")  # fmt: skip
        for n, row in rows.items():
            share = row["median_share_of_host_pct"]
            print(f"| {n} | {row['median_stored_per_s_after_first']} ({', '.join(str(x) for x in row['stored_per_s_after_first'])})"
                  f" | {row['median_ratio_to_one']} ({row.get('ratio_of_medians_to_one')}) | {row['lost']} | "
                  f"{row['median_windows_per_collector_cpu_s']} | {share['collectors']} / {share['postgres_all']} / "
                  f"{share['mosquitto']} / {share['simulator']} / {share['other_work_on_the_host']} / {share['idle']} % |")  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
