"""``edgekit fleet calibrate --store URL --bundles DIR``: fit the estimate's efficiency factors per target and
power mode from the fleet's telemetry of bundles whose graphs are known, and write the calibration file."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.cli.options import json_parent, print_json, results

if TYPE_CHECKING:
    from edgekit.estimate.fleet_fit import TargetCalibration


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
    parser.add_argument("--allow-synthetic", action="store_true",
                        help="fit even when the store holds simulated devices (`fleet simulate`: SYNTHETIC numbers); "
                             "the entries written say SYNTHETIC in their source, which estimates show")  # fmt: skip
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
        simulated = store.simulated_devices(args.fleet)  # as fleet status and report count them for their SYNTHETIC note
        if simulated and observations and not args.allow_synthetic:  # a bundle mismatch is said first (below)
            raise EstimateError(f"{redact(args.store)}{f' fleet {args.fleet}' if args.fleet else ''} has {simulated} simulated "
                                "device(s) (`edgekit fleet simulate`): their latency is SYNTHETIC, and the calibration "
                                "file is what later `edgekit estimate` runs read",
                                hint="calibrate from a store (or --fleet) of real devices, or pass --allow-synthetic to "
                                     "fit to simulated numbers anyway (the entries are marked SYNTHETIC)")  # fmt: skip
    if not observations:
        known = ", ".join(sorted({i for b in bundles for i in b.ids}))
        raise EstimateError(f"the store {redact(args.store)} has no telemetry of the bundles given ({known})",
                            hint="check the bundle ids in `edgekit fleet report --store URL` against the bundles' manifest names")  # fmt: skip
    fitted = calibrate(observations, out if out.is_file() else None)
    if simulated:
        fitted = [mark_synthetic(r, simulated) for r in fitted]
    write_calibration(out, [r.entry for r in fitted])
    note = f"; {simulated} simulated devices: SYNTHETIC" if simulated else ""
    table = Table(title=f"estimate calibration from {escape(redact(args.store))} (median |estimate - fleet p50| / fleet p50){note}")
    for column in ("target", "power mode", "bundles", "error before", "error after", "leave-one-out"):
        table.add_column(column, justify="left" if column in ("target", "power mode") else "right")
    for r in fitted:
        e = r.entry
        table.add_row(e.target, e.power_mode or "-", str(e.observations), f"{e.error_before_pct:.1f} %", f"{e.error_after_pct:.1f} %",
                      f"{r.loo_error_pct:.1f} %" if r.loo_error_pct is not None else "under 3 bundles")  # fmt: skip
    printer = results(args)
    printer.print(table)
    printer.print(f"wrote {out}; `edgekit estimate` reads it (--calibration {out})")
    if simulated:
        printer.print(f"[yellow]fitted to {simulated} simulated devices (--allow-synthetic): the factors are SYNTHETIC, "
                      "and every estimate that uses them says so in its factors' source[/]")  # fmt: skip
    if args.json:
        print_json({**report_json(fitted, out), "synthetic": bool(simulated), "simulated_devices": simulated})
    return 0


def mark_synthetic(result: TargetCalibration, simulated: int) -> TargetCalibration:
    """``result`` with ``SYNTHETIC`` leading its factors' source (written to the file, shown by every estimate using it)."""
    factors = result.entry.factors
    source = f"SYNTHETIC: fitted to a store with {simulated} simulated devices (--allow-synthetic); {factors.source}"
    return replace(result, entry=replace(result.entry, factors=replace(factors, source=source)))
