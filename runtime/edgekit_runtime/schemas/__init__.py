"""The versioned JSON Schemas of the messages a device and the fleet collector exchange.

Files ship inside the package (``<name>.json``) and load with :func:`load_schema`; the device
validates with the dependency-free subset in :mod:`edgekit_runtime.schemas.validator`, the host
collector may validate the very same dicts with ``jsonschema``.

============  =================================================  =========================
name          what                                               topic
============  =================================================  =========================
telemetry.v1  one window of inference, power and device stats    ``.../telemetry``
status.v1     online / offline (retained; offline is the will)   ``.../status``
event.v1      deploy results, errors, command replies            ``.../events``
command.v1    deploy, rollback, set_interval, ping               ``.../cmd``
ack.v1        the telemetry seqs the collector has stored        ``.../ack``
============  =================================================  =========================
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from importlib import resources
from itertools import islice
from typing import Any

from edgekit_runtime.errors import EdgekitError
from edgekit_runtime.schemas.validator import check_supported, iter_errors

SCHEMA_NAMES = ("telemetry.v1", "status.v1", "event.v1", "command.v1", "ack.v1")

#: Most problems listed in one :class:`SchemaValidationError` message.
MAX_LISTED_PROBLEMS = 10


class SchemaValidationError(EdgekitError):
    """A message does not match its JSON Schema; ``problems`` lists every mismatch found."""

    def __init__(self, message: str, *, problems: list[str], hint: str | None = None) -> None:
        self.problems = problems
        super().__init__(message, hint=hint)


def _normalise_name(name: str) -> str:
    stem = name[: -len(".json")] if name.endswith(".json") else name
    if stem not in SCHEMA_NAMES:
        raise EdgekitError(
            f"unknown message schema '{name}'",
            hint=f"use one of: {', '.join(SCHEMA_NAMES)}",
        )
    return stem


@lru_cache(maxsize=None)
def _cached_schema(stem: str) -> dict[str, Any]:
    text = resources.files(__name__).joinpath(f"{stem}.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    check_supported(schema, f"{stem}.json#")
    return schema


def load_schema(name: str) -> dict[str, Any]:
    """The schema ``name`` (``"telemetry.v1"`` or ``"telemetry.v1.json"``) as a fresh dict."""
    return copy.deepcopy(_cached_schema(_normalise_name(name)))


def schema_problems(instance: Any, name: str, *, limit: int | None = None) -> list[str]:
    """Every way ``instance`` breaks schema ``name`` (empty when it validates); the first ``limit`` only
    when given, which also stops the search there (for untrusted messages)."""
    return list(islice(iter_errors(instance, _cached_schema(_normalise_name(name))), limit))


def validate_message(instance: Any, name: str, *, what: str | None = None) -> None:
    """Raise :class:`SchemaValidationError` naming each problem when ``instance`` breaks schema ``name``."""
    problems = schema_problems(instance, name)
    if problems:
        listed = "; ".join(problems[:MAX_LISTED_PROBLEMS])
        more = len(problems) - MAX_LISTED_PROBLEMS
        suffix = f" (and {more} more)" if more > 0 else ""
        raise SchemaValidationError(
            f"{what or 'message'} does not match schema {name}: {listed}{suffix}",
            problems=problems,
            hint=f"see edgekit_runtime/schemas/{_normalise_name(name)}.json for the fields and their types",
        )


__all__ = ["MAX_LISTED_PROBLEMS", "SCHEMA_NAMES", "SchemaValidationError", "load_schema", "schema_problems",
           "validate_message"]  # fmt: skip
