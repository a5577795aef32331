"""Reads that met hostile data or options: a non-ASCII device search on SQLite, a device clock centuries ahead in
the charts, control characters and markup in names on the terminal, --since and --until far out of range. Real
stores (SQLite and PostgreSQL where the ``store`` fixture is parametrised) and the real CLI."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from edgekit.cli.main import main
from edgekit.fleet.dashboard.api import device_series, fleet_series
from edgekit.fleet.store import FleetStore, open_store
from edgekit_runtime.agent.telemetry import BundleRef
from tests.fleet.messages import window

NOW = dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.timezone.utc)


def test_the_device_search_folds_every_letter(store: FleetStore) -> None:
    store.add_windows([window(1, device="ÜBER-Gerät"), window(1, device="plain-1")])
    for query in ("über", "ÜBER", "gerät", "GERÄT"):  # SQLite's LOWER folds ASCII only: ÜBER found nothing
        page = store.device_page(q=query.lower())
        assert [s.device for s in page.devices] == ["ÜBER-Gerät"], query


def test_a_device_clock_centuries_ahead_does_not_stretch_the_charts(store: FleetStore) -> None:
    ahead = dt.datetime(2990, 1, 1, tzinfo=dt.timezone.utc)
    store.add_windows([window(seq, start=NOW - dt.timedelta(minutes=10) + dt.timedelta(seconds=10 * seq)) for seq in range(1, 6)]
                      + [window(1, device="clock-ahead", start=ahead)])  # fmt: skip
    fleet = fleet_series(store, hours=1, now=NOW)
    times = [t for group in fleet["groups"].values() for t in group["t"]]
    assert times and max(times) <= (NOW + dt.timedelta(minutes=5)).timestamp() * 1000  # was a point in 2990
    own = device_series(store, "lab", "clock-ahead", hours=1, now=NOW)
    assert own["series"]["t"] == [] and own["since"] <= own["until"]  # was since 2990 after until 2026


@pytest.fixture
def hostile_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)
    with open_store(url) as store:
        bundle = BundleRef(id="evil\x1b]0;pwned\x07\x1b[2J", sha256="c" * 64)
        store.add_windows([window(1, fleet="[red]fleet", device="dev-1", bundle=bundle, start=start)])
    return url


@pytest.mark.parametrize("command", [["fleet", "status"], ["fleet", "report", "--since", "1h"]])
def test_names_reach_the_terminal_as_text(hostile_store: str, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    assert main([*command, "--store", hostile_store]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out  # the escape sequences would clear the screen, retitle the window
    assert "\\x1b" in out and "\\x07" in out  # shown as text instead
    if command[1] == "status":
        assert "fleet [red]fleet: 1 device" in out  # the name, not red text


@pytest.mark.parametrize(("options", "message"), [
    (["--since", "1000000d"], "--since '1000000d' is outside 1970 to 2999"),
    (["--since", "99999999999999999999w"], "--since '99999999999999999999w' is outside 1970 to 2999"),
    (["--since", "9999-12-31T23:59:59Z"], "is outside 1970 to 2999"),
    (["--since", "1h", "--until", "garbage"], "--until 'garbage' is neither a duration nor a time"),
])  # fmt: skip
def test_since_and_until_out_of_range_are_refused(hostile_store: str, capsys: pytest.CaptureFixture[str],
                                                  options: list[str], message: str) -> None:  # fmt: skip
    assert main(["fleet", "report", "--store", hostile_store, *options]) == 2  # was a traceback (OverflowError)
    assert message in " ".join(capsys.readouterr().err.split())


def test_csv_cells_a_spreadsheet_would_run_start_with_an_apostrophe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with open_store(url) as store:
        store.add_windows([window(1, bundle=BundleRef(id='=HYPERLINK("http://x","y")', sha256="d" * 64),
                                  start=dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1))])  # fmt: skip
    assert main(["fleet", "status", "--store", url, "--csv"]) == 0
    out = capsys.readouterr().out
    assert "'=HYPERLINK" in out and ",=HYPERLINK" not in out and '"=HYPERLINK' not in out
