#!/usr/bin/env python
"""Fault runs of the fleet delivery path: what the agents produced against what the store kept, per fault.

    .venv/bin/python scripts/fault_runs.py [--only NAME ...] [--out docs/benchmarks/fault_runs.json]

Each run starts a private Mosquitto on a free loopback port (``persistence true`` and ``max_queued_messages 0``,
as docs/fleet.md asks of a collector's broker; one contrast run keeps Mosquitto's default of 1000), a real ``edgekit fleet collect`` subprocess with its CLI defaults (a
SQLite store), and real publishers, injects one fault, waits until the publishers' spools are drained and
the collector has gone quiet, then counts, per device:

* produced: windows committed to a publisher's spool (the seqs its link printed, or for the real agent the
  spool's last seq: the agent takes a seq when it stores the window),
* stored: distinct (device, seq) in the store, raw and rolled up,
* lost: produced but not stored,
* duplicated: windows counted more than once (the store's window count, raw plus rollups, less the distinct
  seqs),
* redelivered: messages the surviving collectors received again and did not store (from their ``stopped``
  JSON line; 0 where the collector that received them was killed).

Publishers: ``link`` runs are this script's own ``produce`` subcommand, the agent's real MqttLink and Spool
publishing ``sample_telemetry`` windows (as ``tests/runtime/agent/producer_process.py`` does, for any
device id); ``agent`` runs are the real ``edgekit-agent run`` with a tiny signed bundle and 0.2 s telemetry
windows. The disk-full run puts the agent's spool on a 2 MiB tmpfs (needs root), fills it, then frees it.
Runs: see :data:`RUNS`. The table goes to stdout, the JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.* helpers: the private Mosquitto, sample messages, tiny bundles

from scripts.shared_setup import ChildProcess, MosquittoBroker, free_port, host_conditions, markdown_table  # noqa: E402

FLEET = "faults"
#: The broker settings docs/fleet.md asks for (beyond persistence): queue for an absent collector without bound.
BROKER_CONFIG = ("max_queued_messages 0",)
OUT = REPO / "docs" / "benchmarks" / "fault_runs.json"
PYTHON = sys.executable
AGENT = str(Path(sys.executable).with_name("edgekit-agent"))


# -- processes --------------------------------------------------------------------------------


class Stack:
    """One run's broker, store and logs in a temporary directory."""

    def __init__(self, workdir: Path, broker_config: tuple[str, ...] = BROKER_CONFIG) -> None:
        self.workdir = workdir
        self.broker = MosquittoBroker(workdir / "mosquitto", persistence=True, extra_config=broker_config).start()
        self.db = workdir / "fleet.db"
        self.store_url = f"sqlite:///{self.db}"
        self.children: list[ChildProcess] = []

    def collector(self, *extra: str, name: str = "collector") -> ChildProcess:
        child = ChildProcess([PYTHON, "-m", "edgekit.cli.main", "fleet", "collect", "--broker", self.broker.url,
                              "--store", self.store_url, "--fleet", FLEET, "--no-metrics", "--json", *extra],
                             self.workdir / f"{name}.log")  # fmt: skip
        self.children.append(child)
        return child

    def link(self, device: str, count: int, interval_s: float) -> ChildProcess:
        child = ChildProcess([PYTHON, str(Path(__file__).resolve()), "produce", "--device", device, "--spool",
                              str(self.workdir / f"spool-{device}.db"), "--broker", self.broker.url, "--count", str(count),
                              "--interval", str(interval_s)], self.workdir / f"link-{device}.log")  # fmt: skip
        self.children.append(child)
        return child

    def stored_rows(self) -> int:
        if not self.db.exists():
            return 0
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10) as connection:
            try:
                return int(connection.execute("SELECT COUNT(*) FROM telemetry_windows").fetchone()[0])
            except sqlite3.OperationalError:
                return 0

    def wait_rows(self, rows: int, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while (found := self.stored_rows()) < rows and time.monotonic() < deadline:
            time.sleep(0.1)
        return found

    def wait_quiet(self, quiet_s: float = 3.0, timeout_s: float = 60.0) -> None:
        """Until the store has not grown for ``quiet_s`` (the collector drained what the broker held)."""
        deadline = time.monotonic() + timeout_s
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            rows = self.stored_rows()
            if rows != last:
                last, since = rows, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return
            time.sleep(0.2)

    def close(self) -> None:
        for child in self.children:
            child.kill()
        self.broker.stop()


@contextmanager
def stack(broker_config: tuple[str, ...] = BROKER_CONFIG) -> Iterator[Stack]:
    with tempfile.TemporaryDirectory(prefix="edgekit-faults-") as directory:
        opened = Stack(Path(directory), broker_config)
        try:
            yield opened
        finally:
            opened.close()
            keep = os.environ.get("EDGEKIT_FAULT_LOGS")  # a folder to keep the run's logs in (agent, collector, broker)
            if keep:
                kept = Path(keep) / Path(directory).name
                kept.mkdir(parents=True, exist_ok=True)
                for log in Path(directory).glob("*.log"):
                    shutil.copy2(log, kept / log.name)


# -- counting ---------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    fault: str
    publisher: str
    produced: int = 0
    stored: int = 0
    lost: int = 0
    duplicated: int = 0
    redelivered: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def count(result: Result, store_url: str, produced: dict[str, set[int]], survivors: list[ChildProcess]) -> Result:
    from edgekit.fleet.store import open_store

    with open_store(store_url) as store:
        stored = {device: {w.seq for w in store.windows(fleet=FLEET, device=device)} for device in produced}
        totals = {a.device: a.windows for a in store.aggregate(("device",), fleet=FLEET)}
    result.produced = sum(len(seqs) for seqs in produced.values())
    result.stored = sum(len(stored[d] & produced[d]) for d in produced)
    result.lost = sum(len(produced[d] - stored[d]) for d in produced)
    result.duplicated = sum(totals.get(d, 0) - len(stored[d]) for d in produced)
    extra = sum(len(stored[d] - produced[d]) for d in produced)
    if extra:
        result.notes.append(f"{extra} stored windows the count of produced ones does not include")
    for child in survivors:
        for line in child.lines:
            if '"stopped"' in line:
                result.redelivered += sum(json.loads(line)["duplicates"].values())
    return result


def spooled(child: ChildProcess) -> set[int]:
    return {int(line.split()[1]) for line in child.lines if line.startswith("spooled ")}


def wait_drained(links: list[ChildProcess], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    for link in links:
        try:
            link.process.wait(max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"publisher {' '.join(link.argv)} did not drain its spool; see {link.log}") from None
        if "drained" not in link.lines:
            raise RuntimeError(f"publisher {' '.join(link.argv)} ended without draining its spool; see {link.log}")


# -- the runs ---------------------------------------------------------------------------------

DEVICES, WINDOWS, INTERVAL_S = 4, 400, 0.005


def _links(s: Stack) -> list[ChildProcess]:
    return [s.link(f"dev-{i}", WINDOWS, INTERVAL_S) for i in range(DEVICES)]


def run_collector_kill(result: Result, *options: str, broker_config: tuple[str, ...] = BROKER_CONFIG) -> Result:
    with stack(broker_config) as s:
        first = s.collector(*options, name="collector-1")
        first.next_json("started")
        links = _links(s)
        s.wait_rows(DEVICES * WINDOWS // 4, 60)
        first.kill()  # kill -9, mid-stream
        at_kill = s.stored_rows()
        time.sleep(3)
        second = s.collector(*options, name="collector-2")
        second.next_json("started")
        wait_drained(links)
        s.wait_quiet()
        second.stop()
        result.notes.append(f"killed with {at_kill} windows stored")
        return count(result, s.store_url, {f"dev-{i}": spooled(link) for i, link in enumerate(links)}, [second])


def collector_kill(result: Result) -> Result:
    return run_collector_kill(result)


def collector_kill_stock_queue(result: Result) -> Result:
    return run_collector_kill(result, broker_config=())


def collector_kill_clean_session(result: Result) -> Result:
    return run_collector_kill(result, "--session-expiry", "0")


def worker_kill(result: Result) -> Result:
    with stack() as s:
        parent = s.collector("--workers", "2")
        workers = [parent.next_json("started"), parent.next_json("started")]
        links = _links(s)
        s.wait_rows(DEVICES * WINDOWS // 4, 60)
        os.kill(int(workers[0]["pid"]), signal.SIGKILL)
        again = parent.next_json("started", timeout_s=30)
        result.notes.append(f"worker {workers[0]['client_id']} killed; the supervisor started it again as pid "
                            f"{again['pid']}")  # fmt: skip
        wait_drained(links)
        s.wait_quiet()
        parent.stop()
        return count(result, s.store_url, {f"dev-{i}": spooled(link) for i, link in enumerate(links)}, [parent])


def scale_in(result: Result) -> Result:
    with stack() as s:
        three = s.collector("--workers", "3", name="collector-3")
        for _ in range(3):
            three.next_json("started")
        links = _links(s)
        s.wait_rows(DEVICES * WINDOWS // 4, 60)
        three.stop()  # SIGTERM: the workers store what they hold; their sessions stay, each with a share
        time.sleep(2)
        two = s.collector("--workers", "2", name="collector-2")
        retired = two.next_json("retired")
        two.next_json("started")
        result.notes.append(f"{retired['client_id']} retired, {retired['drained']} messages drained from its session")
        wait_drained(links)
        s.wait_quiet()
        two.stop()
        return count(result, s.store_url, {f"dev-{i}": spooled(link) for i, link in enumerate(links)}, [three, two])


def broker_restart(result: Result) -> Result:
    with stack() as s:
        collector = s.collector()
        collector.next_json("started")
        links = _links(s)
        s.wait_rows(DEVICES * WINDOWS // 4, 60)
        s.broker.stop()  # SIGTERM: Mosquitto saves its sessions and queues (persistence true)
        time.sleep(2)
        s.broker.start()
        wait_drained(links)
        s.wait_quiet()
        collector.stop()
        return count(result, s.store_url, {f"dev-{i}": spooled(link) for i, link in enumerate(links)}, [collector])


# -- the real agent -----------------------------------------------------------------------------


class Agent:
    """A real ``edgekit-agent`` with a tiny signed bundle, 0.2 s telemetry windows and its spool at ``spool_dir``."""

    def __init__(self, s: Stack, device: str, spool_dir: Path, delivery: str = "collector_ack") -> None:
        import yaml

        from edgekit.bundle.signing import generate_keypair, sign_bundle
        from tests.runtime.agent_service.bundles import make_bundle

        self.stack, self.device = s, device
        keys = s.workdir / "keys"
        keys.mkdir(exist_ok=True)
        generate_keypair(keys / "fleet.key.pem", keys / "fleet.pub.pem")
        bundle = make_bundle(s.workdir / "src" / "tiny-a", name="tiny-a")
        sign_bundle(bundle, keys / "fleet.key.pem")
        self.spool_path = spool_dir / "spool.db"
        self.api = f"127.0.0.1:{free_port()}"
        self.config = s.workdir / f"agent-{device}.yaml"
        self.config.write_text(yaml.safe_dump({
            "device_id": device, "fleet": FLEET,
            "broker": {"url": s.broker.url, "keepalive_s": 5},
            "bundles": {"dir": str(spool_dir / "bundles"), "public_key": str(keys / "fleet.pub.pem")},
            "api": {"address": self.api},
            "telemetry": {"interval_s": 0.2, "spool": {"path": str(self.spool_path)}, "delivery": delivery},
            "power": {"sensor": "none"},
            "health": {"window_s": 0, "max_error_rate": 0.1, "min_requests": 1},
        }), encoding="utf-8")  # fmt: skip
        subprocess.run([AGENT, "install", str(bundle), "--config", str(self.config)], check=True, capture_output=True,
                       cwd=REPO, timeout=120)  # fmt: skip
        self.child: ChildProcess | None = None
        self.runs = 0

    def start(self) -> Agent:
        self.runs += 1
        self.child = ChildProcess([AGENT, "run", "--config", str(self.config)], self.stack.workdir / f"agent-{self.runs}.log")
        self.stack.children.append(self.child)
        self.wait_health(lambda health: True, "its API")
        return self

    def health(self) -> dict[str, Any]:
        from edgekit_runtime.agent.client import AgentClient

        with AgentClient(self.api, timeout_s=5) as client:
            return client.health()

    def wait_health(self, predicate: Callable[[dict[str, Any]], bool], what: str, timeout_s: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        problem = ""
        while time.monotonic() < deadline:
            try:
                health = self.health()
                if predicate(health):
                    return health
            except Exception as exc:  # not up yet
                problem = str(exc)
            time.sleep(0.2)
        raise RuntimeError(f"agent {self.device}: timed out waiting for {what} ({problem})")

    def backlog(self) -> int:
        return int(self.wait_health(lambda health: True, "its health")["spool"]["backlog"])

    def wait_drained(self, timeout_s: float = 60.0) -> None:
        self.wait_health(lambda health: health["spool"]["backlog"] == 0 and health["spool"]["in_memory"] == 0,
                         "an empty spool", timeout_s)  # fmt: skip

    def produced(self) -> set[int]:
        from edgekit_runtime.agent.spool import Spool

        with Spool(self.spool_path) as spool:
            return set(range(1, spool.last_seq() + 1))


def agent_kill_broker_down(result: Result) -> Result:
    with stack() as s:
        collector = s.collector()
        collector.next_json("started")
        agent = Agent(s, "agent-1", s.workdir / "agent").start()
        s.wait_rows(10, 60)
        s.broker.stop()
        time.sleep(3)  # windows go to the spool only
        backlog = agent.backlog()
        assert agent.child is not None
        agent.child.kill()  # kill -9 with the broker down and a backlog in the spool
        s.broker.start()
        agent.start()
        time.sleep(1)
        agent.wait_drained()
        agent.child.stop()  # SIGTERM: the agent publishes its last window and stops
        s.wait_quiet()
        collector.stop()
        result.notes.append(f"killed with {backlog} windows in its spool")
        return count(result, s.store_url, {agent.device: agent.produced()}, [collector])


def agent_drains_while_collector_away(result: Result) -> Result:
    """The issue's second report: the agent empties its spool into the broker while no collector is there."""
    with stack() as s:
        first = s.collector(name="collector-1")
        first.next_json("started")
        # broker_ack: with collector_ack (the default since issue 28) the agent keeps its windows until a collector
        # has stored them, so it cannot drain into the broker while the collector is away
        agent = Agent(s, "agent-1", s.workdir / "agent", delivery="broker_ack").start()
        s.wait_rows(5, 60)
        s.broker.stop()
        time.sleep(3)  # the agent spools
        backlog = agent.backlog()
        first.kill()  # kill -9 while the broker is down
        s.broker.start()
        agent.wait_drained()  # the broker acknowledged the backlog: only the collector's session holds it now
        time.sleep(1)
        second = s.collector(name="collector-2")
        second.next_json("started")
        assert agent.child is not None
        agent.child.stop()
        s.wait_quiet()
        second.stop()
        result.notes.append(f"{backlog} windows in the agent's spool when the collector was killed")
        return count(result, s.store_url, {agent.device: agent.produced()}, [second])


def disk_full_spool(result: Result) -> Result:
    from tests.runtime.agent.small_fs import fill

    with stack() as s:
        mount = s.workdir / "fs"
        mount.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2048k,mode=0755", "tmpfs", str(mount)],
                                 capture_output=True, text=True, check=False)  # fmt: skip
        if mounted.returncode != 0:
            result.notes.append(f"not run: cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
            return result
        try:
            collector = s.collector()
            collector.next_json("started")
            agent = Agent(s, "agent-1", mount).start()
            s.wait_rows(5, 60)
            filler = fill(mount)
            agent.wait_health(lambda health: health["spool"]["state"] == "disk_full", "the spool to report disk_full")
            time.sleep(2)  # windows produced while the disk is full
            filler.unlink()
            agent.wait_health(lambda health: health["spool"]["state"] != "disk_full", "the spool to recover")
            agent.wait_drained()
            dropped = agent.health()["spool"]["in_memory_dropped"]
            result.notes.append(f"{dropped} windows dropped from memory while the disk was full (they get no seq)")
            assert agent.child is not None
            agent.child.stop()
            s.wait_quiet()
            collector.stop()
            return count(result, s.store_url, {agent.device: agent.produced()}, [collector])
        finally:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def replay_after_rollup(result: Result) -> Result:
    """The roll-up case of issue 18: the same windows again after retention rolled them up (store API)."""
    import datetime as dt

    from edgekit.fleet.ingest import parse_message
    from edgekit.fleet.store import open_store
    from edgekit_runtime.agent.telemetry import encode_message
    from tests.runtime.agent.sample_messages import sample_telemetry

    with tempfile.TemporaryDirectory(prefix="edgekit-faults-") as directory:
        url = f"sqlite:///{directory}/fleet.db"
        windows = [parse_message(f"edgekit/v1/{FLEET}/dev-0/telemetry",
                                 encode_message(sample_telemetry(seq, device="dev-0", fleet=FLEET)))
                   for seq in range(1, 51)]  # fmt: skip
        with open_store(url) as store:
            store.add_windows(windows)  # type: ignore[arg-type]
            store.apply_retention(dt.timedelta(0))
            new = store.add_windows(windows)  # type: ignore[arg-type]  # redelivered: spool replay, QoS 1
            store.apply_retention(dt.timedelta(0))
            (totals,) = store.aggregate(("device",), fleet=FLEET)
        result.produced, result.stored = 50, min(totals.windows, 50)
        result.duplicated = totals.windows - 50
        result.redelivered = 50 - new
        result.lost = 50 - result.stored
        result.notes.append(f"inferences counted: {totals.inferences} (produced {50 * 5})")
        return result


#: name -> (fault, publisher, run).
RUNS: dict[str, tuple[str, str, Callable[[Result], Result]]] = {
    "collector_kill": ("collector kill -9, restarted 3 s later with the CLI defaults", "link x4", collector_kill),
    "collector_kill_stock_queue": ("the same on a broker with Mosquitto's default max_queued_messages 1000",
                                   "link x4", collector_kill_stock_queue),  # fmt: skip
    "collector_kill_clean_session": ("the same with --session-expiry 0 (the old default: a clean session)",
                                     "link x4", collector_kill_clean_session),  # fmt: skip
    "worker_kill": ("--workers 2, one worker kill -9 (the supervisor starts it again)", "link x4", worker_kill),
    "scale_in": ("--workers 3 stopped mid-stream, started again as --workers 2 (worker 2's session retired)",
                 "link x4", scale_in),  # fmt: skip
    "broker_restart": ("Mosquitto stopped mid-stream, started 2 s later (persistence true)", "link x4",
                       broker_restart),  # fmt: skip
    "agent_kill_broker_down": ("broker down, agent kill -9 with a spool backlog, broker back, agent restarted",
                               "edgekit-agent", agent_kill_broker_down),  # fmt: skip
    "agent_drains_while_collector_away": ("broker down, collector kill -9, broker back: the agent drains its spool "
                                          "before the collector is restarted", "edgekit-agent",
                                          agent_drains_while_collector_away),  # fmt: skip
    "disk_full_spool": ("the agent's spool file system (2 MiB tmpfs) filled, then freed", "edgekit-agent",
                        disk_full_spool),  # fmt: skip
    "replay_after_rollup": ("50 windows rolled up, then delivered again (store API)", "store", replay_after_rollup),
}


from scripts.fault_runs_broker import BROKER_CONTRASTS, BROKER_RUNS  # noqa: E402 (issue 28: broker kill -9)

RUNS.update(BROKER_RUNS)

from scripts.fault_runs_spool import SPOOL_RUNS  # noqa: E402 (issue 28: the spool on a 2 MiB disk, 10 minutes)

RUNS.update(SPOOL_RUNS)

#: Runs that show what goes wrong without the safe settings: their losses are expected.
CONTRASTS = ("collector_kill_stock_queue", "collector_kill_clean_session", *BROKER_CONTRASTS)


def publish_windows(link: Any, spool: Any, device: str, count_: int, interval_s: float) -> None:
    """Spool and publish ``count_`` sample telemetry windows through ``link``, printing each seq as it is taken."""
    from tests.runtime.agent.sample_messages import sample_telemetry

    for _ in range(count_):
        seq = spool.next_seq()
        link.publish_telemetry(sample_telemetry(seq, device=device, fleet=FLEET, spool=spool))
        print(f"spooled {seq}", flush=True)
        time.sleep(interval_s)


def produce(device: str, spool_path: str, broker_url: str, count_: int, interval_s: float) -> int:
    """The ``produce`` subcommand: the agent's MqttLink and Spool publishing ``count_`` windows, then draining."""
    from edgekit_runtime.agent.backoff import Backoff
    from edgekit_runtime.agent.mqtt import MqttLink
    from edgekit_runtime.agent.spool import Spool

    spool = Spool(spool_path)
    link = MqttLink(broker_url, device, FLEET, device, spool=spool, backoff=Backoff(0.1, 0.5), keepalive_s=5)
    link.start()
    publish_windows(link, spool, device, count_, interval_s)
    if not link.flush(90):
        print(f"not drained: backlog {spool.backlog()}", flush=True)
        return 1
    print("drained", flush=True)
    link.stop()
    spool.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command")
    producer = commands.add_parser("produce", help="(internal) one publishing device")
    producer.add_argument("--device", required=True)
    producer.add_argument("--spool", required=True)
    producer.add_argument("--broker", required=True)
    producer.add_argument("--count", type=int, required=True)
    producer.add_argument("--interval", type=float, required=True)
    parser.add_argument("--only", nargs="+", choices=sorted(RUNS), help="run only these")
    parser.add_argument("--out", type=Path, default=OUT, help=f"JSON output (default {OUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    if args.command == "produce":
        return produce(args.device, args.spool, args.broker, args.count, args.interval)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = []
    for name in args.only or list(RUNS):
        fault, publisher, run = RUNS[name]
        started = time.monotonic()
        result = Result(name, fault, publisher)
        try:
            result = run(result)
        except Exception as exc:  # a run that could not finish is reported, not hidden
            result.notes.append(f"run failed: {type(exc).__name__}: {exc}")
        result.seconds = round(time.monotonic() - started, 1)
        results.append(result)
        print(f"{name:30} produced {result.produced:5}  stored {result.stored:5}  lost {result.lost:5}  "
              f"duplicated {result.duplicated:3}  redelivered {result.redelivered:4}  {result.seconds:5.1f} s  "
              f"{'; '.join(result.notes)}", flush=True)  # fmt: skip
    written = results
    if args.only and args.out.exists():  # keep the earlier results of the runs not run this time, in RUNS order
        earlier = {run["name"]: Result(**run) for run in json.loads(args.out.read_text(encoding="utf-8"))["runs"]}
        ran = {r.name: r for r in results}
        written = [ran.get(name) or earlier[name] for name in RUNS if name in ran or name in earlier]
    document = {
        "description": "edgekit fleet delivery under faults: produced vs stored windows (scripts/fault_runs.py)",
        "host": host_conditions(),
        "broker": "private Mosquitto 2 per run: persistence true, max_queued_messages 0 (unless the run says "
                  "otherwise), other settings Mosquitto's defaults",
        "collector": "edgekit fleet collect with its CLI defaults, SQLite store",
        "runs": [asdict(r) for r in written],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(_table(written))
    return 0 if all(r.lost == 0 and r.duplicated == 0 for r in results if r.name not in CONTRASTS) else 1


def _table(results: list[Result]) -> str:
    header = ["run", "fault", "publisher", "produced", "stored", "lost", "duplicated", "redelivered", "s"]
    rows = [[r.name, r.fault, r.publisher, r.produced, r.stored, r.lost, r.duplicated, r.redelivered, r.seconds] for r in results]
    return markdown_table(header, rows, right_aligned=range(3, 9))


if __name__ == "__main__":
    sys.exit(main())
