"""``edgekit fleet calibrate --store URL --bundles DIR``: fit the estimate's efficiency factors per target and
power mode from the fleet's telemetry of bundles whose graphs are known, and write the calibration file."""

from __future__ import annotations

import argparse
from pathlib import Path

from edgekit.cli.options import json_parent, print_json, results


def register(fleet_subparsers: argparse._SubParsersAction) -> None:
    parser = fleet_subparsers.add_parser("calibrate", parents=[json_parent()], help="fit `edgekit estimate` factors to fleet telemetry",
                                         description="Fit the efficiency factors of `edgekit estimate` per target and power mode "
                                                     "from the store's latency of bundles whose graphs you point at (--bundles), "
                                                     "write them to a calibration file that later estimates read, and report the "
                                                     "estimate's median error before and after.")  # fmt: skip
    parser.add_argument("--store", required=True, metavar="URL", help="sqlite:///fleet.db or postgresql://...")
    parser.add_argument("--bundles", required=True, action="append", type=Path, metavar="DIR",
                        help="a bundle directory or a folder of them (repeatable); matched to the store's bundle ids by manifest name or folder name")  # fmt: skip
    parser.add_argument("--out", type=Path, metavar="FILE", help="calibration file to write or update (default: $EDGEKIT_CACHE_DIR/estimate-calibration.json)")
    parser.add_argument("--fleet", metavar="NAME", help="only this fleet's telemetry")
    parser.add_argument("--since", metavar="WHEN", help="only telemetry since, e.g. 24h, 7d or an ISO-8601 time")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from edgekit.estimate.calibration import default_calibration_path, write_calibration
    from edgekit.estimate.fleet_fit import calibrate, find_bundles, observations_from_store, report_json
    from edgekit.estimate.graph_cost import EstimateError
    from edgekit.fleet.report import check_filter_values, parse_since
    from edgekit.fleet.store import open_store
    from edgekit.fleet.store.urls import redact

    bundles = find_bundles(args.bundles)
    out = args.out or default_calibration_path()
    with open_store(args.store, must_exist=True) as store:
        observations = observations_from_store(store, bundles, fleet=args.fleet, since=parse_since(args.since) if args.since else None)
        if not observations:
            check_filter_values(store, {"--fleet": ("fleet", args.fleet)})
    if not observations:
        known = ", ".join(sorted({i for b in bundles for i in b.ids}))
        raise EstimateError(f"the store {redact(args.store)} has no telemetry of the bundles given ({known})",
                            hint="check the bundle ids in `edgekit fleet report --store URL` against the bundles' manifest names")  # fmt: skip
    fitted = calibrate(observations, out if out.is_file() else None)
    write_calibration(out, [r.entry for r in fitted])
    table = Table(title=f"estimate calibration from {escape(redact(args.store))} (median |estimate - fleet p50| / fleet p50)")
    for column in ("target", "power mode", "bundles", "error before", "error after", "leave-one-out"):
        table.add_column(column, justify="left" if column in ("target", "power mode") else "right")
    for r in fitted:
        e = r.entry
        table.add_row(e.target, e.power_mode or "-", str(e.observations), f"{e.error_before_pct:.1f} %", f"{e.error_after_pct:.1f} %",
                      f"{r.loo_error_pct:.1f} %" if r.loo_error_pct is not None else "under 3 bundles")  # fmt: skip
    printer = results(args)
    printer.print(table)
    printer.print(f"wrote {out}; `edgekit estimate` reads it (--calibration {out})")
    if args.json:
        print_json(report_json(fitted, out))
    return 0
