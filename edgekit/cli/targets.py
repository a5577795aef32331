"""``edgekit targets``: list the shipped target profiles, or show one in full.

``edgekit targets`` prints a table on stdout (full width when piped); ``--json`` prints a JSON list with
every profile's full fields, ``--csv`` the table's columns as CSV. ``edgekit targets show NAME`` prints one
profile (a name or a ``.yaml`` path).
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from edgekit.cli import options
from edgekit.precision import Precision
from edgekit.target import TargetProfile, default_registry


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "targets",
        parents=[options.table_output_parent()],
        help="list target profiles (devices edgekit builds for)",
        description="List the shipped target profiles, or show one with `edgekit targets show NAME`.",
    )
    parser.set_defaults(func=list_targets)
    actions = parser.add_subparsers(dest="targets_action", metavar="ACTION")
    show = actions.add_parser(
        "show",
        parents=[options.json_parent()],
        help="show every field of one target profile",
        description="Show every field of one target profile, by name or .yaml path.",
    )
    show.add_argument("name", metavar="NAME", help="target name (see `edgekit targets`) or a .yaml path")
    show.set_defaults(func=show_target)
    # argparse copies a subcommand's defaults over its parent's values: without this, the `show` default
    # (False) would undo `edgekit targets --json show NAME`.
    for action in show._actions:
        if action.dest == "json":
            action.default = argparse.SUPPRESS


def list_targets(args: argparse.Namespace) -> int:
    profiles = default_registry().all()
    if args.json:
        options.print_json([profile.to_json() for profile in profiles])
        return 0
    if args.csv:
        options.print_csv(CSV_COLUMNS, (csv_row(profile) for profile in profiles))
        return 0
    out = options.results(args)
    # The display names need a wide terminal; under it they stay in `targets show`, --json and --csv.
    widest = max((len(p.display_name) for p in profiles), default=0)
    display_names = out.width >= widest + TABLE_COLUMNS_WIDTH
    out.print(targets_table(profiles, display_names=display_names))
    return 0


def show_target(args: argparse.Namespace) -> int:
    profile = default_registry().get(args.name)
    if args.json:
        options.print_json(profile.to_json())
        return 0
    options.results(args).print(profile_tree(profile))
    return 0


# ---------------------------------------------------------------- rendering

#: Columns the table needs besides the name column, with a readable precisions column.
TABLE_COLUMNS_WIDTH = 80
#: ``edgekit targets --csv``: the table's columns, one value each.
CSV_COLUMNS = ("name", "display_name", "arch", "gpu_compute_capability", "gpu_memory_gb", "dla_cores", "npu_execution_provider",
               "memory_gb", "default_backend", "precisions")


def csv_row(profile: TargetProfile) -> tuple[Any, ...]:
    """One profile as the values of :data:`CSV_COLUMNS` (precisions space-separated)."""
    gpu, npu = profile.gpu, profile.npu
    return (profile.name, profile.display_name, profile.cpu.arch, gpu.compute_capability if gpu else None,
            gpu.memory_gb if gpu else None, profile.dla_cores, npu.execution_provider if npu else None, profile.memory.gb,
            profile.default_backend.value, " ".join(p.value for p in profile.precisions()))  # fmt: skip


def targets_table(profiles: list[TargetProfile], *, display_names: bool = True) -> Table:
    """One row per profile: what it is, what accelerates it, what edgekit can build for it.

    ``display_names=False`` leaves out the second line under each name, for narrow terminals.
    """
    table = Table(
        title="edgekit targets", title_justify="left", box=None, header_style="bold underline", padding=(0, 1, 0, 0)
    )
    table.add_column("name\n[dim]display name[/]" if display_names else "name", style="bold cyan", no_wrap=True)
    table.add_column("arch", no_wrap=True)
    table.add_column("GPU\ncc", justify="right", no_wrap=True)
    table.add_column("DLA", justify="right", no_wrap=True)
    table.add_column("NPU\nvia", no_wrap=True)
    table.add_column("memory", justify="right", no_wrap=True)
    table.add_column("default\nbackend", no_wrap=True)
    table.add_column("precisions", min_width=len(Precision.INT8_DYNAMIC.value))
    for profile in profiles:
        gpu = "-"
        if profile.gpu is not None:
            gpu = profile.gpu.compute_capability or profile.gpu.architecture  # an Intel GPU has no CUDA capability
            if profile.gpu.memory_gb is not None:  # a discrete GPU brings its own memory
                gpu += f"\n{profile.gpu.memory_gb:g}GB"
        npu = profile.npu.execution_provider.removesuffix("ExecutionProvider") if profile.npu else "-"
        table.add_row(
            f"{profile.name}\n[not bold dim]{escape(profile.display_name)}[/]" if display_names else profile.name,
            profile.cpu.arch,
            gpu,
            str(profile.dla_cores) if profile.dla_cores else "-",
            npu,
            f"{profile.memory.gb:g} GB",
            profile.default_backend.value,
            " ".join(p.value for p in profile.precisions()),
        )
    return table


def profile_tree(profile: TargetProfile) -> Tree:
    """Every field of a profile as a tree: sections as branches, scalars as ``key: value`` leaves."""
    tree = Tree(f"[bold cyan]{escape(profile.name)}[/]  {escape(profile.display_name)}")
    data = profile.to_json()
    peaks = data.pop("peak_throughput")
    for key, value in data.items():
        if key == "power_modes":  # keep the file's order: peak figures sit just before the power modes
            _add_peaks(tree, peaks)
        _add_field(tree, key, value, top_level=True)
    return tree


def _add_peaks(tree: Tree, peaks: list[dict[str, Any]]) -> None:
    if not peaks:
        tree.add("[bold]peak_throughput[/]: [dim]none published[/]")
        return
    branch = tree.add("[bold]peak_throughput[/]")
    for peak in peaks:
        details = [peak["engine"], "sparse" if peak["sparse"] else "dense"]
        if peak.get("power_mode"):
            details.append(f"at {peak['power_mode']}")
        branch.add(f"{peak['precision']}: {_scalar(peak['value'])} {peak['unit']} ({escape(', '.join(details))})")


def _add_field(node: Tree, key: str, value: Any, *, top_level: bool = False) -> None:
    label = f"[bold]{escape(key)}[/]"
    if value is None or (not top_level and value in ({}, [])):
        return
    if value in ({}, []):
        node.add(f"{label}: [dim]none[/]")
    elif isinstance(value, dict):
        branch = node.add(label)
        for sub_key, sub_value in value.items():
            _add_field(branch, str(sub_key), sub_value)
    elif isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value):
        node.add(f"{label}: {escape(', '.join(_scalar(v) for v in value))}")
    elif isinstance(value, list):
        branch = node.add(label)
        for item in value:
            # items with a name (backends, execution providers) are labelled by it
            name = item.pop("name", None) if isinstance(item, dict) else None
            if name is None:
                _add_field(branch, "-", item)
            else:
                child = branch.add(f"[bold]{escape(str(name))}[/]")
                for sub_key, sub_value in item.items():
                    _add_field(child, sub_key, sub_value)
    else:
        node.add(f"{label}: {escape(_scalar(value))}")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
