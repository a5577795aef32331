"""``edgekit fleet simulate --history 24h --devices N --store URL``: seed synthetic history into a store.

The options are added to ``fleet simulate`` by :func:`add_history_options`; with ``--history`` the
command writes windows straight into the store (:func:`edgekit.fleet.sim.seed.seed_history`, the
collector's write path) instead of connecting devices to a broker.
"""

from __future__ import annotations

import argparse
import datetime as dt

from edgekit.cli.fleet_options import finite_number
from edgekit.cli.options import console, print_json, results

#: Windows per device beyond which the command says how long it may take before it starts.
_LONG_HISTORY_WINDOWS = 10_000_000


def add_history_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("synthetic history (instead of live devices)")
    group.add_argument("--history", metavar="DURATION",
                       help="write DURATION (e.g. 24h, 7d) of windows for --devices straight into --store and exit; "
                            "no broker needed")  # fmt: skip
    group.add_argument("--window-s", type=finite_number, default=10.0, metavar="S",
                       help="window length of --history (default 10, like the agent; 60 or 300 for long histories)")  # fmt: skip
    group.add_argument("--upgrade-to", default="demo-v2", metavar="ID",
                       help="with --history, every device switches to this bundle 70%% of the way through ('' for none)")  # fmt: skip


def history_hours(text: str) -> float:
    """``24h``, ``7d``, ``90m`` -> hours (the durations ``--since`` takes; errors name ``--history``)."""
    import datetime as dt

    from edgekit.fleet.report import parse_since

    now = dt.datetime.now(dt.timezone.utc)
    return (now - parse_since(text, now, "--history")).total_seconds() / 3600.0


def _iso(moment: dt.datetime) -> str:
    """ISO 8601 in UTC with ``Z``, as every fleet JSON document writes times."""
    return moment.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def run_history(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from edgekit.cli.fleet_simulate_behaviour import parse_behaviour
    from edgekit.fleet.sim.profiles import DEFAULT_TARGETS
    from edgekit.fleet.sim.seed import SeedError, check_seed_request, seed_history
    from edgekit.fleet.store import open_store
    from edgekit.fleet.store.urls import redact
    from edgekit.progress import RichStageReporter

    if not args.store:
        raise SeedError("--history needs --store: the store the windows are written to",
                        hint="e.g. --store sqlite:///fleet.db or --store postgresql://postgres@127.0.0.1/fleet")  # fmt: skip
    hours = history_hours(args.history)
    per_device = check_seed_request(args.devices, hours, args.window_s)
    total = per_device * args.devices
    behaviours = dict(parse_behaviour(text) for text in args.bundle_behaviour)
    targets = args.targets or DEFAULT_TARGETS
    bundles = tuple(b for b in (args.bundle, args.upgrade_to) if b)
    console.print(f"seeding {args.history} of {args.window_s:g} s windows for [bold]{args.devices:,}[/] devices "
                  f"(fleet {args.fleet}) = {total:,} windows into {escape(redact(args.store))}; numbers are SYNTHETIC")  # fmt: skip
    if total > _LONG_HISTORY_WINDOWS:
        console.print(f"  [yellow]{total:,} windows is long work (about 10,000 windows/s into SQLite, 5,000 into PostgreSQL "
                      f"on a 2-core host); --window-s 60 or 300 writes fewer[/]")  # fmt: skip
    reporter = RichStageReporter(console)
    with open_store(args.store) as store, reporter.stage("seed", f"{total:,} windows"):
        summary = seed_history(store, fleet=args.fleet, devices=args.devices, hours=hours, window_s=args.window_s,
                               targets=targets, bundles=bundles, upgrade_at=0.7 if len(bundles) > 1 else None,
                               behaviours=behaviours, seed=args.seed, progress=reporter)  # type: ignore[arg-type]  # fmt: skip
    results(args).print(f"seeded {summary.windows:,} windows for {summary.devices:,} devices in {summary.seconds:.1f} s "
                        f"({summary.windows_per_s:,.0f} windows/s), {summary.first_window_start:%Y-%m-%d %H:%M} to "
                        f"{summary.last_window_end:%Y-%m-%d %H:%M} UTC", soft_wrap=True)  # fmt: skip
    if args.json:
        print_json({"devices": summary.devices, "windows": summary.windows, "seconds": round(summary.seconds, 3),
                    "windows_per_s": round(summary.windows_per_s, 1), "window_s": args.window_s,
                    "first_window_start": _iso(summary.first_window_start), "last_window_end": _iso(summary.last_window_end),
                    "store": redact(args.store), "synthetic": True})  # fmt: skip
    return 0
