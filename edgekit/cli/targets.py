"""``edgekit targets``: list the shipped target profiles, or show one in full.

``edgekit targets`` prints a table (to stderr); with ``--json`` the last stdout line is a JSON list with
every profile's full fields. ``edgekit targets show NAME`` prints one profile (a name or a ``.yaml`` path).
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from edgekit.cli import options
from edgekit.target import TargetProfile, TargetRegistry, default_registry


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "targets",
        parents=[options.json_parent()],
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


def _registry() -> TargetRegistry:
    return default_registry()


def list_targets(args: argparse.Namespace) -> int:
    profiles = _registry().all()
    if args.json:
        options.print_json([profile.to_json() for profile in profiles])
        return 0
    options.console.print(targets_table(profiles))
    return 0


def show_target(args: argparse.Namespace) -> int:
    profile = _registry().get(args.name)
    if args.json:
        options.print_json(profile.to_json())
        return 0
    options.console.print(profile_tree(profile))
    return 0


# ---------------------------------------------------------------- rendering


def targets_table(profiles: list[TargetProfile]) -> Table:
    """One row per profile: what it is, what accelerates it, what edgekit can build for it."""
    table = Table(title="edgekit targets", title_justify="left")
    table.add_column("name", style="bold cyan", no_wrap=True)
    table.add_column("display name")
    table.add_column("arch", no_wrap=True)
    table.add_column("GPU cc", justify="right", no_wrap=True)
    table.add_column("DLA", justify="right", no_wrap=True)
    table.add_column("NPU")
    table.add_column("memory", justify="right", no_wrap=True)
    table.add_column("default backend", no_wrap=True)
    table.add_column("precisions")
    for profile in profiles:
        memory = f"{profile.memory.gb:g} GB"
        if profile.gpu is not None and profile.gpu.memory_gb is not None:
            memory += f" + {profile.gpu.memory_gb:g} GB GPU"
        table.add_row(
            profile.name,
            escape(profile.display_name),
            profile.cpu.arch,
            profile.gpu.compute_capability if profile.gpu else "-",
            str(profile.dla_cores) if profile.dla_cores else "-",
            escape(profile.npu.name) if profile.npu else "-",
            memory,
            profile.default_backend.value,
            ", ".join(p.value for p in profile.precisions()),
        )
    return table


def profile_tree(profile: TargetProfile) -> Tree:
    """Every field of a profile as a tree: sections as branches, scalars as ``key: value`` leaves."""
    tree = Tree(f"[bold cyan]{escape(profile.name)}[/]  {escape(profile.display_name)}")
    _add_fields(tree, profile.to_json())
    return tree


def _item_label(index: int, item: dict[str, Any]) -> str:
    for key in ("name", "precision"):
        if key in item:
            return f"[bold]{escape(str(item[key]))}[/]"
    return f"[{index}]"


def _add_fields(node: Tree, data: dict[str, Any]) -> None:
    for key, value in data.items():
        if value is None:
            continue
        label = f"[bold]{escape(key)}[/]"
        if isinstance(value, dict):
            if not value:
                node.add(f"{label}: [dim]none[/]")
            elif all(not isinstance(v, (dict, list)) for v in value.values()) and key != "options":
                branch = node.add(label)
                for sub_key, sub_value in value.items():
                    branch.add(f"{escape(str(sub_key))}: {escape(_scalar(sub_value))}")
            else:
                _add_fields(node.add(label), value)
        elif isinstance(value, list):
            if not value:
                node.add(f"{label}: [dim]none[/]")
            elif all(not isinstance(v, (dict, list)) for v in value):
                node.add(f"{label}: {escape(', '.join(_scalar(v) for v in value))}")
            else:
                branch = node.add(label)
                for index, item in enumerate(value):
                    if isinstance(item, dict):
                        _add_fields(branch.add(_item_label(index, item)), item)
                    else:
                        branch.add(escape(_scalar(item)))
        else:
            node.add(f"{label}: {escape(_scalar(value))}")


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
