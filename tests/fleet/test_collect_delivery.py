"""``edgekit fleet collect`` with its CLI defaults loses nothing and counts nothing twice when it is killed:
a real collector subprocess, ``kill -9``, a restart with the same defaults, and a real agent link (spool +
MQTT, ``tests/runtime/agent/producer_process.py``) publishing all along; then stored vs produced."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import pytest

from edgekit.cli.main import main
from edgekit.fleet.collector import default_client_id
from edgekit.fleet.store import open_store
from tests.runtime.agent.mosquitto import MosquittoBroker

REPO = Path(__file__).resolve().parents[2]
DEVICE, FLEET = "dev-kill", "lab"  # what producer_process publishes as
INFERENCES_PER_WINDOW = 5  # sample_telemetry's latency samples
QUEUE_ALL = ["max_queued_messages 0"]


def _collect(broker: MosquittoBroker, store_url: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "edgekit.cli.main", "fleet", "collect", "--broker", broker.url, "--store", store_url,
         "--fleet", FLEET, "--no-metrics", "--json", *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _next_json(stream: IO[str] | None, event: str, timeout_s: float = 30.0) -> dict[str, Any]:
    assert stream is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        if line.startswith("{") and json.loads(line).get("event") == event:
            return dict(json.loads(line))
    raise AssertionError(f"no {event!r} line from the collector")


def _producer(broker: MosquittoBroker, spool: Path, count: int, interval_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.runtime.agent.producer_process", "link", str(spool), broker.url,
                             str(count), str(interval_s)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def _stored_rows(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as connection:
        return int(connection.execute("SELECT COUNT(*) FROM telemetry_windows").fetchone()[0])


def _wait_for_rows(db: Path, rows: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while (found := _stored_rows(db)) < rows and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def _stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    return out


def _check_stored_once(store_url: str, produced: int) -> None:
    with open_store(store_url) as store:
        seqs = [w.seq for w in store.windows(fleet=FLEET, device=DEVICE)]
        (totals,) = store.aggregate(("device",), devices=[(FLEET, DEVICE)])
    assert len(seqs) - len(set(seqs)) == 0
    lost = sorted(set(range(1, produced + 1)) - set(seqs))
    assert lost == [], f"{len(lost)} of {produced} windows lost: {lost[:20]}"
    assert (totals.windows, totals.inferences) == (produced, produced * INFERENCES_PER_WINDOW)


def test_killed_collector_restarted_with_cli_defaults_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    # The broker as docs/fleet.md configures it for collectors: queue for an absent collector without bound
    # (Mosquitto's default of 1000 drops what a restart under load takes longer than that to collect).
    broker = MosquittoBroker(tmp_path / "mosquitto", extra_config=QUEUE_ALL).start()
    db = tmp_path / "fleet.db"
    store_url = f"sqlite:///{db}"
    produced = 600
    processes: list[subprocess.Popen[str]] = []
    try:
        first = _collect(broker, store_url)
        processes.append(first)
        started = _next_json(first.stdout, "started")
        assert started["client_id"] == default_client_id(FLEET) and started["session_expiry_s"] == 86400
        producer = _producer(broker, tmp_path / "spool", produced, 0.005)
        processes.append(producer)
        assert _wait_for_rows(db, 100, 30) >= 100
        first.send_signal(signal.SIGKILL)  # mid-stream: some windows received, not yet stored or acknowledged
        first.wait(10)
        at_kill = _stored_rows(db)
        time.sleep(3)  # the agent keeps publishing; the broker queues for the collector's session
        second = _collect(broker, store_url)
        processes.append(second)
        assert _next_json(second.stdout, "started")["client_id"] == started["client_id"]
        out, err = producer.communicate(timeout=60)
        assert producer.returncode == 0 and "drained" in out, (out, err)
        assert at_kill < produced, "the producer finished before the kill: nothing was tested"
        assert _wait_for_rows(db, produced, 30) == produced
        stopped = json.loads([line for line in _stop(second).splitlines() if '"stopped"' in line][-1])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        broker.stop()
    _check_stored_once(store_url, produced)
    assert sum(stopped["received"].values()) >= produced - at_kill  # what waited for it came to the second run


def test_two_workers_one_killed_is_restarted_and_nothing_is_lost(tmp_path: Path) -> None:
    broker = MosquittoBroker(tmp_path / "mosquitto", extra_config=QUEUE_ALL).start()
    db = tmp_path / "fleet.db"
    store_url = f"sqlite:///{db}"
    produced = 600
    processes: list[subprocess.Popen[str]] = []
    try:
        parent = _collect(broker, store_url, "--workers", "2")
        processes.append(parent)
        workers = [_next_json(parent.stdout, "started"), _next_json(parent.stdout, "started")]
        ids = sorted(w["client_id"] for w in workers)
        base = default_client_id(FLEET, "edgekit-collectors")
        assert ids == [f"{base}-0", f"{base}-1"]
        producer = _producer(broker, tmp_path / "spool", produced, 0.005)
        processes.append(producer)
        assert _wait_for_rows(db, 100, 30) >= 100
        victim = workers[0]
        subprocess.run(["kill", "-9", str(victim["pid"])], check=True)
        again = _next_json(parent.stdout, "started", timeout_s=30)  # the supervisor starts it again
        assert again["client_id"] == victim["client_id"] and again["pid"] != victim["pid"]
        out, err = producer.communicate(timeout=60)
        assert producer.returncode == 0 and "drained" in out, (out, err)
        assert _wait_for_rows(db, produced, 30) == produced
        parent.send_signal(signal.SIGTERM)
        _, err = parent.communicate(timeout=30)
        assert parent.returncode == 0, err
        assert f"collector worker 0 (pid {victim['pid']}) died (signal SIGKILL); starting it again" in \
            " ".join(err.split()) or f"collector worker 1 (pid {victim['pid']}) died (signal SIGKILL)" in " ".join(err.split())  # fmt: skip
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        broker.stop()
    _check_stored_once(store_url, produced)


def test_a_worker_that_cannot_start_fails_the_command_instead_of_restarting_forever(tmp_path: Path) -> None:
    started = time.monotonic()
    process = subprocess.run(
        [sys.executable, "-m", "edgekit.cli.main", "fleet", "collect", "--broker", "mqtt://127.0.0.1:1",
         "--store", f"sqlite:///{tmp_path / 'fleet.db'}", "--workers", "2", "--no-metrics"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert process.returncode == 2, process.stderr
    assert "127.0.0.1:1" in process.stderr and "starting it again" not in process.stderr
    assert time.monotonic() - started < 60


def test_session_expiry_must_not_be_negative(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fleet", "collect", "--broker", "mqtt://127.0.0.1:1", "--store", f"sqlite:///{tmp_path / 'f.db'}",
                 "--session-expiry", "-5"])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "--session-expiry must be >= 0 seconds, got -5" in err and "0 is a clean session" in err


def test_default_client_id_is_stable_and_names_host_fleet_and_group() -> None:
    assert default_client_id("lab", host="edge box/1") == "edgekit-collector-edge-box-1-lab"
    assert default_client_id(None, "ingest", host="h") == "edgekit-collector-h-all-ingest"
    assert default_client_id("lab") == default_client_id("lab")


def _gone(pid: int) -> bool:
    """No such process, or only its zombie left (a reaper without wait() keeps those)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return True
    return fields[0] in ("Z", "X")


def test_workers_stop_when_their_parent_is_killed(tmp_path: Path) -> None:
    broker = MosquittoBroker(tmp_path / "mosquitto").start()
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    parent = _collect(broker, store_url, "--workers", "2")
    try:
        pids = [_next_json(parent.stdout, "started")["pid"] for _ in range(2)]
        parent.send_signal(signal.SIGKILL)  # the supervisor dies without telling its workers
        parent.wait(10)
        deadline = time.monotonic() + 20
        while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_gone(pid) for pid in pids), "orphaned workers kept running (they would fight a restart's workers)"
    finally:
        for pid in pids if "pids" in locals() else []:
            if not _gone(pid):
                subprocess.run(["kill", "-9", str(pid)], check=False)
        if parent.poll() is None:
            parent.kill()
        broker.stop()


def test_fewer_workers_than_last_time_retire_the_sessions_of_the_others(tmp_path: Path) -> None:
    """``--workers 3`` stopped, messages published (the broker queues a share for each worker's session), then
    ``--workers 2``: the parent drains and ends worker 2's session, so its share is stored, not stranded."""
    from tests.fleet.messages import Publisher, telemetry, topic

    from edgekit_runtime.agent.telemetry import encode_message

    broker = MosquittoBroker(tmp_path / "mosquitto", extra_config=QUEUE_ALL).start()
    db = tmp_path / "fleet.db"
    store_url = f"sqlite:///{db}"
    messages = [(topic("telemetry", device=f"d{d}", fleet=FLEET), encode_message(telemetry(seq, device=f"d{d}", fleet=FLEET)))
                for seq in range(1, 31) for d in range(3)]  # fmt: skip
    processes: list[subprocess.Popen[str]] = []
    try:
        three = _collect(broker, store_url, "--workers", "3")
        processes.append(three)
        ids = sorted(_next_json(three.stdout, "started")["client_id"] for _ in range(3))
        _stop(three)
        with Publisher(broker) as device:
            device.publish_many(messages)  # nobody connected: queued in the three sessions
        two = _collect(broker, store_url, "--workers", "2")
        processes.append(two)
        retired = _next_json(two.stdout, "retired")
        assert retired["client_id"] == ids[2] and retired["drained"] > 0
        assert _wait_for_rows(db, len(messages), 30) == len(messages)
        _stop(two)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        broker.stop()
    with open_store(store_url) as store:
        assert sorted((w.device, w.seq) for w in store.windows()) == sorted((f"d{d}", s) for s in range(1, 31) for d in range(3))


def test_retire_needs_the_persistent_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fleet", "collect", "--broker", "mqtt://127.0.0.1:1", "--store", f"sqlite:///{tmp_path / 'f.db'}",
                 "--retire", "--session-expiry", "0"])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "--retire needs the persistent session the collector ran with" in err


def test_retire_stores_what_the_session_held_and_ends_it(tmp_path: Path) -> None:
    from tests.fleet.messages import Publisher, telemetry, topic

    from edgekit_runtime.agent.telemetry import encode_message

    broker = MosquittoBroker(tmp_path / "mosquitto", extra_config=QUEUE_ALL).start()
    store_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    try:
        first = _collect(broker, store_url)
        _next_json(first.stdout, "started")
        _stop(first)
        with Publisher(broker) as device:
            device.publish_many([(topic("telemetry", fleet=FLEET), encode_message(telemetry(seq, fleet=FLEET)))
                                 for seq in range(1, 21)])  # fmt: skip
        retire = [sys.executable, "-m", "edgekit.cli.main", "fleet", "collect", "--broker", broker.url, "--store",
                  store_url, "--fleet", FLEET, "--no-metrics", "--json", "--retire"]  # fmt: skip
        done = subprocess.run(retire, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1]) == {"event": "retired", "client_id": default_client_id(FLEET),
                                                            "session_found": True, "drained": 20}  # fmt: skip
        again = subprocess.run(retire, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert json.loads(again.stdout.splitlines()[-1])["session_found"] is False
    finally:
        broker.stop()
    with open_store(store_url) as store:
        assert [w.seq for w in store.windows()] == list(range(1, 21))
