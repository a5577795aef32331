"""``edgekit schema recipe|target [--out FILE]``: the JSON Schema of a recipe or a target profile.

Editors use it to check YAML as you type (the shipped targets point at ``edgekit/schemas/target.schema.json``
with a ``# yaml-language-server: $schema=...`` line). Without ``--out`` the schema goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.markup import escape

from edgekit.cli import options
from edgekit.errors import BuildError
from edgekit.recipe import recipe_json_schema
from edgekit.target import target_json_schema

#: Schema kind -> the function that generates it from the pydantic models.
SCHEMAS: dict[str, Callable[[], dict[str, Any]]] = {
    "recipe": recipe_json_schema,
    "target": target_json_schema,
}

#: Where the generated schemas are published inside the package (kept current by a test).
PUBLISHED_DIR = Path(__file__).resolve().parent.parent / "schemas"


def published_path(kind: str) -> Path:
    return PUBLISHED_DIR / f"{kind}.schema.json"


def schema_text(kind: str) -> str:
    """The schema of ``kind`` as the published files hold it: indented JSON ending in a newline."""
    return json.dumps(SCHEMAS[kind](), indent=2) + "\n"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "schema",
        help="print or write the JSON Schema of a recipe or a target profile",
        description="Print (or write with --out) the JSON Schema that recipe or target YAML files follow.",
    )
    parser.add_argument("kind", choices=sorted(SCHEMAS), help="which file format")
    parser.add_argument("--out", "-o", metavar="FILE", type=Path, help="write the schema to FILE instead of stdout")
    parser.set_defaults(func=run_schema)


def run_schema(args: argparse.Namespace) -> int:
    text = schema_text(args.kind)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    out: Path = args.out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BuildError(
            f"cannot write the {args.kind} schema to {out}: {exc.strerror or exc}",
            hint="choose a writable path with --out, or leave --out off to print to stdout",
        ) from None
    # The schema itself is the result (stdout without --out); this confirmation is a log line.
    options.console.print(f"wrote the {args.kind} JSON Schema to [bold]{escape(str(out))}[/]", soft_wrap=True)
    return 0
