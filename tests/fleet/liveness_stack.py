"""The processes and readers of the liveness end-to-end test (tests/fleet/test_liveness_e2e.py).

Processes: ``edgekit fleet collect``, ``edgekit fleet dashboard`` and ``edgekit fleet simulate`` run as child
processes of the test (:class:`Child`), each with its output in a log file, so that ``kill -9`` and ``SIGSTOP``
hit real OS processes with real sockets.

Readers: each returns the liveness state of every device it shows, keyed ``fleet/device``, as one of the four
places an operator looks at:

* :func:`status_reading`: ``edgekit fleet status --json`` run as a subprocess;
* :func:`api_reading`: the dashboard's ``/api/overview`` counts and ``/api/devices`` rows;
* :func:`metrics_reading`: the collector's ``/metrics`` (``edgekit_fleet_devices`` summed per fleet and state)
  and ``/metrics/devices`` (``edgekit_device_state``);
* :func:`page_reading`: the dashboard page in a real headless Chromium (the state cards of the header and the
  table's rows, with the colour each state is drawn in).

:func:`wait_for_states` polls the four at once, each in its own thread, until each shows what is expected;
:func:`watch_stages` does the same for stages that follow each other (stale, then offline) without holding a fast
reader back for a slow one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fleet.prometheus_text import parse_exposition

EDGEKIT = Path(sys.executable).parent / "edgekit"
CHILD_ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}

#: Devices' states keyed ``fleet/device``.
States = dict[str, str]


class Child:
    """A command-line child process, its stdout and stderr in ``log``."""

    def __init__(self, name: str, argv: Sequence[object], log_dir: Path) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen([str(a) for a in argv], stdout=out, stderr=subprocess.STDOUT, env=CHILD_ENV)

    @property
    def pid(self) -> int:
        return self.process.pid

    def json_line(self, key: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """The first JSON object the child printed that has ``key`` (its ``--json`` announcement)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("{"):
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(record, dict) and key in record:
                        return record
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{self.name} printed no JSON line with {key!r} within {timeout_s} s (exit code "
                             f"{self.process.poll()}); its log:\n{self.tail()}")  # fmt: skip

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def kill9(self) -> int:
        """``kill -9``: the kernel closes the process's sockets (the broker sends the devices' last wills)."""
        self.signal(signal.SIGKILL)
        return self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM (a stopped process is continued first), then SIGKILL after 15 s."""
        if self.process.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=15)


def simulate(name: str, log_dir: Path, broker_url: str, fleet: str, devices: int, rate_per_s: float, targets: str) -> Child:
    """``edgekit fleet simulate``: ``devices`` simulated agents of ``fleet`` in one process, named ``<target>-<index>``
    (so processes given different ``targets`` share a fleet without sharing a name)."""
    return Child(name, [EDGEKIT, "fleet", "simulate", "--broker", broker_url, "--fleet", fleet, "--devices", devices,
                        "--rate", rate_per_s, "--targets", targets], log_dir)  # fmt: skip


# -- readers ------------------------------------------------------------------------------------------------------


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode("utf-8"))


@dataclass
class Reading:
    """What one reader showed: each device's state, and the counts per state it shows beside them (its header)."""

    states: States
    counts: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def status_reading(store_url: str, fleet: str) -> Reading:
    """``edgekit fleet status --json --store URL --fleet F`` (a subprocess): each device's state (it prints no counts)."""
    done = subprocess.run([str(EDGEKIT), "fleet", "status", "--json", "--store", store_url, "--fleet", fleet],
                          capture_output=True, text=True, timeout=60, env=CHILD_ENV)  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"fleet status --json failed ({done.returncode}): {done.stderr[-2000:]}")
    devices = json.loads(done.stdout.strip().splitlines()[-1])["devices"]
    return Reading({f"{d['fleet']}/{d['device']}": d["state"] for d in devices},
                   extra={"windows": {f"{d['fleet']}/{d['device']}": d["windows"] for d in devices},
                          "interval_s": {f"{d['fleet']}/{d['device']}": d["interval_s"] for d in devices}})  # fmt: skip


def api_reading(dashboard_url: str, fleet: str) -> Reading:
    """``/api/overview?fleet=F`` (counts per state) and ``/api/devices?fleet=F`` (the rows, one page of all)."""
    overview = _get_json(f"{dashboard_url}/api/overview?fleet={fleet}")
    page = _get_json(f"{dashboard_url}/api/devices?fleet={fleet}&limit=1000")
    return Reading({f"{d['fleet']}/{d['device']}": d["state"] for d in page["devices"]}, dict(overview["counts"]["states"]),
                   {"devices": overview["counts"]["devices"], "total": page["total"]})  # fmt: skip


def metrics_reading(metrics_url: str, fleet: str) -> Reading:
    """``/metrics``: ``edgekit_fleet_devices`` of ``fleet`` summed per state over bundles and targets (counts);
    ``/metrics/devices?fleet=F``: ``edgekit_device_state`` (states) and ``edgekit_device_online`` (extra: 1 where
    the device's last status message said online)."""
    counts: Counter[str] = Counter()
    for labels, value in parse_exposition(_get_text(metrics_url))["edgekit_fleet_devices"].samples:
        if labels["fleet"] == fleet:
            counts[labels["state"]] += int(value)
    base = metrics_url.rsplit("/metrics", 1)[0]
    families = parse_exposition(_get_text(f"{base}/metrics/devices?fleet={fleet}"))
    states = {f"{labels['fleet']}/{labels['device']}": labels["state"]
              for labels, value in families["edgekit_device_state"].samples if value == 1}  # fmt: skip
    status_online = {f"{labels['fleet']}/{labels['device']}": value
                     for labels, value in families["edgekit_device_online"].samples}  # fmt: skip
    return Reading(states, dict(counts), {"edgekit_device_online": status_online})


#: The page's state cards, its device count and each row's state with the colour of its state cell.
PAGE_STATES = """const cards = {};
document.querySelectorAll('#cards .state-card').forEach((c) => {
  cards[c.dataset.card] = Number(c.querySelector('b').textContent);
});
const rows = [...document.querySelectorAll('#devices tbody tr')].map((tr) => {
  const td = tr.querySelector('td.state');
  return [tr.dataset.fleet + '/' + tr.dataset.device, td.textContent, getComputedStyle(td).color];
});
const total = document.querySelector('#cards [data-card="devices"] b');
return {cards: cards, rows: rows, devices: total ? Number(total.textContent) : null,
        table_count: document.getElementById('device-count').textContent, error: document.body.dataset.error || null};"""


def page_reading(browser: Any, dashboard_url: str, fleet: str) -> Reading:
    """The dashboard page of ``fleet`` loaded afresh in headless Chromium (``browser``: a HeadlessChromium)."""
    browser.load(f"{dashboard_url}/#fleet={fleet}&range=0.25")
    shown = browser.driver.execute_script(PAGE_STATES)
    if shown["error"]:
        raise AssertionError(f"the dashboard page shows an error: {shown['error']}")
    colours: dict[str, set[str]] = {}
    for _, state, colour in shown["rows"]:
        colours.setdefault(state, set()).add(colour)
    return Reading({key: state for key, state, _ in shown["rows"]}, shown["cards"],
                   {"devices_card": shown["devices"], "table_count": shown["table_count"], "colours": colours})  # fmt: skip


# -- waiting for all four -----------------------------------------------------------------------------------------


@dataclass
class Seen:
    """When (seconds after the stage began) a reader first showed what was expected, and its last reading."""

    after_s: float | None = None
    read_s: float | None = None  # how long that successful read took (a subprocess, a page load)
    last: Reading | None = None
    error: str | None = None
    reads: int = 0


def wait_for_states(readers: Mapping[str, Callable[[], Reading]], check: Callable[[Reading], str | None], *, since: float,
                    deadline_s: float, poll_s: float = 0.3) -> dict[str, Seen]:  # fmt: skip
    """Poll every reader in its own thread until ``check(reading)`` is None (it returns what is wrong otherwise) or
    ``deadline_s`` after ``since`` (a time.monotonic(); a read begun before then still counts). Returns each
    reader's :class:`Seen`; raises AssertionError naming every reader that never showed the expected states, with
    what it showed last."""
    seen = {name: Seen() for name in readers}

    def poll(name: str, read: Callable[[], Reading]) -> None:
        entry = seen[name]
        while time.monotonic() < since + deadline_s:
            began = time.monotonic()
            try:
                entry.last = read()
                entry.reads += 1
                entry.error = check(entry.last)
            except Exception as exc:  # noqa: BLE001 (reported with the reader's name below)
                entry.error = f"{type(exc).__name__}: {exc}"
            if entry.error is None:
                entry.after_s = time.monotonic() - since
                entry.read_s = time.monotonic() - began
                return
            time.sleep(poll_s)

    threads = [threading.Thread(target=poll, args=item, name=f"liveness-{item[0]}", daemon=True) for item in readers.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=deadline_s + 90)
    missed = {name: entry for name, entry in seen.items() if entry.after_s is None}
    if missed:
        raise AssertionError("within %.1f s: %s" % (deadline_s, "; ".join(
            f"{name} ({entry.reads} reads): {entry.error}" for name, entry in missed.items())))  # fmt: skip
    return seen


@dataclass(frozen=True)
class Stage:
    """What every reader must show at some moment (``check`` returns None then, else what is wrong), in a reading
    begun before ``deadline_s``."""

    name: str
    check: Callable[[Reading], str | None]
    deadline_s: float


def watch_stages(readers: Mapping[str, Callable[[], Reading]], stages: Sequence[Stage], *, since: float,
                 poll_s: float = 0.3) -> dict[str, dict[str, Seen]]:  # fmt: skip
    """Like :func:`wait_for_states` for several stages that follow each other while the readers keep reading: each
    reader polls without a barrier between stages (a slow reader, e.g. a subprocess taking seconds, is never held
    back by the others), and each reading is checked against every stage that reader has not seen yet. Returns
    ``{stage: {reader: Seen}}``; raises AssertionError naming each stage a reader never showed."""
    seen = {stage.name: {name: Seen() for name in readers} for stage in stages}

    def poll(name: str, read: Callable[[], Reading]) -> None:
        while True:
            began = time.monotonic()
            pending = [stage for stage in stages if seen[stage.name][name].after_s is None and began < since + stage.deadline_s]
            if not pending:
                return
            try:
                reading, error = read(), None
            except Exception as exc:  # noqa: BLE001 (reported with the reader's name below)
                reading, error = None, f"{type(exc).__name__}: {exc}"
            ended = time.monotonic()
            for stage in pending:
                entry = seen[stage.name][name]
                entry.reads += 1
                entry.error = error if reading is None else stage.check(reading)
                if reading is not None:
                    entry.last = reading
                if entry.error is None:
                    entry.after_s, entry.read_s = ended - since, ended - began
            time.sleep(poll_s)

    threads = [threading.Thread(target=poll, args=item, name=f"liveness-{item[0]}", daemon=True) for item in readers.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(stage.deadline_s for stage in stages) + 90)
    missed = [f"{stage.name} within {stage.deadline_s:.0f} s: {name} ({entry.reads} reads): {entry.error}"
              for stage in stages for name, entry in seen[stage.name].items() if entry.after_s is None]  # fmt: skip
    if missed:
        raise AssertionError("; ".join(missed))
    return seen


def states_check(expected: Mapping[str, str | tuple[str, ...]]) -> Callable[[Reading], str | None]:
    """A check for :func:`wait_for_states`: every device of ``expected`` in its state (or one of a tuple of states)
    and no other device shown; where every expected state is a single one, the reader's counts per state (when it
    shows counts) must equal those of ``expected`` too."""
    exact = all(isinstance(state, str) for state in expected.values())
    wanted_counts = dict(Counter(expected.values())) if exact else None

    def allowed(key: str, state: str | None) -> bool:
        want = expected[key]
        return state == want if isinstance(want, str) else state in want

    def check(reading: Reading) -> str | None:
        wrong = {key: reading.states.get(key) for key in expected if not allowed(key, reading.states.get(key))}
        extra = sorted(set(reading.states) - set(expected))
        if wrong or extra:
            shown = dict(Counter(reading.states.values()))
            return (f"{len(wrong)} devices not as expected, e.g. {dict(list(wrong.items())[:3])} (states shown: {shown})"
                    + (f", unexpected devices {extra[:4]}" if extra else ""))  # fmt: skip
        if reading.counts and wanted_counts is not None:
            shown_counts = {state: n for state, n in reading.counts.items() if n}
            if shown_counts != wanted_counts:
                return f"counts {shown_counts}, expected {wanted_counts}"
        return None

    return check


__all__ = ["CHILD_ENV", "EDGEKIT", "Child", "Reading", "Seen", "Stage", "api_reading", "metrics_reading", "page_reading",
           "simulate",
           "states_check", "status_reading", "wait_for_states", "watch_stages"]
