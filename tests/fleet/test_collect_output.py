"""``edgekit fleet collect``: its final counts are a result (stdout); progress and logs stay on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.messages import Publisher, telemetry, topic
from tests.runtime.agent.mosquitto import MosquittoBroker

REPO = Path(__file__).resolve().parents[2]


def _collect(broker: MosquittoBroker, store_url: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli.main", "fleet", "collect", "--broker", broker.url, "--store", store_url,
         "--fleet", "out", "--no-metrics", "--duration", "4", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_final_counts_go_to_stdout_and_progress_to_stderr(tmp_path: Path) -> None:
    broker = MosquittoBroker(tmp_path / "mosquitto").start()
    try:
        process = _collect(broker, f"sqlite:///{tmp_path / 'plain.db'}")
        assert process.stderr is not None
        assert "collecting from" in process.stderr.readline()  # subscribed: what is published now is received
        with Publisher(broker) as device:
            device.publish_many([(topic("telemetry", fleet="out"), encode_message(telemetry(s, fleet="out")))
                                 for s in (1, 2, 2)])  # fmt: skip
            device.publish(topic("telemetry", fleet="out"), b"{oops")
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        assert out.splitlines() == ["received 4, stored 2, duplicates 1, rejected 1"]
        assert "received 4" not in err and "stopping: storing what was received" in err

        # --json: stdout holds only JSON lines; the human-readable counts move to stderr beside the progress
        process = _collect(broker, f"sqlite:///{tmp_path / 'json.db'}", "--json")
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        events = [json.loads(line)["event"] for line in out.splitlines()]
        assert events == ["started", "stopped"]
        assert "received 0, stored 0, duplicates 0, rejected 0" in err
    finally:
        broker.stop()
