"""The broker goes away for 30 s while telemetry keeps being produced; after it returns every
sequence number arrives, in order. Slow (about 40 s)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.mqtt import MqttLink
from edgekit_runtime.agent.spool import Spool
from tests.runtime.agent.mosquitto import MessageRecorder, MosquittoBroker
from tests.runtime.agent.sample_messages import sample_telemetry

OUTAGE_S = 30.0
PRODUCE_EVERY_S = 0.1


@pytest.mark.slow
def test_thirty_second_broker_outage_loses_nothing(
    mosquitto_factory: Callable[..., MosquittoBroker], tmp_path: Path
) -> None:
    broker = mosquitto_factory(persistence=True)  # the recorder's session survives the restart
    recorder = MessageRecorder(broker, ["edgekit/v1/+/+/telemetry"], client_id="outage-recorder",
                               session_expiry_s=600)  # fmt: skip
    stop_producing = threading.Event()
    produced: list[int] = []
    try:
        with Spool(tmp_path / "spool.db") as spool:
            link = MqttLink(broker.url, "dev-1", "lab", "dev-1", spool=spool, keepalive_s=5,
                            backoff=Backoff(initial_s=0.5, max_s=2.0))  # fmt: skip

            def produce() -> None:
                while not stop_producing.is_set():
                    seq = spool.next_seq()
                    link.publish_telemetry(sample_telemetry(seq, spool=spool))
                    produced.append(seq)
                    time.sleep(PRODUCE_EVERY_S)

            with link:
                link.wait_connected(10)
                producer = threading.Thread(target=produce)
                producer.start()
                time.sleep(2.0)
                broker.stop()
                produced_at_stop = len(produced)
                time.sleep(OUTAGE_S)
                produced_in_outage = len(produced) - produced_at_stop  # read before the backlog, which can only grow
                backlog_at_restart = spool.backlog()
                failures_at_restart = link.backoff.failures
                broker.start()
                link.wait_connected(10)
                time.sleep(2.0)
                stop_producing.set()
                producer.join()
                assert link.flush(20)
                assert recorder.wait_for(lambda ms: len({json.loads(m.payload)["seq"] for m in ms}) == len(produced),
                                         timeout_s=20)  # fmt: skip
                counters = link.counters
    finally:
        stop_producing.set()
        recorder.close()

    seqs = [json.loads(m.payload)["seq"] for m in recorder.messages]
    first_arrivals = list(dict.fromkeys(seqs))
    assert first_arrivals == list(range(1, len(produced) + 1)) == produced
    # the outage really queued on disk: what was produced while the broker was down (counted, not assumed from the clock:
    # a starved host produced 216 windows in the 30 s, not 300) is still in the spool when it comes back
    assert produced_in_outage >= 50 and backlog_at_restart >= produced_in_outage
    assert failures_at_restart >= 5
    assert counters.reconnects == 1 and counters.dropped == 0 and counters.backlog == 0
    assert counters.acked == len(produced)
