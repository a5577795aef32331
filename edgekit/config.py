"""Loading validated YAML configuration (recipes, target profiles).

YAML is parsed with positions kept, then validated into frozen pydantic models. Every failure is
turned into a :class:`~edgekit.errors.ConfigError` subclass that names the file, the field path,
the line and column, and, for a mistyped key, the closest valid key.

Configuration files are hostile input (a recipe may come from anywhere), so the reader has limits
that hold before any work grows with the input: the file size, the nesting depth and the number of
nodes the document has once its aliases are expanded are counted while the YAML is composed, so an
alias bomb or a recursive alias is refused after a few hundred nodes, not after gigabytes. Bytes
that are not UTF-8 are a named error with their byte offset.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from edgekit.errors import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)
Location = tuple[str | int, ...]


class FieldError(ValueError):
    """Raised by a model validator about one field below the model (``loc``, e.g. ``("dims", "batch", "max")``),
    so the error names that field and its line instead of the whole model."""

    def __init__(self, loc: Location, message: str) -> None:
        super().__init__(message)
        self.loc = loc


class StrictModel(BaseModel):
    """Base for every configuration model: unknown keys are errors, instances are immutable, and
    numbers are finite (``.inf`` and ``.nan`` are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)


_SURROGATE = re.compile("[\ud800-\udfff]")
#: The largest configuration file read (recipes and target profiles are a few KB).
MAX_CONFIG_BYTES = 1 << 20
#: The deepest nesting of mappings and sequences (aliases expanded); recipes need about 8.
MAX_CONFIG_DEPTH = 48
#: The most nodes a document may have with every alias expanded (the shipped recipes have under 300).
MAX_CONFIG_NODES = 100_000


class _LimitError(yaml.composer.ComposerError):
    """The document breaks one of the reader's limits (nesting, size with aliases, recursive alias)."""


class _PositionLoader(yaml.SafeLoader):
    """A SafeLoader that records the line/column of every mapping key and sequence item, and refuses
    documents that nest too deep or expand (through aliases) to too many nodes while composing them."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.positions: dict[Location, tuple[int, int]] = {}
        self._depth = 0  # nesting level of the node being composed (the root is 1)
        self._deepest = 0  # deepest level reached inside the node being composed, aliases expanded
        self._nodes = 0  # nodes composed so far, each alias counted as the nodes it stands for
        self._open_anchors: set[str] = set()  # anchors of the collections being composed
        self._measured: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, height), aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise _LimitError(
                    None, None, f"alias *{event.anchor} is inside the collection &{event.anchor} it refers to (a recursive alias)", event.start_mark
                )
            node = super().compose_node(parent, index)
            nodes, height = self._measured[id(node)]
            self._grow(nodes, self._depth + height, event.start_mark, f"alias *{event.anchor}")
            return node
        depth = self._depth + 1
        self._grow(1, depth, event.start_mark, "this value")
        outer_deepest, self._deepest, self._depth = self._deepest, depth, depth
        nodes_before = self._nodes - 1
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._open_anchors.discard(anchor)  # type: ignore[arg-type]
            self._depth = depth - 1
        self._measured[id(node)] = (self._nodes - nodes_before, self._deepest - depth + 1)
        self._deepest = max(outer_deepest, self._deepest)
        return node

    def _grow(self, nodes: int, deepest: int, mark: yaml.Mark, what: str) -> None:
        self._nodes += nodes
        self._deepest = max(self._deepest, deepest)
        if deepest > MAX_CONFIG_DEPTH:
            raise _LimitError(
                None, None, f"{what} nests deeper than {MAX_CONFIG_DEPTH} levels of mappings and sequences (aliases expanded)", mark
            )
        if self._nodes > MAX_CONFIG_NODES:
            raise _LimitError(
                None, None,
                f"{what} makes the document larger than {MAX_CONFIG_NODES:,} values with its aliases expanded "
                "(an alias bomb: anchors that repeat other anchors)",
                mark,
            )

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            data = super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError, AttributeError, KeyError, IndexError) as exc:  # e.g. a timestamp 2024-02-30
            raise yaml.constructor.ConstructorError(None, None, f"cannot read this {node.tag.rsplit(':', 1)[-1]} value: {exc}", node.start_mark) from None
        if isinstance(data, str) and _SURROGATE.search(data):  # "\ud800" escapes: not text, cannot be UTF-8
            raise yaml.constructor.ConstructorError(
                None, None, f"this string holds a lone surrogate escape (U+{ord(_SURROGATE.search(data).group()):04X}), which is not a character", node.start_mark
            )
        return data

    def record(self, node: yaml.Node, loc: Location) -> None:
        self.positions[loc] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = key_node.value
                if not isinstance(key, str):  # _duplicate_key_check refuses these first
                    continue
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
            if not isinstance(key_node, yaml.ScalarNode):
                raise error(
                    f"{path}:{key_node.start_mark.line + 1}:{key_node.start_mark.column + 1}: "
                    f"a {'list' if isinstance(key_node, yaml.SequenceNode) else 'mapping'} is used as a mapping key",
                    hint="keys are plain names such as 'name' or 'build'; remove the '?' or the brackets around the key",
                )
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


def read_yaml(path: Path, error: type[ConfigError] = ConfigError, what: str = "file",
              raw: bytes | None = None) -> tuple[Any, dict[Location, tuple[int, int]]]:
    """Parse a YAML file (or ``raw``, its bytes as :func:`read_config_bytes` read them); return (data,
    positions). Missing files, files over the limits and syntax errors raise ``error``."""
    path = Path(path)
    text = _decode(read_config_bytes(path, error, what) if raw is None else raw, path, error, what)
    loader: _PositionLoader | None = None
    try:
        loader = _PositionLoader(text)  # checks that every character is printable
        node = loader.get_single_node()
        if node is None:
            raise error(f"{path}: the {what} is empty", hint="see recipes/ and targets/ for examples")
        _duplicate_key_check(loader, node, path, error)
        loader.record(node, ())
        data = loader.construct_document(node)
    except _LimitError as exc:
        mark = exc.problem_mark
        raise error(
            f"{path}:{mark.line + 1}:{mark.column + 1}: {exc.problem}",
            hint=f"a {what} is a small hand-written file: write the values out instead of nesting anchors and aliases",
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise error(f"{where}: YAML syntax error: {exc.problem or exc}", hint="fix the YAML at that line and column") from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (control characters, NUL)
        line, column = _line_column(text, exc.position)
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise error(
            f"{path}:{line}:{column}: character U+{code:04X} at character offset {exc.position} is not allowed in YAML ({exc.reason})",
            hint="remove it; a configuration file is printable UTF-8 text",
        ) from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: YAML error: {exc}", hint="fix the YAML") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, loader.positions


def _line_column(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of character ``offset`` in ``text``."""
    line_start = text.rfind("\n", 0, offset) + 1
    return text.count("\n", 0, offset) + 1, offset - line_start + 1


def read_config_bytes(path: Path, error: type[ConfigError] = ConfigError, what: str = "file") -> bytes:
    """The bytes of a configuration file, read once and at most :data:`MAX_CONFIG_BYTES` of them; a
    missing file, a folder or too large a file raise ``error``."""
    path = Path(path)
    if not path.is_file():
        raise error(
            f"{what} not found: {path}" + (" (it is a directory)" if path.is_dir() else ""),
            hint=f"check the path; the current directory is {Path.cwd()}",
        )
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise error(
            f"{path}: the {what} is {size:,} bytes; configuration files are read up to {MAX_CONFIG_BYTES:,} bytes",
            hint="is this the right file? Put large data (class lists, vocabularies) in a file that a data or model callable reads",
        )
    with path.open("rb") as handle:
        raw = handle.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:  # it grew after stat
        raise error(f"{path}: the {what} is larger than {MAX_CONFIG_BYTES:,} bytes", hint="is this the right file?")
    return raw


def _decode(raw: bytes, path: Path, error: type[ConfigError], what: str) -> str:
    """``raw`` as UTF-8 text; bytes that are not UTF-8 raise ``error`` naming line, column and byte offset."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(
            f"{path}:{line}:{column}: byte 0x{raw[exc.start]:02x} at byte offset {exc.start} is not UTF-8 ({exc.reason})",
            hint=f"save the {what} as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
        ) from None


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
    errors = exc.errors()
    all_locs = [tuple(err["loc"]) for err in errors]
    for err in errors:
        if err["type"] == "too_short" and any(other[: len(err["loc"])] == tuple(err["loc"]) and len(other) > len(err["loc"]) for other in all_locs):
            continue  # "0 items after validation" only repeats that an item below failed
        # pydantic appends the union member or validator name to loc for tagged unions; keep data keys.
        loc: Location = tuple(p for p in err["loc"] if isinstance(p, int) or not str(p).startswith("function-"))
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            loc = (*loc, *cause.loc)
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
        elif isinstance(cause, FieldError):
            lines.append(f"{where}: field '{field}': {cause}")
        else:
            given = err.get("input")
            shown = repr(given)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            if err["type"] == "value_error" and isinstance(given, dict):  # a whole section: the message says what
                lines.append(f"{where}: field '{field}': {err['msg']}")
            else:
                lines.append(f"{where}: field '{field}': {err['msg']} (got {shown})")
    return "\n".join(lines), ("; ".join(hints) if hints else None)


def load_model(path: Path, model: type[ModelT], error: type[ConfigError], what: str, context: dict[str, Any] | None = None,
               raw: bytes | None = None) -> ModelT:
    """Read ``path`` (or its bytes ``raw``) and validate it into ``model``; raise ``error`` naming file, line and field."""
    data, positions = read_yaml(path, error, what, raw)
    if not isinstance(data, dict):
        raise error(f"{path}: a {what} must be a mapping of keys to values, got {type(data).__name__}")
    try:
        instance = model.model_validate(data, context=context)
    except ValidationError as exc:
        message, hint = validation_message(exc, model, path, positions)
        raise error(f"invalid {what}:\n{message}", hint=hint) from None
    _check_local_paths(instance, (), Path(path).parent, path, positions, error)
    return instance


def _check_local_paths(value: Any, loc: Location, base_dir: Path, path: Path, positions: dict[Location, tuple[int, int]],
                       error: type[ConfigError]) -> None:
    """Every path the file names (relative ones against its folder) that exists is a regular file or a
    folder: a device such as /dev/zero or a FIFO would be read without end or block the build."""
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            _check_local_paths(getattr(value, name), (*loc, name), base_dir, path, positions, error)
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            _check_local_paths(item, (*loc, index), base_dir, path, positions, error)
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, BaseModel):
                _check_local_paths(item, (*loc, key), base_dir, path, positions, error)
    elif isinstance(value, Path):
        target = value.expanduser() if value.is_absolute() or str(value).startswith("~") else base_dir / value
        try:
            special = target.exists() and not (target.is_file() or target.is_dir())
        except OSError:  # too long, a loop of links: the stage that opens it says so
            special = False
        if special:
            pos = _position_for(loc, positions)
            where = f"{path}:{pos[0]}:{pos[1]}" if pos else str(path)
            raise error(
                f"{where}: field '{_format_loc(loc)}': '{value}' is not a regular file or folder (a device, FIFO or socket)",
                hint="point it at the model or data file itself",
            )


def closest(name: str, choices: typing.Iterable[str], n: int = 3) -> list[str]:
    """Names in ``choices`` that look like ``name`` (for 'did you mean' hints)."""
    choices = list(choices)
    found = difflib.get_close_matches(name, choices, n=n, cutoff=0.5)
    found += [c for c in choices if (name in c or c in name) and c not in found]
    return found[:n]
