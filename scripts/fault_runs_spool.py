#!/usr/bin/env python
"""Fault run "spool on a 2 MiB disk for 10 minutes" (issue 28 items 1 and 10).

    .venv/bin/python scripts/fault_runs_spool.py [--minutes 10] [--out docs/benchmarks/fault_runs.json]

Registered in ``scripts/fault_runs.py`` (``--only spool_small_disk``, 10 minutes), which counts and writes
docs/benchmarks/fault_runs.json; run from here, ``--minutes`` makes it shorter. Needs root (a tmpfs mount).

A real ``edgekit-agent run`` keeps its spool (and its command replay record, beside it) on a 2 MiB tmpfs, with
telemetry windows every 0.04 s and ``overflow_messages`` 100, against a private Mosquitto and a real
``edgekit fleet collect`` (CLI defaults, SQLite). Over ``T`` minutes:

* 0-15 %: the collector confirms every window (before issue 28 the WAL filled the disk after ~118 windows);
* 15-55 %: the collector is stopped: the spool fills the disk up to its headroom, windows then wait in memory
  and, past 100, are dropped there (they take their seqs: a gap, reported in ``telemetry_dropped``); pings are
  sent (each answer needs the replay record and an event written on the full disk); once the spool reports
  ``disk_full`` (from 35 %, by 50 %) the agent is killed with SIGKILL and started again at once (a leftover WAL
  on a full disk);
* 55 %: the collector starts again and drains the agent; 65-75 %: another file fills the disk to the last byte
  (pings again); then it is deleted; at 100 % the agent is stopped (SIGTERM) and the collector once quiet.

Counted per the delivery runs (produced: seqs the agent took; stored: distinct seqs in the store), plus
summarised: seqs listed in the ``telemetry_dropped`` events the store holds. lost = produced - stored -
summarised; duplicated = the store's duplicates plus windows both stored and summarised. The notes say how the
gaps ``fleet status`` shows (``missing_seqs``) compare with the summaries, the pings answered, the largest WAL
and the agent's spool states.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# scripts/fault_runs.py imports this module to register the run, so its helpers are imported where used.
MINUTES = 10.0
INTERVAL_S, OVERFLOW_MESSAGES, DISK_KIB = 0.04, 100, 2048


class Watch:
    """Samples the agent's health and the spool's files twice a second while the run goes on."""

    def __init__(self, agent: Any, mount: Path) -> None:
        self.agent, self.mount = agent, mount
        self.states: dict[str, int] = {}
        self.largest_wal = 0
        self.least_free = 1 << 62
        self.last_state = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            wal = self.mount / "spool" / "spool.db-wal"
            try:
                self.largest_wal = max(self.largest_wal, wal.stat().st_size)
            except OSError:
                pass
            stats = os.statvfs(self.mount)
            self.least_free = min(self.least_free, stats.f_bavail * stats.f_frsize)
            try:
                state = str(self.agent.health()["spool"]["state"])
            except Exception:  # the agent is being restarted
                continue
            self.states[state] = self.states.get(state, 0) + 1
            self.last_state = state

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _ping(broker_url: str, device: str) -> str:
    """Publish a ``ping`` command (QoS 1) and return its id."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    from edgekit_runtime.agent.telemetry import utc_timestamp
    from scripts.fault_runs import FLEET

    host, port = broker_url.removeprefix("mqtt://").rsplit(":", 1)
    command_id = uuid.uuid4().hex
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"faults-ping-{command_id[:8]}")
    client.connect(host, int(port))
    client.loop_start()
    try:
        payload = {"schema": "edgekit.command/1", "id": command_id, "command": "ping", "issued_at": utc_timestamp()}
        client.publish(f"edgekit/v1/{FLEET}/{device}/cmd", json.dumps(payload), qos=1).wait_for_publish(10)
    finally:
        client.loop_stop()
        client.disconnect()
    return command_id


def _configure(agent: Any) -> None:
    """The fault_runs Agent's config with the run's window interval and in-memory bound."""
    import yaml

    config = yaml.safe_load(agent.config.read_text(encoding="utf-8"))
    config["telemetry"].update({"interval_s": INTERVAL_S})
    config["telemetry"]["spool"] = {"path": str(agent.spool_path.parent / "spool" / "spool.db"),
                                    "overflow_messages": OVERFLOW_MESSAGES}  # fmt: skip
    agent.spool_path = agent.spool_path.parent / "spool" / "spool.db"
    agent.config.write_text(yaml.safe_dump(config), encoding="utf-8")


def _summarised(store_url: str, device: str) -> tuple[set[int], int, list[dict[str, Any]]]:
    """Seqs listed in the device's stored telemetry_dropped events, the windows they count, and the events."""
    from edgekit.fleet.store import open_store
    from scripts.fault_runs import FLEET

    with open_store(store_url) as store:
        events = [e for e in store.events(fleet=FLEET, device=device, limit=100_000) if e.kind == "telemetry_dropped"]
    seqs: set[int] = set()
    counted = 0
    details = []
    for event in events:
        info = event.payload.get("details", {})
        details.append(info)
        counted += int(info.get("windows") or 0)
        for first, last in info.get("seq_ranges") or ():
            seqs.update(range(int(first), int(last) + 1))
    return seqs, counted, details


def spool_small_disk(result: Any) -> Any:
    from edgekit.fleet.store import open_store
    from scripts.fault_runs import FLEET, Agent, count, stack
    from tests.runtime.agent.small_fs import fill

    total_s = MINUTES * 60
    with stack() as s:
        mount = s.workdir / "fs"
        mount.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_KIB}k,mode=0755", "tmpfs", str(mount)],
                                 capture_output=True, text=True, check=False)  # fmt: skip
        if mounted.returncode != 0:
            result.notes.append(f"not run: cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
            return result
        watch = None
        try:
            collector = s.collector(name="collector-1")
            collector.next_json("started")
            agent = Agent(s, "agent-1", mount)  # its bundle (8 KB) on the tmpfs too
            _configure(agent)
            agent.start()
            started = time.monotonic()
            watch = Watch(agent, mount)

            def at(fraction: float) -> None:
                time.sleep(max(started + fraction * total_s - time.monotonic(), 0))

            pings: dict[str, list[str]] = {}

            def ping_three(group: str) -> None:
                agent.wait_health(lambda health: bool(health["broker_connected"]), "the agent's broker connection")
                pings[group] = [_ping(s.broker.url, agent.device) for _ in range(3)]

            at(0.15)
            collector.stop()  # the collector is away: nothing confirms windows, the spool fills the disk
            at(0.30)
            ping_three("collector away")
            at(0.35)
            try:  # kill once the spool has filled the disk (10 min: long before 35 %), at 50 % at the latest
                agent.wait_health(lambda health: health["spool"]["state"] == "disk_full", "a full spool",
                                  max(started + 0.5 * total_s - time.monotonic(), 1))  # fmt: skip
            except RuntimeError:
                pass
            state_at_kill = watch.last_state
            assert agent.child is not None
            wal_at_kill = (mount / "spool" / "spool.db-wal").stat().st_size if (mount / "spool" / "spool.db-wal").exists() else 0
            free_at_kill = os.statvfs(mount).f_bavail * os.statvfs(mount).f_frsize
            kill_fraction = (time.monotonic() - started) / total_s
            agent.child.kill()  # kill -9 on a full disk: the next start finds its WAL
            agent.start()
            ping_three("after the kill -9 and restart")
            at(0.55)
            collector = s.collector(name="collector-2")
            collector.next_json("started")
            at(0.65)
            filler = fill(mount)
            time.sleep(1)
            free_filled = os.statvfs(mount).f_bavail
            ping_three("disk filled to the last byte")
            at(0.75)
            filler.unlink()
            at(1.0)
            try:
                agent.wait_health(lambda health: health["spool"]["state"] == "ok", "the spool's state ok", 60)
            except RuntimeError:
                result.notes.append(f"the spool's state was not ok 60 s after the end: {agent.health()['spool']}")
            watch.stop()
            agent.child.stop()  # SIGTERM: the last window
            s.wait_quiet(quiet_s=5)
            collector.stop()
            produced = agent.produced()
            result = count(result, s.store_url, {agent.device: produced}, [collector])
            summarised, counted, reports = _summarised(s.store_url, agent.device)
            with open_store(s.store_url) as store:
                stored = {w.seq for w in store.windows(fleet=FLEET, device=agent.device)}
                gaps = {seq for first, last in store.missing_seqs(FLEET, agent.device) for seq in range(first, last + 1)}
                answered = {e.command_id for e in store.events(fleet=FLEET, device=agent.device, limit=100_000)
                            if e.kind == "pong"}  # fmt: skip
            result.lost = len(produced - stored - summarised)
            result.duplicated += len(stored & summarised)
            result.notes += [
                f"ran {MINUTES:g} min: {len(produced)} windows produced, {len(stored & produced)} stored, "
                f"{len(summarised & produced)} summarised as dropped in {len(reports)} telemetry_dropped events "
                f"(their window counts add up to {counted}; reasons "
                f"{sorted({r for info in reports for r in info.get('reasons', ())})})",
                f"fleet status gaps (missing_seqs): {len(gaps)} seqs, {'all' if gaps <= summarised else 'NOT all'} "
                f"listed in the drop summaries",
                "pings answered: " + ", ".join(f"{len(answered & set(ids))} of {len(ids)} {group}"
                                               for group, ids in pings.items()) + f" ({free_filled} blocks free when filled)",
                f"agent killed with SIGKILL at {kill_fraction:.0%} (spool {state_at_kill}, WAL {wal_at_kill} B, "
                f"{free_at_kill} B free) and restarted",
                f"largest WAL {watch.largest_wal} B; least free {watch.least_free} B; spool states seen "
                f"(half-second samples) {watch.states}; at the end {watch.last_state}",
            ]
            return result
        finally:
            if watch is not None:
                watch.stop()
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


#: name -> (fault, publisher, run), merged into scripts/fault_runs.py's RUNS.
def spool_replaced(result: Any) -> Any:
    """A spool moved away, as its error says to do with a damaged one, while the collector still holds the old
    windows raw: the new spool numbers its windows from 1 again. Counted per spool: the old one's windows in the
    store's totals (rolled up once the new seqs reach theirs), the new one's among the raw windows that start
    after the restart."""
    import datetime as dt

    from edgekit.fleet.store import open_store
    from scripts.fault_runs import FLEET, Agent, stack

    with stack() as s:
        collector = s.collector()
        collector.next_json("started")
        agent = Agent(s, "agent-1", s.workdir / "agent").start()
        s.wait_rows(25, 60)
        assert agent.child is not None
        agent.child.stop()  # SIGTERM: the agent publishes its last window and stops
        s.wait_quiet()
        first = agent.produced()
        for suffix in ("", "-wal", "-shm"):  # the whole SQLite database: what an operator moves away
            if Path(f"{agent.spool_path}{suffix}").exists():
                Path(f"{agent.spool_path}{suffix}").rename(f"{agent.spool_path}.damaged{suffix}")
        restarted_at = dt.datetime.now(dt.timezone.utc)
        agent.start()
        time.sleep(2.5)  # fewer windows than the old spool's: every new seq is one the store holds raw
        agent.wait_drained()
        agent.child.stop()
        s.wait_quiet()
        collector.stop()
        second = agent.produced()
        with open_store(s.store_url) as store:
            raw = list(store.windows(fleet=FLEET, device=agent.device))
            (totals,) = store.aggregate(("device",), fleet=FLEET)
    new = [w.seq for w in raw if w.window_start >= restarted_at]
    old_counted = totals.windows - len(new)
    result.produced = len(first) + len(second)
    lost_new, lost_old = len(second - set(new)), max(0, len(first) - old_counted)
    result.lost = lost_new + lost_old
    result.stored = result.produced - result.lost
    result.duplicated = max(0, old_counted - len(first)) + len(new) - len(set(new))
    result.notes.append(f"old spool: seqs 1-{max(first)}, {old_counted} counted; new spool: seqs 1-{max(second)}, "
                        f"{len(set(new) & second)} stored raw; {len(raw) - len(new)} old windows left raw")  # fmt: skip
    return result


SPOOL_RUNS = {
    "spool_small_disk": ("spool on a 2 MiB disk (tmpfs) for 10 minutes: collector away 40 % of it, agent kill -9 "
                         "on the full disk, the disk filled to the last byte by another file for 10 %",
                         "edgekit-agent", spool_small_disk),  # fmt: skip
    "spool_replaced": ("the agent stopped, its spool moved away (what its error says to do with a damaged one) and "
                       "started again: seqs from 1 while the store holds the old ones raw", "edgekit-agent",
                       spool_replaced),  # fmt: skip
}


def main(argv: list[str] | None = None) -> int:
    import argparse

    import scripts.fault_runs as fault_runs
    import scripts.fault_runs_spool as registered  # the module fault_runs.py registered (this file runs as __main__)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=MINUTES, help="how long the run lasts (default 10)")
    parser.add_argument("--out", type=Path, default=fault_runs.OUT, help="JSON output (runs of other names kept)")
    args = parser.parse_args(argv)
    registered.MINUTES = args.minutes
    if args.minutes != 10:
        fault, publisher, run = fault_runs.RUNS["spool_small_disk"]
        fault_runs.RUNS["spool_small_disk"] = (fault.replace("for 10 minutes", f"for {args.minutes:g} minutes"),
                                               publisher, run)  # fmt: skip
    return int(fault_runs.main(["--only", "spool_small_disk", "--out", str(args.out)]))


if __name__ == "__main__":
    sys.exit(main())
