"""Loading validated YAML configuration (recipes, target profiles).

YAML is parsed with positions kept, then validated into frozen pydantic models. Every failure is
turned into a :class:`~edgekit.errors.ConfigError` subclass that names the file, the field path,
the line and column, and, for a mistyped key, the closest valid key.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from edgekit.errors import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)
Location = tuple[str | int, ...]


class StrictModel(BaseModel):
    """Base for every configuration model: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class _PositionLoader(yaml.SafeLoader):
    """A SafeLoader that records the line/column of every mapping key and sequence item."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.positions: dict[Location, tuple[int, int]] = {}

    def record(self, node: yaml.Node, loc: Location) -> None:
        self.positions[loc] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = key_node.value
                self.positions[(*loc, key)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                self.record(value_node, (*loc, key))
                self.positions[(*loc, key)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.record(item, (*loc, index))


def _duplicate_key_check(loader: _PositionLoader, node: yaml.Node, path: Path, error: type[ConfigError]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise error(
                    f"{path}:{key_node.start_mark.line + 1}:{key_node.start_mark.column + 1}: "
                    f"key '{key}' appears twice (first on line {seen[key]})",
                    hint="remove one of the two entries",
                )
            seen[key] = key_node.start_mark.line + 1
            _duplicate_key_check(loader, value_node, path, error)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _duplicate_key_check(loader, item, path, error)


def read_yaml(path: Path, error: type[ConfigError] = ConfigError, what: str = "file") -> tuple[Any, dict[Location, tuple[int, int]]]:
    """Parse a YAML file; return (data, positions). Missing files and syntax errors raise ``error``."""
    path = Path(path)
    if not path.is_file():
        raise error(
            f"{what} not found: {path}" + (" (it is a directory)" if path.is_dir() else ""),
            hint=f"check the path; the current directory is {Path.cwd()}",
        )
    text = path.read_text(encoding="utf-8")
    loader = _PositionLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise error(f"{path}: the {what} is empty", hint="see recipes/ and targets/ for examples")
        _duplicate_key_check(loader, node, path, error)
        loader.record(node, ())
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise error(f"{where}: YAML syntax error: {exc.problem or exc}", hint="fix the YAML at that line and column") from None
    finally:
        loader.dispose()
    return data, loader.positions


def _unwrap(annotation: Any) -> list[Any]:
    """The concrete types an annotation may hold (Optional/Union/Annotated unwrapped)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            out.extend(_unwrap(arg))
        return out
    return [annotation]


def _valid_keys(model: type[BaseModel], loc: Location) -> list[str]:
    """The field names valid at ``loc`` inside ``model`` (best effort; [] when unknown)."""
    candidates: list[Any] = [model]
    for part in loc:
        next_candidates: list[Any] = []
        for candidate in candidates:
            for concrete in _unwrap(candidate):
                origin = typing.get_origin(concrete)
                if isinstance(concrete, type) and issubclass(concrete, BaseModel):
                    for name, field in concrete.model_fields.items():
                        if part in (name, field.alias):
                            next_candidates.append(field.annotation)
                elif origin in (list, tuple) and isinstance(part, int):
                    next_candidates.extend(typing.get_args(concrete)[:1])
                elif origin is dict:
                    args = typing.get_args(concrete)
                    if len(args) == 2:
                        next_candidates.append(args[1])
        candidates = next_candidates
    keys: list[str] = []
    for candidate in candidates:
        for concrete in _unwrap(candidate):
            if isinstance(concrete, type) and issubclass(concrete, BaseModel):
                keys.extend(field.alias or name for name, field in concrete.model_fields.items())
    return keys


def _format_loc(loc: Location) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _position_for(loc: Location, positions: dict[Location, tuple[int, int]]) -> tuple[int, int] | None:
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in positions:
            return positions[loc[:cut]]
    return None


def validation_message(exc: ValidationError, model: type[BaseModel], path: Path, positions: dict[Location, tuple[int, int]]) -> tuple[str, str | None]:
    """Turn a pydantic ValidationError into (message, hint) naming file, line, field and fix."""
    lines: list[str] = []
    hints: list[str] = []
    for err in exc.errors():
        # pydantic appends the union member or validator name to loc for tagged unions; keep data keys.
        loc: Location = tuple(p for p in err["loc"] if isinstance(p, int) or not str(p).startswith("function-"))
        pos = _position_for(loc, positions)
        where = f"{path}:{pos[0]}:{pos[1]}" if pos else str(path)
        field = _format_loc(loc)
        if err["type"] == "extra_forbidden":
            key = str(loc[-1])
            valid = _valid_keys(model, loc[:-1])
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
            msg = f"{where}: unknown key '{key}' in {_format_loc(loc[:-1])}"
            if close:
                msg += f" (did you mean '{close[0]}'?)"
                hints.append(f"rename '{key}' to '{close[0]}'")
            elif valid:
                hints.append(f"valid keys there: {', '.join(sorted(valid))}")
            lines.append(msg)
        elif err["type"] == "missing":
            lines.append(f"{where}: missing required field '{field}'")
        else:
            given = err.get("input")
            shown = repr(given)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            lines.append(f"{where}: field '{field}': {err['msg']} (got {shown})")
    return "\n".join(lines), ("; ".join(hints) if hints else None)


def load_model(path: Path, model: type[ModelT], error: type[ConfigError], what: str, context: dict[str, Any] | None = None) -> ModelT:
    """Read ``path`` and validate it into ``model``; raise ``error`` naming file, line and field."""
    data, positions = read_yaml(path, error, what)
    if not isinstance(data, dict):
        raise error(f"{path}: a {what} must be a mapping of keys to values, got {type(data).__name__}")
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        message, hint = validation_message(exc, model, path, positions)
        raise error(f"invalid {what}:\n{message}", hint=hint) from None


def closest(name: str, choices: typing.Iterable[str], n: int = 3) -> list[str]:
    """Names in ``choices`` that look like ``name`` (for 'did you mean' hints)."""
    choices = list(choices)
    found = difflib.get_close_matches(name, choices, n=n, cutoff=0.5)
    found += [c for c in choices if (name in c or c in name) and c not in found]
    return found[:n]
