"""``edgekit fleet collect --workers N``: N processes in one shared group store every message exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgekit.cli.main import main
from edgekit.fleet.store import open_store
from edgekit_runtime.agent.telemetry import encode_message
from tests.fleet.messages import Publisher, telemetry, topic
from tests.runtime.agent.mosquitto import MosquittoBroker

REPO = Path(__file__).resolve().parents[2]
DEVICES, WINDOWS = 4, 50


def _stored(store_url: str) -> int:
    with open_store(store_url) as store:
        return sum(1 for _ in store.windows())


def test_two_workers_share_the_load_and_store_each_message_once(tmp_path: Path) -> None:
    broker = MosquittoBroker(tmp_path / "mosquitto").start()
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    process = None
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "edgekit.cli.main", "fleet", "collect", "--broker", broker.url, "--store", store_url,
             "--fleet", "wk", "--workers", "2", "--no-metrics", "--json"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert process.stdout is not None
        started = [json.loads(line) for line in (process.stdout.readline() for _ in range(2))]
        assert [s["event"] for s in started] == ["started", "started"]
        assert all(s["subscriptions"][0] == "$share/edgekit-collectors/edgekit/v1/wk/+/telemetry" for s in started)
        messages = [(topic("telemetry", device=f"d{d}", fleet="wk"),
                     encode_message(telemetry(seq, device=f"d{d}", fleet="wk")))
                    for seq in range(1, WINDOWS + 1) for d in range(DEVICES)]  # fmt: skip
        with Publisher(broker) as device:
            device.publish_many(messages)
        deadline = time.monotonic() + 20
        while _stored(store_url) < len(messages) and time.monotonic() < deadline:
            time.sleep(0.2)
        process.terminate()  # SIGTERM to the parent: it stops both workers, which store what they hold
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
    finally:
        if process is not None and process.poll() is None:
            process.kill()
        broker.stop()
    stopped = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"stopped"' in line]
    assert len(stopped) == 2
    received = [s["received"].get("telemetry", 0) for s in stopped]
    assert sum(received) == len(messages) and min(received) > 0, received  # split, none delivered twice
    assert sum(s["duplicates"].get("telemetry", 0) for s in stopped) == 0
    with open_store(store_url) as store:
        seqs = sorted((w.device, w.seq) for w in store.windows())
    assert seqs == sorted((f"d{d}", seq) for d in range(DEVICES) for seq in range(1, WINDOWS + 1))


def test_workers_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fleet", "collect", "--broker", "mqtt://127.0.0.1:1", "--store", f"sqlite:///{tmp_path / 'f.db'}",
                 "--workers", "0"])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and "--workers must be >= 1, got 0" in err and "--workers 2" in err
