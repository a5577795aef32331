"""Loading validated YAML configuration (recipes, target profiles).

YAML is parsed with positions kept, then validated into frozen pydantic models. Every failure is
turned into a :class:`~edgekit.errors.ConfigError` subclass that names the file, the field path,
the line and column, and, for a mistyped key, the closest valid key.

Configuration files are hostile input (a recipe may come from anywhere), so they are read with
:mod:`edgekit_runtime.yaml_limited` (the reader the device agent uses for its own config), whose limits
hold before any work grows with the input: the file size, the nesting depth and the number of nodes the
document has once its aliases are expanded are counted while the YAML is composed, so an alias bomb or a
recursive alias is refused after a few hundred nodes, not after gigabytes. Bytes that are not UTF-8 are a
named error with their byte offset.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, ValidationError
from pydantic_core import CoreSchema

from edgekit.errors import ConfigError
from edgekit_runtime.yaml_limited import (
    MAX_YAML_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    Location,
    parse_yaml_limited,
    read_limited_bytes,
)

ModelT = TypeVar("ModelT", bound=BaseModel)


class FieldError(ValueError):
    """Raised by a model validator about one field below the model (``loc``, e.g. ``("dims", "batch", "max")``),
    so the error names that field and its line instead of the whole model."""

    def __init__(self, loc: Location, message: str) -> None:
        super().__init__(message)
        self.loc = loc


#: The core-schema types :class:`StrictModel` validates in strict mode (as its published JSON Schema says).
STRICT_SCHEMA_TYPES = ("int", "float", "bool")


def _strict_numbers(schema: Any) -> None:
    """Mark every int, float and bool schema inside ``schema`` (a pydantic core schema) strict."""
    if isinstance(schema, dict):
        if schema.get("type") in STRICT_SCHEMA_TYPES:
            schema["strict"] = True
        for value in schema.values():
            _strict_numbers(value)
    elif isinstance(schema, list):
        for value in schema:
            _strict_numbers(value)


class StrictModel(BaseModel):
    """Base for every configuration model: unknown keys are errors, instances are immutable, numbers are
    finite (``.inf`` and ``.nan`` are errors) and taken as written: an int, float or bool field refuses a
    string ('16'), an int field a bool (YAML's ``true``) or a float (``8.0``), and a bool field a number or a
    string; a float field takes an int. Enums from their names, paths from strings and tuples from lists
    load as before (only the number and bool schemas are strict), as do fields whose type names a bool or
    a string among its choices (``float | bool``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: type[BaseModel], handler: GetCoreSchemaHandler) -> CoreSchema:
        schema = handler(source)
        _strict_numbers(schema)
        return schema


#: The reader's limits (:mod:`edgekit_runtime.yaml_limited`, shared with the device agent's config).
MAX_CONFIG_BYTES = MAX_YAML_BYTES
MAX_CONFIG_DEPTH = MAX_YAML_DEPTH
MAX_CONFIG_NODES = MAX_YAML_NODES


def read_yaml(path: Path, error: type[ConfigError] = ConfigError, what: str = "file",
              raw: bytes | None = None) -> tuple[Any, dict[Location, tuple[int, int]]]:
    """Parse a YAML file (or ``raw``, its bytes as :func:`read_config_bytes` read them); return (data,
    positions). Missing files, files over the limits and syntax errors raise ``error``."""
    path = Path(path)
    return parse_yaml_limited(read_config_bytes(path, error, what) if raw is None else raw, path, error, what,
                              empty_hint="see recipes/ and targets/ for examples")  # fmt: skip


def read_config_bytes(path: Path, error: type[ConfigError] = ConfigError, what: str = "file") -> bytes:
    """The bytes of a configuration file, read once and at most :data:`MAX_CONFIG_BYTES` of them; a
    missing file, a folder or too large a file raise ``error``."""
    return read_limited_bytes(
        path, error, what,
        too_large_hint="is this the right file? Put large data (class lists, vocabularies) in a file that a data or model callable reads",
    )  # fmt: skip


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


def _types_at(model: type[BaseModel], loc: Location) -> list[Any]:
    """The annotations a value at ``loc`` inside ``model`` may have (best effort; [] when unknown)."""
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
    return [concrete for candidate in candidates for concrete in _unwrap(candidate)]


def _valid_keys(model: type[BaseModel], loc: Location) -> list[str]:
    """The field names valid at ``loc`` inside ``model`` (best effort; [] when unknown)."""
    return [field.alias or name for concrete in _types_at(model, loc)
            if isinstance(concrete, type) and issubclass(concrete, BaseModel)
            for name, field in concrete.model_fields.items()]  # fmt: skip


def _union_tags(model: type[BaseModel], loc: Location, discriminator: str) -> list[str]:
    """The values ``discriminator`` may take at ``loc`` (a tagged union's members' ``Literal`` tags)."""
    tags: list[str] = []
    for concrete in _types_at(model, loc):
        if isinstance(concrete, type) and issubclass(concrete, BaseModel) and discriminator in concrete.model_fields:
            tags.extend(str(tag) for tag in typing.get_args(concrete.model_fields[discriminator].annotation))
    return tags


def _tag_message(err: Any, model: type[BaseModel], loc: Location, field: str) -> tuple[str, str]:
    """(message, hint) for a section of a tagged union whose tag is missing or names no member: which key
    picks the kind, the kinds there are, and a kind the section's own keys suggest (``onnx: x.onnx``)."""
    ctx = err.get("ctx") or {}
    discriminator = str(ctx.get("discriminator", "kind")).strip("'\"")
    tags = _union_tags(model, loc, discriminator)
    given = err.get("input")
    keys = [str(key) for key in given] if isinstance(given, dict) else []
    if err["type"] == "union_tag_invalid":
        tag = str(ctx.get("tag"))
        message = f"field '{field}.{discriminator}': unknown {discriminator} '{tag}'"
        close = difflib.get_close_matches(tag, tags, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
    else:
        message = f"field '{field}': missing the '{discriminator}' key that says what this section is"
        named = [key for key in keys if key in tags]
        hint = f"write '{discriminator}: {named[0]}' (and its other fields, e.g. 'path') instead of '{named[0]}:'; " if named else ""
    return message, hint + f"'{discriminator}' is one of: {', '.join(tags)}" if tags else hint.rstrip("; ")


def _format_loc(loc: Location) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _position_for(loc: Location, positions: dict[Location, tuple[int, int]]) -> tuple[int, int] | None:
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in positions:
            return positions[loc[:cut]]
        as_text = loc[: cut - 1] + (str(loc[cut - 1]),) if cut else loc  # a key YAML read as a number: recorded as text
        if cut and not isinstance(loc[cut - 1], str) and as_text in positions:
            return positions[as_text]
    return None


def _model_class_names() -> set[str]:
    names, todo = set(), [BaseModel]
    while todo:
        for sub in todo.pop().__subclasses__():
            names.add(sub.__name__)
            todo.append(sub)
    return names


def _is_union_member(part: object, loc: tuple[Any, ...], index: int) -> bool:
    """pydantic names the member of a union in ``loc`` by its class (``CallableData``), never as the last part; a
    data key (even a capitalised one a file made up) is not the name of a model class."""
    return isinstance(part, str) and index < len(loc) - 1 and part[:1].isupper() and part in _model_class_names()


def closest_union_member(errors: list[Any]) -> list[Any]:
    """For a value that matched no member of a union, the errors of the member it came closest to (the fewest
    errors; the first on a tie), with the member's name taken out of each location: a typo in ``callable``
    is one unknown key in ``data.samples``, not every member's complaints about every other member's keys."""
    by_member: dict[tuple[Location, str], int] = {}
    for err in errors:
        loc = tuple(err["loc"])
        for index, part in enumerate(loc):
            if _is_union_member(part, loc, index):
                key = (loc[:index], str(part))
                by_member[key] = by_member.get(key, 0) + 1
                break
    best: dict[Location, str] = {}
    for (prefix, member), count in by_member.items():  # dicts keep pydantic's member order: the first wins a tie
        if prefix not in best or count < by_member[(prefix, best[prefix])]:
            best[prefix] = member
    kept = []
    for err in errors:
        loc = tuple(err["loc"])
        index = next((i for i, part in enumerate(loc) if _is_union_member(part, loc, i)), None)
        if index is None:
            kept.append(err)
        elif best.get(loc[:index]) == loc[index]:
            kept.append({**err, "loc": loc[:index] + loc[index + 1:]})
    return kept


def _explained_by_a_typo(err: Any, errors: list[Any]) -> bool:
    """A missing field next to an unknown key that is its near-miss: the unknown key's message names it."""
    if err["type"] != "missing":
        return False
    loc = tuple(err["loc"])
    for other in errors:
        other_loc = tuple(other["loc"])
        if other["type"] == "extra_forbidden" and other_loc[:-1] == loc[:-1]:
            if difflib.get_close_matches(str(other_loc[-1]), [str(loc[-1])], n=1, cutoff=0.6):
                return True
    return False


#: How pydantic names the member of a union that is not a model in an error's location (``float``, ``list[str]``,
#: ``literal['host']``, ``str-enum[Precision]``): never a field of the file, so never shown.
_BARE_TYPE_TAGS = frozenset({"int", "float", "bool", "str", "bytes", "none", "list", "dict", "tuple", "set"})


def _is_union_tag(part: object, prefix: Location, positions: dict[Location, tuple[int, int]]) -> bool:
    if not isinstance(part, str) or part == "[key]" or (*prefix, part) in positions:
        return False
    return part in _BARE_TYPE_TAGS or ("[" in part and part.endswith("]"))


def merge_union_alternatives(errors: list[Any], positions: dict[Location, tuple[int, int]]) -> list[Any]:
    """The errors with the union members' names taken out of their locations, and the alternatives one value failed
    (``precision: INT8`` is neither a Precision nor 'auto') merged into one error whose message lists each."""
    merged: list[Any] = []
    by_loc: dict[Location, Any] = {}
    for err in errors:
        loc = tuple(err["loc"])
        kept = tuple(part for index, part in enumerate(loc) if not _is_union_tag(part, loc[:index], positions))
        if kept == loc:
            merged.append(err)
            continue
        if kept in by_loc:
            first = by_loc[kept]
            first["alternatives"].append(err)
            if err["msg"] not in first["msg"].split("; or: "):
                first["msg"] += f"; or: {err['msg']}"
            continue
        by_loc[kept] = {**err, "loc": kept, "alternatives": [err]}
        merged.append(by_loc[kept])
    return merged


def _sexagesimal(text: str) -> int | None:
    """What YAML 1.1 reads an unquoted ``2:4`` as (base 60: 124), None for text of another form."""
    parts = text.split(":")
    if len(parts) < 2 or not all(part.isdigit() for part in parts):
        return None
    value = 0
    for part in parts:
        value = value * 60 + int(part)
    return value


def _value_hint(err: Any) -> str | None:
    """The fix for a value of the wrong kind: the choice a misspelt one is close to, quotes a number does not need
    (or a name does), a YAML boolean where a number belongs."""
    given = err.get("input")
    choices: list[str] = []
    for each in err.get("alternatives", [err]):
        if each["type"] in ("enum", "literal_error"):
            choices += re.findall(r"'([^']*)'", str((each.get("ctx") or {}).get("expected", "")))
    kinds = {each["type"] for each in err.get("alternatives", [err])}
    if choices and isinstance(given, int) and not isinstance(given, bool):
        quoted = [choice for choice in choices if _sexagesimal(choice) == given]
        if quoted:
            return f"YAML reads an unquoted {quoted[0]} as the base-60 number {given}: quote it, '{quoted[0]}'"
    if choices and isinstance(given, str):
        close = [c for c in choices if c.lower() == given.lower()] or difflib.get_close_matches(given, choices, n=1, cutoff=0.6)
        if close:
            return f"did you mean '{close[0]}'?"
    if kinds & {"int_type", "float_type"} and isinstance(given, bool):
        return "YAML reads true/false (and yes/no, on/off) as booleans: write the number itself"
    if kinds & {"int_type", "float_type"} and isinstance(given, str):
        try:
            float(given)
        except ValueError:
            return None
        return f"write {given} as a number, without quotes"
    if kinds == {"bool_type"}:
        return "write true or false"
    return None


def validation_message(exc: ValidationError, model: type[BaseModel], path: Path, positions: dict[Location, tuple[int, int]]) -> tuple[str, str | None]:
    """Turn a pydantic ValidationError into (message, hint) naming file, line, field and fix."""
    lines: list[str] = []
    hints: list[str] = []
    errors = merge_union_alternatives(closest_union_member(exc.errors()), positions)
    errors = [err for err in errors if not _explained_by_a_typo(err, errors)]
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
        elif err["type"] in ("union_tag_not_found", "union_tag_invalid"):
            message, hint = _tag_message(err, model, loc, field)
            lines.append(f"{where}: {message}")
            if hint:
                hints.append(hint)
        elif err["type"] == "missing":
            lines.append(f"{where}: missing required field '{field}'")
        elif isinstance(cause, FieldError):
            lines.append(f"{where}: field '{field}': {cause}")
        elif loc and loc[-1] == "[key]" and err["type"] == "string_type":  # a YAML key read as a number or a boolean
            given = err.get("input")
            text = str(given).lower() if isinstance(given, bool) else str(given)
            kind = "boolean" if isinstance(given, bool) else "number" if isinstance(given, (int, float)) else type(given).__name__
            lines.append(f"{where}: field '{_format_loc(loc[:-2])}': the name {text} is read as a {kind}, not text")
            hints.append(f"quote the name ('{text}': ...) so YAML reads it as text")
        else:
            given = err.get("input")
            shown = repr(given)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            value_hint = _value_hint(err)
            if value_hint and value_hint not in hints:
                hints.append(value_hint)
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


#: The longest path a recipe or target may name (Linux's PATH_MAX).
MAX_PATH_CHARS = 4096


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
        pos = _position_for(loc, positions)
        where = f"{path}:{pos[0]}:{pos[1]}" if pos else str(path)
        text = str(value)
        longest = max((len(part) for part in text.split("/")), default=0)
        problem = ("contains a NUL character" if "\x00" in text else
                   f"is {len(text)} characters long, more than any file system takes ({MAX_PATH_CHARS})"
                   if len(text) > MAX_PATH_CHARS else
                   f"has a name {longest} characters long, more than file systems take (255)" if longest > 255 else None)  # fmt: skip
        if problem is None:
            try:
                target = value.expanduser() if value.is_absolute() or text.startswith("~") else base_dir / value
            except RuntimeError:  # ~name of no user
                problem = f"starts with '{text.split('/', 1)[0]}', a home folder this host does not know"
        if problem is not None:
            raise error(f"{where}: field '{_format_loc(loc)}': the path {problem}", hint="give a path relative to this file, or an absolute one")
        try:
            special = target.exists() and not (target.is_file() or target.is_dir())
        except OSError:  # too long, a loop of links: the stage that opens it says so
            special = False
        if special:
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
