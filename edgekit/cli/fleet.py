"""``edgekit fleet``: the fleet command group, and its ``status`` and ``report`` commands.

``collect`` lives in :mod:`edgekit.cli.fleet_collect`; other fleet commands live in their own modules (:data:`FLEET_SUBCOMMAND_MODULES`), each exposing
``register(fleet_subparsers)``; code outside edgekit can add one with :func:`register_subcommand`.
Tables go to stdout (full width when piped), progress to stderr; ``--json`` prints one JSON document as the last
line of stdout and ``--csv`` (status, report) the table as CSV.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import logging
import re
import sys
from typing import Any, Callable, Iterable, Sequence

from rich.markup import escape as escape_markup
from rich.table import Table

from edgekit.cli import fleet_collect
from edgekit.cli.fleet_options import store_option
from edgekit.cli.options import console, print_csv, print_json, results, table_output_parent
from edgekit.fleet.liveness import STATES
from edgekit.fleet.store.urls import redact

#: Modules that each add fleet subcommands with ``register(fleet_subparsers)``, in ``--help`` order.
FLEET_SUBCOMMAND_MODULES = (
    "edgekit.cli.fleet_up",
    "edgekit.cli.fleet_simulate",
    "edgekit.cli.fleet_dashboard",
    "edgekit.cli.fleet_deploy",
    "edgekit.cli.fleet_calibrate",
)
#: When False, a module of FLEET_SUBCOMMAND_MODULES that does not exist yet is skipped (while it is written).
REQUIRE_ALL_SUBCOMMAND_MODULES = True

RegisterFn = Callable[[argparse._SubParsersAction], None]
_EXTRA_SUBCOMMANDS: dict[str, RegisterFn] = {}
logger = logging.getLogger(__name__)


def register_subcommand(name: str, register_fn: RegisterFn) -> None:
    """Add ``edgekit fleet NAME``: ``register_fn(fleet_subparsers)`` is called when the parser is built."""
    _EXTRA_SUBCOMMANDS[name] = register_fn


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("fleet", help="collect, watch and roll out to a fleet of devices",
                                   description="Fleet telemetry: collect it from the agents over MQTT, show status "
                                               "and reports, serve a dashboard, deploy bundles.")  # fmt: skip
    fleet_subparsers = parser.add_subparsers(dest="fleet_command", metavar="COMMAND", required=True)
    fleet_collect.register(fleet_subparsers)
    _register_status(fleet_subparsers)
    _register_report(fleet_subparsers)
    for module_name in FLEET_SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if REQUIRE_ALL_SUBCOMMAND_MODULES or exc.name != module_name:
                raise
            logger.debug("fleet subcommand module %s is not there yet", module_name)
            continue
        module.register(fleet_subparsers)
    for register_fn in _EXTRA_SUBCOMMANDS.values():
        register_fn(fleet_subparsers)


# -- status -------------------------------------------------------------------------------------

#: ``fleet status --csv`` and ``fleet report --csv``: the JSON fields of a row, raw (times ISO 8601, UTC).
STATUS_CSV_COLUMNS = ("fleet", "device", "state", "bundle_id", "target", "p50_ms", "p99_ms", "power_mean_mw",
                      "energy_per_inference_mj", "temperature_max_c", "last_seen", "windows", "missing_seqs")
REPORT_CSV_COLUMNS = ("bundle_id", "target", "power_mode", "devices", "windows", "inferences", "errors", "p50_ms",
                      "p99_ms", "p99_max_ms", "power_mean_mw", "energy_mj", "energy_per_inference_mj", "temperature_max_c",
                      "first_window_start", "last_window_end")
#: ``--by-model`` (issue 20): ``fleet report`` per model and bundle, ``fleet status`` per device and model.
MODEL_CSV_COLUMNS = ("model", "bundle_id", "devices", "windows", "inferences", "errors", "p50_ms", "p99_ms", "p99_max_ms",
                     "throughput_per_s", "memory_mb_max", "first_window_start", "last_window_end")
STATUS_MODEL_CSV_COLUMNS = ("fleet", "device") + MODEL_CSV_COLUMNS[:2] + MODEL_CSV_COLUMNS[3:]


def _register_status(fleet_subparsers: argparse._SubParsersAction) -> None:
    parser = fleet_subparsers.add_parser("status", parents=[table_output_parent()], help="devices: online, bundle, latency, power",
                                         description="One line per device: online, bundle, p50/p99 of its newest "
                                                     "window, power, energy per inference, temperature, last seen.")  # fmt: skip
    store_option(parser)
    parser.add_argument("--fleet", metavar="F", help="only this fleet")
    parser.add_argument("--by-model", action="store_true",
                        help="one line per device and model it serves (agents serving several), over --since: the "
                             "mean of its windows' p50 and p99, inferences per second")  # fmt: skip
    parser.add_argument("--model", metavar="NAME", help="with --by-model: only this model")
    parser.add_argument("--since", default="1h", metavar="WHEN", help="with --by-model: from a duration ago (default 1h)")
    parser.add_argument("--state", choices=STATES, help="only devices in this state (stale: 3 silent telemetry "
                                                        "intervals, offline: 10 or a last will)")  # fmt: skip
    parser.add_argument("--limit", type=int, default=DEFAULT_STATUS_ROWS, metavar="N",
                        help=f"the table shows the N worst devices (offline, stale, then highest p99; with --by-model "
                             f"the N device and model rows of highest mean p99; default {DEFAULT_STATUS_ROWS}, 0 for "
                             f"all); --json and --csv list every row")  # fmt: skip
    parser.set_defaults(func=run_status)


#: Rows ``fleet status`` prints as a table by default: a 10,000-device table is read by no one.
DEFAULT_STATUS_ROWS = 100



def simulated_note(store: Any, fleet: str | None) -> str:
    """``; N simulated: numbers are SYNTHETIC`` when devices of ``fleet`` (all fleets: None) last reported a
    simulator's agent version (``edgekit fleet simulate``, ``fleet up --simulate``), else ``""``: a table's title
    says so, as the simulator's own output does, so made-up latency and power are never read as measured."""
    return synthetic_note(store.simulated_devices(fleet))


def synthetic_note(simulated_devices: int) -> str:
    """:func:`simulated_note` from a count already read."""
    return f"; {simulated_devices} simulated: their numbers are SYNTHETIC" if simulated_devices else ""


#: How the status table colours each liveness state (the dashboard uses the same colours).
STATE_STYLES = {"online": "[green]online[/]", "stale": "[yellow]stale[/]", "offline": "[red]offline[/]",
                "unknown": "[dim]unknown[/]"}  # fmt: skip


def run_status(args: argparse.Namespace) -> int:
    from edgekit.fleet.report import check_filter_values
    from edgekit.fleet.store import open_store

    if not 0 <= args.limit <= 2**62:
        from edgekit.fleet.errors import FleetError

        raise FleetError(f"--limit must be a whole number from 0 to 2**62, got {args.limit}", hint="0 shows every device")
    if args.by_model:
        return _run_status_by_model(args)
    if args.json or args.csv:
        return _print_every_device(args)
    from edgekit.fleet.store.device_reads import STATUS_RANKS

    now = dt.datetime.now(dt.timezone.utc)
    with open_store(args.store, must_exist=True) as store:  # counted, sorted and cut in the store: the table is a page
        counts = store.device_counts(args.fleet, now=now)
        if not counts.devices:
            check_filter_values(store, {"--fleet": ("fleet", args.fleet)})
            console.print(f"no devices in {escape(redact(args.store))}" + (f" for fleet {escape(args.fleet)}" if args.fleet else ""))
            return 0
        found = store.device_page(args.fleet, states=[args.state] if args.state else (), worst_ranks=STATUS_RANKS,
                                  limit=args.limit or None, now=now)  # fmt: skip
        fleets = [args.fleet] if args.fleet else counts.fleets([args.state] if args.state else ())
        simulated = simulated_note(store, args.fleet)
    summaries, total = found.devices, found.total
    tally = ", ".join(f"{count} {state}" for state, count in counts.states.items() if count or state in ("online", "stale", "offline"))
    if not total:  # devices, but none in --state
        console.print(f"no {args.state} devices ({tally})" + (f" in fleet {escape(args.fleet)}" if args.fleet else ""))
        return 0
    shown = f"; the {len(summaries)} worst shown (--limit 0 for all)" if len(summaries) < total else ""
    title = (f"fleet {fleets[0] if len(fleets) == 1 else 'status'}: {total} device{'' if total == 1 else 's'}"
             f"{' ' + args.state if args.state else ''} ({tally}){shown}{simulated}")  # fmt: skip
    columns = ("device", "state", "bundle", "target", "p50 ms", "p99 ms", "power W", "mJ/inf", "temp °C", "last seen",
               "windows", "gaps")  # fmt: skip
    rows = [(s.device if len(fleets) == 1 else f"{s.fleet}/{s.device}", s.state, s.bundle_id or "-", s.target or "-",
             _latency(s, s.p50_ms), _latency(s, s.p99_ms), _num(None if s.power_mean_mw is None else s.power_mean_mw / 1000, 2),
             _num(s.energy_per_inference_mj, 2), _num(s.temperature_max_c, 1), _ago(s.last_seen, now), str(s.windows),
             str(s.missing_seqs))
            for s in summaries]  # fmt: skip
    if len(rows) > RICH_TABLE_ROWS:  # a boxed table of thousands of rows takes rich half a minute: plain columns
        print_plain_table(title, columns, rows, left=4)
        return 0
    table = Table(title=escape(title))
    for column in columns:
        left = column in ("device", "state", "bundle", "target")
        table.add_column(column, justify="left" if left else "right", no_wrap=column == "device")
    for row in rows:
        table.add_row(escape(row[0]), STATE_STYLES.get(row[1], f"[dim]{escape(row[1])}[/]"), *map(escape, row[2:]))
    results(args).print(table)
    return 0


def _print_every_device(args: argparse.Namespace) -> int:
    """``fleet status --json|--csv``: every device (of ``--state``), straight from the store's rows (no per-device object)."""
    from edgekit.fleet.report import check_filter_values
    from edgekit.fleet.store import open_store
    from edgekit.fleet.store.device_reads import DEVICE_ROW_FIELDS

    with open_store(args.store, must_exist=True) as store:
        rows = list(store.device_rows(args.fleet, states=[args.state] if args.state else ()))
        if not rows:
            check_filter_values(store, {"--fleet": ("fleet", args.fleet)})
        simulated = store.simulated_devices(args.fleet)
    if args.json:
        print_json({"devices": [dict(zip(DEVICE_ROW_FIELDS, row)) for row in rows], "simulated_devices": simulated})
    else:
        columns = [DEVICE_ROW_FIELDS.index(column) for column in STATUS_CSV_COLUMNS]
        print_visible_csv(STATUS_CSV_COLUMNS, ([row[index] for index in columns] for row in rows))
    return 0


#: Above this many rows ``fleet status`` prints plain aligned columns instead of a rich table.

_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _visible(text: str) -> str:
    """``text`` with control characters (ESC, BEL, ...: a device's bundle id may hold them) written as ``\\x..``
    escapes, so that printing it cannot move the cursor or retitle the terminal."""
    return _CONTROL_CHARACTERS.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def escape(text: str) -> str:
    """``text`` for a rich console: control characters made visible, markup escaped."""
    return escape_markup(_visible(text))


def print_visible_csv(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """:func:`print_csv` with control characters of text cells written as ``\\x..`` escapes (as the tables show them),
    so that ``--csv`` to a terminal cannot move the cursor or retitle it; other text and numbers are unchanged."""
    print_csv(columns, ([_visible(cell) if isinstance(cell, str) else cell for cell in row] for row in rows))


RICH_TABLE_ROWS = 500


def print_plain_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], *, left: int) -> None:
    """``rows`` under ``columns`` in aligned plain text (the first ``left`` columns left-aligned, the rest right)."""
    title, rows = _visible(title), [[_visible(cell) for cell in row] for row in rows]
    widths = [max([len(column)] + [len(row[index]) for row in rows]) for index, column in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(width) if index < left else cell.rjust(width)
                         for index, (cell, width) in enumerate(zip(cells, widths))).rstrip()  # fmt: skip

    sys.stdout.write("\n".join([title, line(columns), *(line(row) for row in rows)]) + "\n")


def _run_status_by_model(args: argparse.Namespace) -> int:
    from edgekit.fleet.report import check_filter_values, model_aggregate_to_json, model_rows, parse_since
    from edgekit.fleet.store import open_store

    since = parse_since(args.since)
    with open_store(args.store, must_exist=True) as store:
        rows = model_rows(store, per_device=True, fleet=args.fleet, model=args.model, since=since)
        if not rows:
            check_filter_values(store, {"--fleet": ("fleet", args.fleet), "--model": ("model", args.model)})
        simulated = store.simulated_devices(args.fleet)
    if args.json:
        print_json({"since": since.isoformat().replace("+00:00", "Z"), "models": [model_aggregate_to_json(r) for r in rows],
                    "simulated_devices": simulated})  # fmt: skip
        return 0
    if args.csv:
        found = [model_aggregate_to_json(r) for r in rows]
        print_visible_csv(STATUS_MODEL_CSV_COLUMNS, ([row[column] for column in STATUS_MODEL_CSV_COLUMNS] for row in found))
        return 0
    if not rows:
        console.print(f"no telemetry in {escape(redact(args.store))} since {since:%Y-%m-%d %H:%M} UTC")
        return 0
    fleets = sorted({r.fleet or "" for r in rows})
    worst = sorted(rows, key=_worst_model_row)[:args.limit or None]  # the table is a page, as plain status's is
    shown = f"; the {len(worst)} worst (highest mean p99) shown (--limit 0 for all)" if len(worst) < len(rows) else ""
    title = (f"by device and model since {since:%Y-%m-%d %H:%M} UTC: {len(rows)} row{'' if len(rows) == 1 else 's'}"
             f"{shown}{synthetic_note(simulated)}")  # fmt: skip
    columns = ("device", "model", "bundle", "windows", "inferences", "errors", "mean p50 ms", "mean p99 ms", "inf/s", "MB")
    table_rows = [((r.device if len(fleets) == 1 else f"{r.fleet}/{r.device}") or "-", r.model or "-", r.bundle_id or "-",
                   str(r.windows), str(r.inferences), str(r.errors), _num(r.p50_ms, 2), _num(r.p99_ms, 2),
                   _num(r.throughput_per_s, 2), _num(r.memory_mb_max, 0))
                  for r in worst]  # fmt: skip
    if len(table_rows) > RICH_TABLE_ROWS:  # as plain status: a boxed table of thousands of rows takes rich seconds
        print_plain_table(title, columns, table_rows, left=3)
        return 0
    table = Table(title=escape(title))
    for column in columns:
        table.add_column(column, justify="left" if column in ("device", "model", "bundle") else "right")
    for row in table_rows:
        table.add_row(*map(escape, row))
    results(args).print(table)
    return 0


def _worst_model_row(row: Any) -> tuple[Any, ...]:
    """Sort key of ``status --by-model``'s table: highest mean p99 first (rows without latency last), then most
    errors; ties in name order, so that a --limit page is the same on every run."""
    return (row.p99_ms is None, -(row.p99_ms or 0.0), -row.errors, row.fleet or "", row.device or "", row.model or "",
            row.bundle_id or "")


def _model_table(rows: Any, title: str) -> Table:
    table = Table(title=escape(title))
    for column in ("model", "bundle", "devices", "windows", "inferences", "errors", "mean p50 ms", "mean p99 ms", "max p99 ms",
                   "inf/s per device", "MB"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("model", "bundle") else "right")
    for g in rows:
        table.add_row(escape(g.model or "-"), escape(g.bundle_id or "-"), str(g.devices), str(g.windows), str(g.inferences),
                      str(g.errors), _num(g.p50_ms, 2), _num(g.p99_ms, 2), _num(g.p99_max_ms, 2),
                      _num(g.throughput_per_s, 2), _num(g.memory_mb_max, 0))  # fmt: skip
    return table


# -- report -------------------------------------------------------------------------------------


def _register_report(fleet_subparsers: argparse._SubParsersAction) -> None:
    parser = fleet_subparsers.add_parser("report", parents=[table_output_parent()], help="aggregates by bundle and target; "
                                         "before/after of rollouts",
                                         description="Latency, power and energy per bundle and target over a time "
                                                     "range, and for every set of devices that switched bundle, their "
                                                     "figures before and after the switch. Latency is the mean of the "
                                                     "windows' p50 and p99 (weighted by inferences), with the worst "
                                                     "window's p99; inf/s is per device. --csv prints the "
                                                     "by-bundle-and-target table; --json has the rollouts too.")  # fmt: skip
    store_option(parser)
    parser.add_argument("--fleet", metavar="F", help="only this fleet")
    parser.add_argument("--bundle", metavar="ID", help="only this bundle (and rollouts from or to it)")
    parser.add_argument("--target", metavar="NAME", help="only devices of this target")
    parser.add_argument("--since", default="24h", metavar="WHEN",
                        help="start: a duration ago (24h, 30m, 7d) or an ISO time (default 24h)")
    parser.add_argument("--until", metavar="WHEN", help="end: a duration ago or an ISO time (default now)")
    parser.add_argument("--model", metavar="NAME", help="the by-model table: only this model")
    parser.add_argument("--by-model", action="store_true",
                        help="only the by-model-and-bundle table (--csv prints it instead of the by-bundle one)")
    parser.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from edgekit.fleet.report import aggregate_to_json, build_report, check_filter_values, parse_since
    from edgekit.fleet.store import open_store

    now = dt.datetime.now(dt.timezone.utc)
    since = parse_since(args.since, now)
    until = parse_since(args.until, now, "--until") if args.until else None
    with open_store(args.store, must_exist=True) as store:
        report = build_report(store, fleet=args.fleet, bundle_id=args.bundle, target=args.target, since=since, until=until,
                              model=args.model)  # fmt: skip
        if not (report.groups or report.rollouts or report.rollout_records):
            check_filter_values(store, {"--fleet": ("fleet", args.fleet), "--bundle": ("bundle_id", args.bundle),
                                        "--target": ("target", args.target)})  # fmt: skip
        if not report.models:
            check_filter_values(store, {"--model": ("model", args.model)})
        simulated_count = store.simulated_devices(args.fleet)
    simulated = synthetic_note(simulated_count)
    if args.json:
        print_json({**report.to_json(), "simulated_devices": simulated_count})
        return 0
    if args.by_model:
        return _print_models(args, report, since, simulated)
    if args.csv:
        rows = [aggregate_to_json(group) for group in report.groups]
        print_visible_csv(REPORT_CSV_COLUMNS, ([row[column] for column in REPORT_CSV_COLUMNS] for row in rows))
        return 0
    if report.rollout_records:  # what `edgekit fleet deploy` recorded: waves, failed devices and their reasons
        from edgekit.cli.fleet_deploy import print_record

        results(args).print(f"[bold]fleet deploy rollouts since {since:%Y-%m-%d %H:%M} UTC[/]")
        for record in report.rollout_records:
            print_record(record, results(args))
    if not report.groups:
        console.print(f"no telemetry in {escape(redact(args.store))} since {since:%Y-%m-%d %H:%M} UTC")
        return 0
    tally = ", ".join(f"{count} {state}" for state, count in report.device_states.items() if count or state in ("online", "stale", "offline"))
    table = Table(title=f"by bundle, target and power mode since {since:%Y-%m-%d %H:%M} UTC; devices now: {tally}{simulated}")
    for column in ("bundle", "target", "power mode", "devices", "windows", "inferences", "errors", "mean p50 ms",
                   "mean p99 ms", "max p99 ms", "power W", "mJ/inf", "max °C"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("bundle", "target", "power mode") else "right")
    for g in report.groups:
        table.add_row(escape(g.bundle_id or "-"), escape(g.target or "-"), escape(g.power_mode or "-"), str(g.devices),
                      str(g.windows), str(g.inferences), str(g.errors), _num(g.p50_ms, 2), _num(g.p99_ms, 2),
                      _num(g.p99_max_ms, 2), _num(None if g.power_mean_mw is None else g.power_mean_mw / 1000, 2), _num(g.energy_per_inference_mj, 2), _num(g.temperature_max_c, 1))  # fmt: skip
    out = results(args)
    out.print(table)
    if any(group.model is not None for group in report.models):  # agents serving a model repository
        out.print(_model_table(report.models, f"by model and bundle since {since:%Y-%m-%d %H:%M} UTC{simulated}"))
    for rollout in report.rollouts:
        out.print(f"\n[bold]rollout {escape(rollout.from_bundle)} -> {escape(rollout.to_bundle)} on "
                  f"{escape(rollout.target or 'unknown target')}: {len(rollout.devices)} devices[/]", soft_wrap=True)
        out.print(_rollout_table(rollout))
    return 0


def _print_models(args: argparse.Namespace, report: Any, since: dt.datetime, simulated: str) -> int:
    from edgekit.fleet.report import model_aggregate_to_json

    if args.csv:
        rows = [model_aggregate_to_json(group) for group in report.models]
        print_visible_csv(MODEL_CSV_COLUMNS, ([row[column] for column in MODEL_CSV_COLUMNS] for row in rows))
        return 0
    if not report.models:
        console.print(f"no telemetry in {escape(redact(args.store))} since {since:%Y-%m-%d %H:%M} UTC")
        return 0
    results(args).print(_model_table(report.models, f"by model and bundle since {since:%Y-%m-%d %H:%M} UTC{simulated}"))
    return 0


def _rollout_table(rollout: Any) -> Table:
    from edgekit.fleet.report import COMPARED_FIGURES

    table = Table()
    for column in ("figure", "before", "after", "change"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for figure in COMPARED_FIGURES:
        before = getattr(rollout.before, figure) if rollout.before else None
        after = getattr(rollout.after, figure) if rollout.after else None
        _, relative = rollout.change(figure)
        table.add_row(figure, _num(before, 2), _num(after, 2), "-" if relative is None else f"{relative:+.1%}")
    return table


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _latency(summary: Any, value: float | None) -> str:
    """A device's p50/p99: ``idle`` for an online device whose newest window had no inference (no latency to
    show, but not missing telemetry either), ``-`` for one never heard from."""
    if value is None and summary.state == "online" and summary.windows > 0:
        return "idle"
    return _num(value, 2)


def _ago(moment: dt.datetime | None, now: dt.datetime) -> str:
    if moment is None:
        return "never"
    seconds = max((now - moment).total_seconds(), 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


__all__ = ["FLEET_SUBCOMMAND_MODULES", "REQUIRE_ALL_SUBCOMMAND_MODULES", "register", "register_subcommand"]
