"""A child process for the kill tests: ``python -m tests.runtime.agent.producer_process MODE ...``.

``spool SPOOL``: append numbered messages to the spool forever, printing each seq once committed.
``link SPOOL BROKER_URL COUNT INTERVAL_S``: publish COUNT telemetry messages through an MqttLink,
printing ``spooled <seq>`` as each is committed; then wait until the spool is drained, print
``drained`` and exit. The parent SIGKILLs it at some point and looks at what survived.
"""

from __future__ import annotations

import json
import sys
import time

from edgekit_runtime.agent.backoff import Backoff
from edgekit_runtime.agent.mqtt import MqttLink
from edgekit_runtime.agent.spool import Spool
from tests.runtime.agent.sample_messages import sample_telemetry

DEVICE, FLEET = "dev-kill", "lab"


def run_spool(path: str) -> None:
    spool = Spool(path)
    while True:
        seq = spool.next_seq()
        spool.append("edgekit/v1/lab/dev-kill/telemetry", json.dumps({"seq": seq}).encode(), qos=1)
        print(seq, flush=True)


def run_link(path: str, broker_url: str, count: int, interval_s: float) -> None:
    spool = Spool(path)
    link = MqttLink(broker_url, DEVICE, FLEET, DEVICE, spool=spool, backoff=Backoff(0.1, 0.5), keepalive_s=5)
    link.start()
    for _ in range(count):
        seq = spool.next_seq()
        link.publish_telemetry(sample_telemetry(seq, device=DEVICE, fleet=FLEET, spool=spool))
        print(f"spooled {seq}", flush=True)
        time.sleep(interval_s)
    if not link.flush(30):
        print(f"not drained: backlog {spool.backlog()}", flush=True)
        sys.exit(1)
    print("drained", flush=True)
    link.stop()
    spool.close()


if __name__ == "__main__":
    if sys.argv[1] == "spool":
        run_spool(sys.argv[2])
    else:
        run_link(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
