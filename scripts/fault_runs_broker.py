#!/usr/bin/env python
"""Fault runs of end-to-end delivery (issue 28 item 2): Mosquitto ``kill -9`` with windows queued for a stopped
collector. Registered in ``scripts/fault_runs.py`` (``--only broker_kill_queued ...``), which counts and
writes docs/benchmarks/fault_runs.json; this file also holds its publishers' ``produce`` subcommand.

The run: ``edgekit fleet collect`` (CLI defaults: a persistent session) starts once and stops (SIGTERM), so
the broker queues for it; three publishers (the agent's real MqttLink and Spool, ``delivery`` as the run
says, ``resend_after_s`` 2 s) spool and publish 100 windows each, and print ``published`` once the broker
has acknowledged every one; Mosquitto is killed with SIGKILL and started again; 3 s later (the publishers
have reconnected; the collector's session died with the broker) the collector starts again; each
publisher waits until its spool is empty (with ``collector_ack``: the collector confirmed every window) and
exits. Brokers: the shipped settings (``persistence true``, ``max_queued_messages 0``) and Mosquitto's
defaults (no persistence). The ``broker_ack`` run is the contrast: the behaviour before, which loses them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# scripts/fault_runs.py imports this module to register the runs, so its helpers are imported where used.
PUBLISHERS, WINDOWS_EACH, INTERVAL_S, RESEND_AFTER_S = 3, 100, 0.005, 2.0


def _stack(workdir: Path, broker_config: tuple[str, ...], persistence: bool) -> Any:
    """A fault_runs ``Stack`` whose broker may run without persistence (Mosquitto's default)."""
    from scripts.fault_runs import PYTHON, Stack
    from scripts.shared_setup import ChildProcess
    from tests.runtime.agent.mosquitto import MosquittoBroker

    class BrokerStack(Stack):
        def __init__(self) -> None:  # Stack's, with the broker's persistence chosen
            self.workdir = workdir
            self.broker = MosquittoBroker(workdir / "mosquitto", persistence=persistence,
                                          extra_config=broker_config).start()  # fmt: skip
            self.db = workdir / "fleet.db"
            self.store_url = f"sqlite:///{self.db}"
            self.children = []

        def publisher(self, device: str, delivery: str) -> ChildProcess:
            child = ChildProcess([PYTHON, str(Path(__file__).resolve()), "produce", "--device", device, "--spool",
                                  str(workdir / f"spool-{device}.db"), "--broker", self.broker.url, "--count",
                                  str(WINDOWS_EACH), "--interval", str(INTERVAL_S), "--delivery", delivery],
                                 workdir / f"link-{device}.log")  # fmt: skip
            self.children.append(child)
            return child

    return BrokerStack()


def _wait_line(child: Any, line: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while line not in child.lines:
        if time.monotonic() > deadline or child.process.poll() is not None and line not in child.lines:
            raise RuntimeError(f"publisher {' '.join(child.argv)} printed no {line!r}; see {child.log}")
        time.sleep(0.05)


def run_broker_kill(result: Any, *, persistence: bool, delivery: str = "collector_ack") -> Any:
    import tempfile

    from scripts.fault_runs import BROKER_CONFIG, count, spooled, wait_drained

    config = BROKER_CONFIG if persistence else ()
    with tempfile.TemporaryDirectory(prefix="edgekit-faults-") as directory:
        s = _stack(Path(directory), config, persistence)
        try:
            first = s.collector(name="collector-1")
            first.next_json("started")
            first.stop()  # SIGTERM: its persistent session stays, the broker queues for it
            links = [s.publisher(f"dev-{i}", delivery) for i in range(PUBLISHERS)]
            for link in links:
                _wait_line(link, "published", 60)  # every window PUBACKed by the broker
            queued = sum(len(spooled(link)) for link in links)
            s.broker.kill()  # kill -9
            s.broker.start()
            time.sleep(3)  # the publishers reconnect; the collector's session died with the broker
            second = s.collector(name="collector-2")
            second.next_json("started")
            wait_drained(links)
            s.wait_quiet()
            second.stop()
            result.notes.append(f"{queued} windows PUBACKed by the broker and queued for the stopped collector "
                                f"when Mosquitto was killed; delivery {delivery}")  # fmt: skip
            if delivery == "collector_ack":
                done = [link.next_json("delivery", 5) for link in links]
                result.notes.append(f"the publishers sent {sum(d['resent'] for d in done)} windows again (the newest "
                                    f"as a probe after resend_after_s {RESEND_AFTER_S:g} s, then the older ones as a "
                                    f"hole); {sum(d['confirmed'] for d in done)} confirmed by "
                                    f"{sum(d['acks_received'] for d in done)} acks")  # fmt: skip
            return count(result, s.store_url, {f"dev-{i}": spooled(link) for i, link in enumerate(links)}, [second])
        finally:
            s.close()


def broker_kill_queued(result: Any) -> Any:
    return run_broker_kill(result, persistence=True)


def broker_kill_queued_no_persistence(result: Any) -> Any:
    return run_broker_kill(result, persistence=False)


def broker_kill_queued_broker_ack(result: Any) -> Any:
    return run_broker_kill(result, persistence=True, delivery="broker_ack")


def broker_kill_queued_agent(result: Any) -> Any:
    """The same with the real ``edgekit-agent`` (0.2 s windows, its config's defaults: collector_ack, resend 30 s),
    producing all along: the windows the broker lost go out again 5 s after later ones are confirmed."""
    from edgekit_runtime.agent.spool import Spool
    from scripts.fault_runs import Agent, count, stack

    with stack() as s:
        first = s.collector(name="collector-1")
        first.next_json("started")
        first.stop()
        agent = Agent(s, "agent-1", s.workdir / "agent").start()
        queued = agent.wait_health(lambda health: health["spool"]["backlog"] >= 50, "50 windows awaiting the collector",
                                   60)["spool"]["backlog"]  # fmt: skip
        s.broker.kill()
        s.broker.start()
        time.sleep(3)
        second = s.collector(name="collector-2")
        second.next_json("started")
        agent.wait_health(lambda health: health["spool"]["backlog"] <= 3, "the collector to confirm the backlog", 90)
        assert agent.child is not None
        agent.child.stop()  # SIGTERM
        s.wait_quiet()
        second.stop()
        with Spool(agent.spool_path) as spool:
            awaiting = {json.loads(entry.payload)["seq"] for entry in spool.peek(1000)
                        if entry.topic.endswith("/telemetry")}  # fmt: skip
        result.notes.append(f"{queued} windows in the agent's spool awaiting the collector when Mosquitto was killed")
        result.notes.append(f"{len(awaiting)} newest window(s) still awaiting their ack when the agent stopped: kept in "
                            "its spool for the next start, not counted as produced")  # fmt: skip
        return count(result, s.store_url, {agent.device: agent.produced() - awaiting}, [second])


#: name -> (fault, publisher, run), merged into scripts/fault_runs.py's RUNS.
BROKER_RUNS = {
    "broker_kill_queued": ("Mosquitto kill -9 with 300 PUBACKed windows queued for a stopped collector, restarted, "
                           "then the collector started (persistence true, max_queued_messages 0)",
                           "link x3 collector_ack", broker_kill_queued),  # fmt: skip
    "broker_kill_queued_no_persistence": ("the same on Mosquitto's defaults (no persistence)", "link x3 collector_ack",
                                          broker_kill_queued_no_persistence),  # fmt: skip
    "broker_kill_queued_agent": ("the same with a real agent producing 0.2 s windows all along (its defaults)",
                                 "edgekit-agent", broker_kill_queued_agent),  # fmt: skip
    "broker_kill_queued_broker_ack": ("the same with delivery broker_ack (the behaviour before issue 28)",
                                      "link x3 broker_ack", broker_kill_queued_broker_ack),  # fmt: skip
}
#: Runs whose losses are expected (they show the fault).
BROKER_CONTRASTS = ("broker_kill_queued_broker_ack",)


def produce(device: str, spool_path: str, broker_url: str, count_: int, interval_s: float, delivery: str) -> int:
    """One publisher: spool and publish ``count_`` windows, print ``published`` once the broker acknowledged them
    all, then ``drained`` once the spool is empty (with collector_ack: once the collector confirmed them)."""
    from edgekit_runtime.agent.backoff import Backoff
    from edgekit_runtime.agent.mqtt import MqttLink
    from edgekit_runtime.agent.spool import Spool
    from scripts.fault_runs import FLEET, publish_windows

    spool = Spool(spool_path)
    link = MqttLink(broker_url, device, FLEET, device, spool=spool, backoff=Backoff(0.1, 0.5), keepalive_s=5,
                    delivery=delivery, resend_after_s=RESEND_AFTER_S)  # type: ignore[arg-type]  # fmt: skip
    link.start()
    publish_windows(link, spool, device, count_, interval_s)
    deadline = time.monotonic() + 60
    while link.counters.acked < count_ and time.monotonic() < deadline:
        time.sleep(0.02)
    print("published" if link.counters.acked >= count_ else f"not published: {link.counters}", flush=True)
    if not link.flush(120):
        print(f"not drained: backlog {spool.backlog()} {link.delivery.counters().to_dict()}", flush=True)
        return 1
    print(json.dumps({"event": "delivery", **link.delivery.counters().to_dict()}), flush=True)
    print("drained", flush=True)
    link.stop()
    spool.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="(internal) one publishing device of the broker kill fault runs")
    commands = parser.add_subparsers(dest="command", required=True)
    producer = commands.add_parser("produce")
    producer.add_argument("--device", required=True)
    producer.add_argument("--spool", required=True)
    producer.add_argument("--broker", required=True)
    producer.add_argument("--count", type=int, required=True)
    producer.add_argument("--interval", type=float, required=True)
    producer.add_argument("--delivery", choices=("collector_ack", "broker_ack"), default="collector_ack")
    args = parser.parse_args(argv)
    return produce(args.device, args.spool, args.broker, args.count, args.interval, args.delivery)


if __name__ == "__main__":
    sys.exit(main())
