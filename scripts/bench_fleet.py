#!/usr/bin/env python3
"""Fleet benchmark: ingest rate and loss through a real Mosquitto, and the dashboard's page-load time.

One run, on loopback:

1. **Ingest** (SQLite, then PostgreSQL when ``initdb``/``pg_ctl`` are found): a Mosquitto on a free
   port; the collector subscribes with a persistent session; 200 simulated devices (one MQTT
   connection each) publish ``--windows`` telemetry windows each, QoS 1, built beforehand by the
   runtime's own message builders. The collector's rate is timed twice: *live* (devices and collector
   at once, sharing the 2 cores) and *drain* (the collector stopped while the devices publish, the
   broker queueing for its session, then started and timed until every message is stored: the
   collector alone), on the collector's count of committed windows. Lost = acknowledged by the broker
   but not in the store (counted in the store afterwards). The collector acknowledges each
   message only once it is committed (its default); ``--ack-on-arrival`` adds runs acknowledging on arrival.
2. **Dashboard**: a fresh SQLite store seeded directly with 24 h of windows of 200 devices, the
   dashboard serving it, and headless Chromium loading the page: navigation timing (load event) and
   the page's own ready mark (tables filled, plots drawn). Measured on raw windows, then again after
   the store's retention rolled everything older than an hour into 5-minute buckets.

Writes JSON (``--out``) and prints a table. All device figures are SYNTHETIC (the simulator's).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgekit.fleet.collector import Collector  # noqa: E402
from edgekit.fleet.simulate import FleetSimulator, SimulationConfig  # noqa: E402
from edgekit.fleet.store import open_store  # noqa: E402
from tests.runtime.agent.mosquitto import MosquittoBroker, free_port  # noqa: E402


#: Seconds without a new stored window after which the ingest is taken to have ended (what is missing then is lost).
STALL_S = 5.0
#: The simulated devices' fleet (scripts/bench_fleet_scale.py sets another, to ingest beside a seeded fleet).
FLEET = "bench"
COLLECTOR_OPTIONS: dict[str, Any] = {"session_expiry_s": 3600, "batch_size": 1000, "queue_size": 50_000}


def _prime_session(broker: MosquittoBroker, client_id: str, fleet: str, shared_group: str | None = None,
                   mqtt_version: str = "5") -> None:  # fmt: skip
    """Create a persistent session subscribed like the collector, then leave: the broker queues for it."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from edgekit_runtime.agent.topics import subscription

    if mqtt_version == "5":
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5)
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
        client.connect(broker.host, broker.port, clean_start=True, properties=properties)
    else:  # the same protocol the collector resumes the session with
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv311,
                             clean_session=False)  # fmt: skip
        client.connect(broker.host, broker.port)
    client.loop_start()
    prefix = f"$share/{shared_group}/" if shared_group else ""
    topics = [prefix + subscription("telemetry", fleet), prefix + subscription("events", fleet), subscription("status", fleet)]
    result, mid = client.subscribe([(topic, 1) for topic in topics])
    time.sleep(0.5)
    client.disconnect()
    client.loop_stop()


def _count_windows(store: Any) -> int:
    return sum(s.windows for s in store.device_summaries(FLEET))


def _stored_by(collector: Collector) -> Callable[[], int]:
    """The windows ``collector`` has committed so far: read from its counters, so that timing a run does not
    query the store it writes to (a device summary of 40,000 windows takes ~20 ms and the store's lock)."""
    return lambda: collector.metrics.snapshot()["stored"].get("telemetry", 0)


def _wait_stored(count_stored: Callable[[], int], expected: int, timeout_s: float,
                 start: float | None = None) -> tuple[int, float]:  # fmt: skip
    """(windows stored, seconds from ``start`` until the count stopped growing or reached ``expected``)."""
    start = start if start is not None else time.monotonic()
    last, last_change = -1, start
    while time.monotonic() - start < timeout_s:
        count = count_stored()
        now = time.monotonic()
        if count != last:
            last, last_change = count, now
        if count >= expected or now - last_change > STALL_S:
            return count, last_change - start
        time.sleep(0.05)
    return last, time.monotonic() - start


def bench_ingest(store_url: str, workdir: Path, devices: int, windows: int, mqtt_version: str = "5",
                 ack_after_store: bool = True) -> dict[str, Any]:  # fmt: skip
    """Live and drain ingest of ``devices`` x ``windows`` telemetry windows into the store at ``store_url``.

    The rate is timed on the collector's own count of committed windows; stored and lost are then counted
    in the store."""
    results: dict[str, Any] = {"store": store_url.split("://")[0], "devices": devices, "windows_per_device": windows,
                               "mqtt_version": mqtt_version, "ack_after_store": ack_after_store}  # fmt: skip
    options = {**COLLECTOR_OPTIONS, "mqtt_version": mqtt_version, "ack_after_store": ack_after_store}
    with MosquittoBroker(workdir / "mosquitto", extra_config=["max_queued_messages 0", "max_inflight_messages 0",
                                                              "max_queued_bytes 0"]) as broker:  # fmt: skip
        store = open_store(store_url)
        config = SimulationConfig(broker.url, devices=devices, rate_per_s=0.001, fleet=FLEET, seed=1)
        for phase in ("live", "drain"):
            before = _count_windows(store)
            simulator = FleetSimulator(config if phase == "live" else SimulationConfig(**{**config.__dict__, "seed": 2}))
            if phase == "live":
                collector = Collector(broker.url, store, client_id="bench-collector", fleet=FLEET, **options).start()
            else:
                _prime_session(broker, "bench-collector-drain", FLEET, mqtt_version=mqtt_version)  # the broker queues for this session
                for agent in simulator.agents.values():
                    agent.seq = windows  # continue after the live phase's sequence numbers
            simulator.start(telemetry=False)
            sent = simulator.publish_backlog(windows)
            t0 = time.monotonic()
            acked_ok = simulator.flush(300)
            publish_s = time.monotonic() - t0
            if phase == "live":
                _, seconds = _wait_stored(_stored_by(collector), sent, 300, start=t0)
            else:
                collector = Collector(broker.url, store, client_id="bench-collector-drain", fleet=FLEET, **options)
                t0 = time.monotonic()
                collector.start(timeout_s=300)  # the broker sends the queued backlog before the SUBACK
                _, seconds = _wait_stored(_stored_by(collector), sent, 300, start=t0)
            counters = simulator.counters()
            simulator.stop()
            collector.stop()
            new = _count_windows(store) - before
            results[phase] = {
                "sent": sent, "acked_by_broker": counters.acked - (counters.published - sent), "all_acked": acked_ok,
                "stored": new, "lost": sent - new, "seconds": round(seconds, 3),
                "stored_per_s": round(new / seconds, 1) if seconds > 0 else None,
                "publish_per_s": round(sent / publish_s, 1) if publish_s > 0 else None,
            }  # fmt: skip
            print(f"  {results['store']} {phase}: {results[phase]}", flush=True)
        store.close()
    return results


def _collector_process(broker_url: str, store_url: str, client_id: str, options: dict[str, Any], go: Any, ready: Any,
                       stop: Any, fleet: str = FLEET) -> None:  # fmt: skip
    """One collector of a shared group in its own process (``fleet collect --workers N`` does the same);
    imported and waiting for ``go`` before it connects, so process start-up is not timed."""
    go.wait()
    with open_store(store_url) as store:
        collector = Collector(broker_url, store, client_id=client_id, fleet=fleet, shared_group="bench", **options)
        collector.start(timeout_s=300)
        ready.set()
        stop.wait()
        collector.stop()


def bench_ingest_workers(store_url: str, workdir: Path, devices: int, windows: int, mqtt_version: str,
                         workers: int) -> dict[str, Any]:
    """Like :func:`bench_ingest`'s live phase, with ``workers`` collector processes in one shared subscription
    group (clean sessions, as docs/fleet.md advises for shared groups). The drain phase is left out:
    with persistent shared sessions primed beforehand, Mosquitto handed only one member its queued share
    within the timeout in our runs (not a loss with clean sessions, which the live phase and
    tests/fleet/test_collect_workers.py check)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    results: dict[str, Any] = {"store": store_url.split("://")[0], "devices": devices, "windows_per_device": windows,
                               "mqtt_version": mqtt_version, "workers": workers}  # fmt: skip
    options = {**COLLECTOR_OPTIONS, "mqtt_version": mqtt_version}
    with MosquittoBroker(workdir / "mosquitto", extra_config=["max_queued_messages 0", "max_inflight_messages 0",
                                                              "max_queued_bytes 0"]) as broker:  # fmt: skip
        store = open_store(store_url)  # creates the schema before the workers open it
        config = SimulationConfig(broker.url, devices=devices, rate_per_s=0.001, fleet=FLEET, seed=1)
        for phase in ("live",):
            before = _count_windows(store)
            simulator = FleetSimulator(config if phase == "live" else SimulationConfig(**{**config.__dict__, "seed": 2}))
            ids = [f"bench-{phase}-worker-{i}" for i in range(workers)]
            go, stop = context.Event(), context.Event()
            readies = [context.Event() for _ in ids]
            processes = [context.Process(target=_collector_process, args=(broker.url, store_url, cid, options, go, ready, stop, FLEET))
                         for cid, ready in zip(ids, readies)]  # fmt: skip
            for process in processes:
                process.start()
            if phase == "live":
                go.set()
                for ready in readies:
                    ready.wait(60)
            else:
                for cid in ids:
                    _prime_session(broker, cid, FLEET, shared_group="bench", mqtt_version=mqtt_version)
                for agent in simulator.agents.values():
                    agent.seq = windows
                time.sleep(3.0)  # let the worker processes finish importing
            simulator.start(telemetry=False)
            sent = simulator.publish_backlog(windows)
            t0 = time.monotonic()
            acked_ok = simulator.flush(300)
            publish_s = time.monotonic() - t0
            if phase == "drain":
                t0 = time.monotonic()
                go.set()
            stored, seconds = _wait_stored(lambda: _count_windows(store), before + sent, 300, start=t0)
            counters = simulator.counters()
            simulator.stop()
            stop.set()
            for process in processes:
                process.join(60)
            new = stored - before
            results[phase] = {
                "sent": sent, "acked_by_broker": counters.acked - (counters.published - sent), "all_acked": acked_ok,
                "stored": new, "lost": sent - new, "seconds": round(seconds, 3),
                "stored_per_s": round(new / seconds, 1) if seconds > 0 else None,
                "publish_per_s": round(sent / publish_s, 1) if publish_s > 0 else None,
            }  # fmt: skip
            print(f"  {results['store']} {phase} ({workers} workers): {results[phase]}", flush=True)
        store.close()
    return results


class Postgres:
    """A throwaway PostgreSQL server (initdb in a temp dir, run as the 'postgres' user when root); ``settings``:
    more ``name=value`` server settings (e.g. ``shared_preload_libraries=timescaledb``)."""

    def __init__(self, workdir: Path, settings: tuple[str, ...] = ()) -> None:
        self.workdir, self.port = workdir, free_port()
        self.data = workdir / "pgdata"
        self.settings = settings

    @staticmethod
    def available() -> bool:
        return shutil.which("initdb") is not None and shutil.which("pg_ctl") is not None

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        done = subprocess.run(prefix + list(command), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> str:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            self.workdir.parent.chmod(0o755)  # the postgres user must reach its folder
            shutil.chown(self.workdir, "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        return self.start_again()

    def start_again(self) -> str:
        """Start the server (initdb'd by :meth:`start`) on its port again after :meth:`stop`: an outage's end."""
        extra = "".join(f" -c {setting}" for setting in self.settings)
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.workdir / "pg.log"), "-w", "-o",
                  f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c fsync=on{extra}", "start")  # fmt: skip
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "stop")
        except RuntimeError:
            pass


def bench_dashboard(workdir: Path, devices: int, window_s: float) -> dict[str, Any]:
    from edgekit.fleet.dashboard import DashboardServer
    from edgekit.fleet.dashboard.browser import HeadlessChromium, chromium_missing
    from edgekit.fleet.sim.seed import seed_history

    missing = chromium_missing()
    if missing:
        return {"skipped": missing}
    store_url = f"sqlite:///{workdir}/dashboard.db"
    with open_store(store_url) as store:
        t0 = time.monotonic()
        seeded = seed_history(store, devices=devices, hours=24, window_s=window_s)
        seed_s = time.monotonic() - t0
    results: dict[str, Any] = {"devices": devices, "hours": 24, "window_s": window_s, "windows": seeded.windows,
                               "seed_s": round(seed_s, 1)}  # fmt: skip

    def load(label: str) -> None:
        with DashboardServer(store_url, port=0, cache_s=0.0) as server, HeadlessChromium() as browser:
            first = browser.load(server.url)
            again = browser.load(server.url)
        results[label] = {"first": first.__dict__, "again": again.__dict__}
        print(f"  dashboard {label}: load event {first.load_event_end_ms:.0f} ms, ready {first.ready_ms:.0f} ms "
              f"(again: {again.load_event_end_ms:.0f} / {again.ready_ms:.0f} ms)", flush=True)  # fmt: skip

    load("raw")
    with open_store(store_url) as store:
        t0 = time.monotonic()
        rolled = store.apply_retention(dt.timedelta(hours=1), rollup_minutes=5)
        results["retention"] = {"rolled_up_windows": rolled, "seconds": round(time.monotonic() - t0, 1)}
    load("after_retention")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--windows", type=int, default=100, help="telemetry windows per device per ingest phase")
    parser.add_argument("--dashboard-window-s", type=float, default=60.0, help="window length of the seeded 24 h")
    parser.add_argument("--mqtt-version", action="append", choices=("5", "3.1.1"),
                        help="collector MQTT version(s) for the SQLite ingest runs (repeat to compare; default 3.1.1 and 5)")
    parser.add_argument("--workers", type=int, default=2, help="collector processes for the shared-group SQLite run (0: skip)")
    parser.add_argument("--ack-on-arrival", action="store_true",
                        help="also time the SQLite ingest with ack_after_store=False (PUBACK on arrival, before the commit)")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--skip-dashboard", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench_fleet.json"))
    args = parser.parse_args()

    results: dict[str, Any] = {"host": {"machine": platform.machine(), "cores": os.cpu_count(), "python": platform.python_version(),
                                        "load_average_1m_at_start": os.getloadavg()[0]},
                               "synthetic": True, "ingest": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="edgekit-bench-fleet-") as tmp:
        work = Path(tmp)
        for index, version in enumerate(args.mqtt_version or ["3.1.1", "5"]):
            print(f"ingest into SQLite (collector on MQTT {version})", flush=True)
            results["ingest"].append(bench_ingest(f"sqlite:///{work}/ingest-{index}.db", work / f"sqlite-{index}",
                                                  args.devices, args.windows, version))  # fmt: skip
            if args.ack_on_arrival:
                print(f"ingest into SQLite (collector on MQTT {version}, ack on arrival)", flush=True)
                results["ingest"].append(bench_ingest(f"sqlite:///{work}/ingest-{index}-ack.db", work / f"sqlite-{index}-ack",
                                                      args.devices, args.windows, version, ack_after_store=False))  # fmt: skip
        if args.workers > 0:
            version = (args.mqtt_version or ["3.1.1"])[0]
            print(f"ingest into SQLite ({args.workers} collector processes, one shared group, MQTT {version})", flush=True)
            results["ingest"].append(bench_ingest_workers(f"sqlite:///{work}/ingest-workers.db", work / "sqlite-workers",
                                                          args.devices, args.windows, version, args.workers))  # fmt: skip
        if not args.skip_postgres and Postgres.available():
            print("ingest into PostgreSQL", flush=True)
            postgres = Postgres(work / "pg")
            try:
                results["ingest"].append(bench_ingest(postgres.start(), work / "postgres", args.devices, args.windows,
                                                      (args.mqtt_version or ["3.1.1"])[0]))  # fmt: skip
            finally:
                postgres.stop()
        if not args.skip_dashboard:
            print("dashboard page load", flush=True)
            results["dashboard"] = bench_dashboard(work, args.devices, args.dashboard_window_s)
    results["host"]["load_average_1m_at_end"] = os.getloadavg()[0]  # other work on the machine skews the rates
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    print(f"wrote {args.out}")
    return 0


def print_table(results: dict[str, Any]) -> None:
    print("\n| measure | value | target |\n| --- | --- | --- |")
    for run in results["ingest"]:
        for phase in ("live", "drain"):
            if phase not in run:
                continue
            r = run[phase]
            mode = ", ack on arrival" if run.get("ack_after_store") is False else ""
            print(f"| ingest {run['store']} {phase}, MQTT {run.get('mqtt_version', '5')}{mode}, {run.get('workers', 1)} collector(s), "
                  f"{run['devices']} devices | "
                  f"{r['stored_per_s']} msg/s stored | "
                  f"{'>= 5,000/s' if run['store'] == 'sqlite' else '-'} |")  # fmt: skip
            print(f"| lost {run['store']} {phase}, MQTT {run.get('mqtt_version', '5')}{mode}, {run.get('workers', 1)} collector(s) | "
                  f"{r['lost']} of {r['sent']} | 0 |")
    dash = results.get("dashboard") or {}
    for label in ("raw", "after_retention"):
        if label in dash:
            first = dash[label]["first"]
            print(f"| dashboard page load, {dash['devices']} devices x 24 h ({label}) | load event {first['load_event_end_ms']:.0f} ms, "
                  f"ready {first['ready_ms']:.0f} ms | < 2,000 ms |")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
