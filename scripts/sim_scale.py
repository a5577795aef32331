#!/usr/bin/env python3
"""A big live simulated fleet on one machine: connect time, windows/s, CPU, and what a collector stored.

One run, on loopback (issue 27 item 2b):

1. A private Mosquitto on a free port, configured for many connections (no connection limit, no
   queue limit, its open-files limit raised with this process's to the hard limit).
2. A collector (``edgekit fleet collect``, its own process) storing into ``--store`` (default a fresh
   SQLite file in the work directory).
3. ``--devices`` simulated devices (:class:`~edgekit.fleet.simulate.FleetSimulator`, this process),
   each its own MQTT connection with its own client id and last will, telemetry every ``--window-s``
   (default 10 s, the agent's). Timed: every device connected (``start()`` returns, process start included); then
   ``--duration`` seconds of telemetry: windows published and acknowledged per second, CPU seconds of
   the simulator, the broker and the collector (from /proc), the simulator's peak memory.
4. ``--crash`` devices cut without DISCONNECT (:meth:`FleetSimulator.crash`): seconds until the
   broker published each one's last will (``offline``, reason ``connection lost``).
5. The simulator stops; once the collector has caught up, the windows in the store are counted:
   ``not_stored`` = windows the devices sent but the store lacks; a crashed device's windows still in
   flight (unacknowledged) when it was cut die with it, as on a real crash.

Prints a summary and writes JSON (``--out``). Every device figure is SYNTHETIC.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgekit.fleet.sim.limits import raise_open_files_limit  # noqa: E402
from edgekit.fleet.sim.shards import ShardedFleetSimulator, auto_processes  # noqa: E402
from edgekit.fleet.simulate import SimulationConfig  # noqa: E402
from edgekit_runtime.agent.topics import DeviceTopics  # noqa: E402
from edgekit.fleet.store import open_store  # noqa: E402
from scripts.shared_setup import MosquittoBroker, load_average  # noqa: E402

BROKER_CONFIG = ["max_connections -1", "max_queued_messages 0", "connection_messages false", "log_type error",
                 "log_type warning"]  # fmt: skip
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def max_rss_mb(pid: int) -> float:
    """Peak resident memory of a process (VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def count_windows(store_url: str, fleet: str, since: dt.datetime) -> int:
    with open_store(store_url) as store:
        return sum(1 for _ in store.windows(fleet=fleet, since=since))


class WillWatcher:
    """Subscribes to the status topics of the devices to crash, timing each one's ``offline`` will. Connect
    it before the simulator opens its thousands of sockets: paho's own loop thread uses select(), which
    cannot watch a descriptor numbered above 1023."""

    def __init__(self, broker: MosquittoBroker, fleet: str, devices: list[str]) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

        self.devices = devices
        self.topics = {DeviceTopics(fleet, d).status: d for d in devices}
        self.crashed_at: dict[str, float] = {}
        self.seen: dict[str, float] = {}
        self.client = paho.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5, client_id="sim-scale-wills")
        self.client.on_message = self._on_message
        self.client.connect(broker.host, broker.port)
        self.client.loop_start()
        for topic in self.topics:
            self.client.subscribe(topic, qos=1)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        device = self.topics.get(message.topic)
        if device is None or device not in self.crashed_at:
            return
        body = json.loads(message.payload)
        if body.get("state") == "offline" and body.get("reason") == "connection lost":
            self.seen.setdefault(device, time.monotonic() - self.crashed_at[device])

    def crash_and_wait(self, simulator: ShardedFleetSimulator, timeout_s: float) -> dict[str, float]:
        """Crash the devices; device -> seconds until its will arrived."""
        for device in self.devices:
            self.crashed_at[device] = time.monotonic()
            simulator.crash(device)
        deadline = time.monotonic() + timeout_s
        while len(self.seen) < len(self.devices) and time.monotonic() < deadline:
            time.sleep(0.05)
        return dict(self.seen)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--window-s", type=float, default=10.0, help="telemetry window length (default 10, the agent's)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of telemetry measured after connecting")
    parser.add_argument("--crash", type=int, default=10, help="devices cut without DISCONNECT at the end (last wills timed)")
    parser.add_argument("--store", help="collector's store (default: a fresh SQLite file in the work directory)")
    parser.add_argument("--max-connecting", type=int, default=64, help="connections waiting for a CONNACK at once (all processes)")
    parser.add_argument("--processes", type=int, help="simulator processes (default: one per 5,000 devices, at most one per CPU)")
    parser.add_argument("--workdir", type=Path, help="default: a temporary directory")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="edgekit-sim-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    raise_open_files_limit(hard if hard != resource.RLIM_INFINITY else 2 * args.devices + 256, what="the broker and the simulator")
    store_url = args.store or f"sqlite:///{workdir / 'fleet.db'}"
    fleet = "scale"
    results: dict[str, Any] = {"devices": args.devices, "window_s": args.window_s, "host": platform.node(),
                               "cpus": os.cpu_count(), "load_before": load_average(), "store": store_url.split("://")[0]}  # fmt: skip
    print(f"sim_scale: {args.devices} devices, {args.window_s:g} s windows, store {store_url}, load {results['load_before']}", flush=True)
    with MosquittoBroker(workdir / "mosquitto", extra_config=BROKER_CONFIG) as broker:
        collector = subprocess.Popen([sys.executable, "-m", "edgekit.cli.main", "fleet", "collect", "--broker", broker.url,
                                      "--store", store_url, "--fleet", fleet, "--no-metrics", "--session-expiry", "0",
                                      "--client-id", "sim-scale-collector", "--retention-hours", "0"],
                                     stdout=open(workdir / "collector.out", "wb"), stderr=subprocess.STDOUT)  # fmt: skip
        time.sleep(3.0)
        config = SimulationConfig(broker.url, devices=args.devices, rate_per_s=1.0 / args.window_s, fleet=fleet, load=0.6,
                                  max_connecting=args.max_connecting)  # fmt: skip
        processes = args.processes or auto_processes(args.devices)
        results["processes"] = processes
        simulator = ShardedFleetSimulator(config, processes=processes)
        watcher = WillWatcher(broker, fleet, sorted(simulator.devices)[: args.crash])
        started_at = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=args.window_s)
        broker_cpu0 = cpu_seconds(broker._process.pid)  # type: ignore[union-attr]
        simulator.start(telemetry=False)
        results["connect_s"] = round(simulator.connect_seconds or 0.0, 2)
        results["connect_cpu_s"] = round(sum(cpu_seconds(pid) for pid in simulator.pids), 2)
        results["connect_broker_cpu_s"] = round(cpu_seconds(broker._process.pid) - broker_cpu0, 2)  # type: ignore[union-attr]
        print(f"  connected {args.devices} in {results['connect_s']} s with {processes} process(es) (simulator CPU {results['connect_cpu_s']} s, "
              f"broker CPU {results['connect_broker_cpu_s']} s)", flush=True)  # fmt: skip
        simulator.start_telemetry()
        time.sleep(args.window_s)  # the first interval: devices start spread over it
        before = simulator.counters()
        t0, cpu0 = time.monotonic(), sum(cpu_seconds(pid) for pid in simulator.pids)
        broker_cpu0, collector_cpu0 = cpu_seconds(broker._process.pid), cpu_seconds(collector.pid)  # type: ignore[union-attr]
        time.sleep(args.duration)
        after = simulator.counters()
        elapsed = time.monotonic() - t0
        results["telemetry"] = {
            "seconds": round(elapsed, 1),
            "windows_per_s": round((after.windows - before.windows) / elapsed, 1),
            "acked_per_s": round((after.acked - before.acked) / elapsed, 1),
            "expected_windows_per_s": round(args.devices / args.window_s, 1),
            "queued_at_end": after.queued,
            "connected": after.connected,
            "simulator_cpu_share": round((sum(cpu_seconds(pid) for pid in simulator.pids) - cpu0) / elapsed, 3),
            "broker_cpu_share": round((cpu_seconds(broker._process.pid) - broker_cpu0) / elapsed, 3),  # type: ignore[union-attr]
            "collector_cpu_share": round((cpu_seconds(collector.pid) - collector_cpu0) / elapsed, 3),
            "simulator_max_rss_mb": round(sum(max_rss_mb(pid) for pid in simulator.pids), 1),
            "load": load_average(),
        }
        print(f"  telemetry: {json.dumps(results['telemetry'])}", flush=True)
        wills = watcher.crash_and_wait(simulator, timeout_s=30.0)
        watcher.close()
        results["crash"] = {"devices": args.crash, "wills_seen": len(wills),
                            "max_s_to_will": round(max(wills.values()), 3) if wills else None}  # fmt: skip
        print(f"  crash: {json.dumps(results['crash'])}", flush=True)
        stop0 = time.monotonic()
        simulator.stop(flush_s=30.0)
        final = simulator.counters()
        results["stop_s"] = round(time.monotonic() - stop0, 1)
        windows_acked = final.windows - final.queued  # telemetry the simulator handed to the broker (QoS 1)
        stored, deadline, last_change = 0, time.monotonic() + 300.0, time.monotonic()
        while time.monotonic() < deadline:
            count = count_windows(store_url, fleet, started_at)
            if count != stored:
                stored, last_change = count, time.monotonic()
            if stored >= final.windows or time.monotonic() - last_change > 20.0:
                break
            time.sleep(2.0)
        collector.send_signal(signal.SIGTERM)
        try:
            collector.wait(30)
        except subprocess.TimeoutExpired:
            collector.kill()
        collector_said = (workdir / "collector.out").read_text(errors="replace").strip().splitlines()[-1:]
        results["collector_summary"] = collector_said[0] if collector_said else None  # "received N, stored M, ..."
        results["store"] = {"windows_published": final.windows, "published_messages": final.published,
                            "acked_messages": final.acked, "queued_unsent": final.queued, "windows_stored": stored,
                            "not_stored": max(0, windows_acked - stored)}  # fmt: skip
        print(f"  store: {json.dumps(results['store'])}", flush=True)
    results["load_after"] = load_average()
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
