"""``edgekit fleet status|report|dashboard`` as an operator uses them: tables on stdout at full width when
piped, ``--csv``, and read-only commands that refuse a store that is not there (SQLite and PostgreSQL)."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest

from edgekit.cli.main import main
from edgekit.fleet.store import open_store
from edgekit.fleet.store.base import DeviceStatus
from tests.fleet.conftest import postgres_database, postgres_url  # noqa: F401 (pytest fixtures)
from tests.fleet.messages import BUNDLE_A, T0, window

REPO = Path(__file__).resolve().parents[2]
SINCE = "2026-02-01T00:00:00Z"
LONG_DEVICE = "greenhouse-north-row-17-camera-unit-with-a-long-name"


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """Two devices of fleet "lab", one with a name far wider than 80 columns allow beside the other columns."""
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url) as store:
        for device in ("nano-1", LONG_DEVICE):  # first, as agents report it: fleet aggregates group by it on arrival
            store.set_device_target("lab", device, "jetson-orin-nano-8gb")
        store.add_windows([window(seq, device=device, latencies_ms=[4.0] * 10, power_mw=5000.0)
                           for device in ("nano-1", LONG_DEVICE) for seq in range(1, 6)])  # fmt: skip
        store.upsert_status(DeviceStatus("lab", "nano-1", "online", BUNDLE_A.id, None, "0.1.0", T0))
    return url


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """The real console script path through a pipe, as `edgekit fleet status | grep` runs it."""
    return subprocess.run([sys.executable, "-m", "edgekit.cli.main", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})  # fmt: skip


def test_status_piped_prints_the_whole_table_on_stdout(store_url: str) -> None:
    done = _cli("fleet", "status", "--store", store_url)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    rows = [line for line in done.stdout.splitlines() if "nano-1" in line or LONG_DEVICE in line]
    assert len(rows) == 2, done.stdout
    long_row = next(row for row in rows if LONG_DEVICE in row)  # the name whole, on one line with its numbers
    assert "minilm-int8-a" in long_row and "jetson-orin-nano-8gb" in long_row and "4.00" in long_row
    assert "…" not in done.stdout and "\x1b[" not in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) > 80


def test_status_and_report_say_when_numbers_come_from_simulated_devices(store_url: str) -> None:
    with open_store(store_url) as store:
        assert "SYNTHETIC" not in _cli("fleet", "status", "--store", store_url).stdout  # a real agent's device only
        store.upsert_status(DeviceStatus("lab", LONG_DEVICE, "online", BUNDLE_A.id, None, "sim-1", T0))
    for command in (("fleet", "status"), ("fleet", "report", "--since", SINCE)):
        done = _cli(*command, "--store", store_url)
        assert done.returncode == 0, done.stderr
        assert "; 1 simulated: their numbers are SYNTHETIC" in done.stdout.splitlines()[0], done.stdout


def test_status_csv(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "status", "--store", store_url, "--csv"]) == 0
    captured = capsys.readouterr()
    rows = {row["device"]: row for row in csv.DictReader(io.StringIO(captured.out))}
    assert sorted(rows) == sorted(["nano-1", LONG_DEVICE])
    # its agent said online, but its newest window is months old: offline after 10 silent intervals
    assert rows["nano-1"]["state"] == "offline" and rows["nano-1"]["bundle_id"] == BUNDLE_A.id
    assert float(rows["nano-1"]["p50_ms"]) == 4.0 and float(rows["nano-1"]["power_mean_mw"]) == pytest.approx(5000.0)
    assert rows[LONG_DEVICE]["target"] == "jetson-orin-nano-8gb" and rows[LONG_DEVICE]["windows"] == "5"
    assert rows[LONG_DEVICE]["last_seen"] == "2026-03-01T12:00:50Z"


def test_report_csv_has_one_row_per_bundle_and_target(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", "report", "--store", store_url, "--since", SINCE, "--csv"]) == 0
    (row,) = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert (row["bundle_id"], row["target"], row["devices"], row["windows"]) == (BUNDLE_A.id, "jetson-orin-nano-8gb", "2", "10")
    assert float(row["p50_ms"]) == 4.0 and row["first_window_start"] == "2026-03-01T12:00:00Z"


@pytest.mark.parametrize("command", [["fleet", "status"], ["fleet", "report"], ["fleet", "dashboard", "--port", "0"]])
def test_readers_refuse_a_missing_sqlite_store(command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    typo = tmp_path / "typo.db"
    url = f"sqlite:///{typo}"
    assert main([*command, "--store", url]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: fleet store {url} does not exist" in err and "only reads a store and does not create one" in err
    assert f"edgekit fleet collect --broker URL --store {url}" in err  # the command that creates it
    assert not typo.exists()  # nothing was created


def test_readers_refuse_a_missing_postgres_database(postgres_database: str, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    url = postgres_database.rsplit("/", 1)[0] + "/edgekit_no_such_database"
    for command in (["fleet", "status"], ["fleet", "dashboard", "--port", "0"]):
        assert main([*command, "--store", url]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"fleet store {url} does not exist" in err and 'database "edgekit_no_such_database" does not exist' in err
        assert "createdb edgekit_no_such_database" in err and f"edgekit fleet collect --broker URL --store {url}" in err


def test_readers_refuse_a_postgres_database_without_a_store(postgres_url: str, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    import psycopg

    assert main(["fleet", "report", "--store", postgres_url]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "does not exist: the database has no edgekit fleet tables" in err and "edgekit fleet collect" in err
    schema = postgres_url.rsplit("%3D", 1)[1]
    with psycopg.connect(postgres_url.split("?")[0], autocommit=True) as connection:  # the reader created no tables
        tables = connection.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (schema,)).fetchone()
    assert tables == (0,)
    with open_store(postgres_url):  # what `fleet collect` does first: create the store
        pass
    assert main(["fleet", "status", "--store", postgres_url, "--json"]) == 0
    assert capsys.readouterr().out.strip() == '{"devices": [], "simulated_devices": 0}'


def test_dashboard_prints_its_url_on_stdout(store_url: str) -> None:
    """A long-running command: its result (where to point a browser) is stdout's first line, at once."""
    import signal
    import urllib.request

    def sigint_as_a_terminal_sends_it() -> None:  # in the child, before exec: whatever this test process inherited
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # (an ignored or blocked SIGINT survives exec and would make
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # Ctrl-C do nothing: seen only in full runs)

    process = subprocess.Popen([sys.executable, "-m", "edgekit.cli.main", "fleet", "dashboard", "--store", store_url, "--port", "0"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_as_a_terminal_sends_it,
                               env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("dashboard on http://127.0.0.1:") and f"(store {store_url}); Ctrl-C to stop" in line, line
        url = line.split()[2]
        with urllib.request.urlopen(url + "api/devices" if url.endswith("/") else url + "/api/devices", timeout=10) as answer:
            assert answer.status == 200
    finally:
        process.send_signal(signal.SIGINT)
        try:
            _, err = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate(timeout=10)
            raise AssertionError(f"the dashboard did not stop within 30 s of Ctrl-C; its stderr:\n{err[-3000:]}") from None
    assert process.returncode == 0 and "stopping" in err  # the shutdown note is a log line: stderr
