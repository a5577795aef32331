"""A small JSON Schema (draft 2020-12) validator for the keywords edgekit's message schemas use.

The device runtime validates commands and outgoing messages without third-party packages, so it
carries this subset instead of ``jsonschema``. It understands:

* structure: ``type``, ``enum``, ``const``, ``properties``, ``required``, ``additionalProperties``,
  ``items``, ``minItems``, ``maxItems``;
* values: ``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, ``minLength``,
  ``maxLength``, ``pattern`` (searched, not anchored, as the spec says);
* composition: ``$ref`` to ``#/...`` inside the same document, ``allOf``, ``anyOf``, ``oneOf``,
  ``not``, ``if``/``then``/``else``;
* annotations, which it ignores: ``$schema``, ``$id``, ``$defs``, ``$comment``, ``title``,
  ``description``, ``format``, ``default``, ``examples``, ``deprecated``, ``readOnly``, ``writeOnly``.

Any other keyword is refused up front by :func:`check_supported`, so a schema can never silently
validate less than it says. Problems quote values in at most :data:`MAX_QUOTED_CHARS` characters
(``...`` marks the cut), so the problems found in an untrusted message stay small. The host side validates the same files with ``jsonschema``; a test
checks that both agree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

from edgekit_runtime.errors import InternalError

ANNOTATIONS = frozenset(
    {"$schema", "$id", "$defs", "$comment", "title", "description", "format", "default", "examples",
     "deprecated", "readOnly", "writeOnly"}  # fmt: skip
)
ASSERTIONS = frozenset(
    {"type", "enum", "const", "properties", "required", "additionalProperties", "items", "minItems",
     "maxItems", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
     "pattern", "$ref", "allOf", "anyOf", "oneOf", "not", "if", "then", "else"}  # fmt: skip
)
#: Longest quotation of a value in a problem; longer ``repr``s end in ``...``.
MAX_QUOTED_CHARS = 120
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_SUBSCHEMA_SINGLE = ("additionalProperties", "items", "not", "if", "then", "else")


def check_supported(schema: Mapping[str, Any], where: str = "#") -> None:
    """Raise :class:`InternalError` when ``schema`` (or any subschema) uses a keyword this validator lacks."""
    for key, value in schema.items():
        if key not in ANNOTATIONS and key not in ASSERTIONS:
            raise InternalError(f"schema keyword '{key}' at {where} is not supported by edgekit's validator")
        if key in ("properties", "$defs"):
            for name, sub in value.items():
                check_supported(sub, f"{where}/{key}/{name}")
        elif key in _SUBSCHEMA_LISTS:
            for index, sub in enumerate(value):
                check_supported(sub, f"{where}/{key}/{index}")
        elif key in _SUBSCHEMA_SINGLE and isinstance(value, Mapping):
            check_supported(value, f"{where}/{key}")


def iter_errors(instance: Any, schema: Mapping[str, Any]) -> Iterator[str]:
    """Every way ``instance`` breaks ``schema``, as ``"<path>: <problem>"`` strings."""
    yield from _Validation(schema).errors(instance, schema, "")


def _quote(value: Any) -> str:
    """``repr(value)`` cut to :data:`MAX_QUOTED_CHARS` (without building the ``repr`` of a huge container)."""
    if isinstance(value, (Mapping, list, tuple)) and len(value) > MAX_QUOTED_CHARS:
        return f"<{type(value).__name__} of {len(value)} items>"
    text = repr(value)
    return text if len(text) <= MAX_QUOTED_CHARS else text[: MAX_QUOTED_CHARS - 3] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _json_type_matches(value: Any, json_type: str) -> bool:
    if json_type == "null":
        return value is None
    if json_type == "boolean":
        return isinstance(value, bool)
    if json_type == "object":
        return isinstance(value, Mapping)
    if json_type == "array":
        return isinstance(value, (list, tuple))
    if json_type == "string":
        return isinstance(value, str)
    if json_type == "number":
        return _is_number(value)
    if json_type == "integer":
        return _is_number(value) and (isinstance(value, int) or (math.isfinite(value) and value.is_integer()))
    raise InternalError(f"unknown JSON type '{json_type}' in a schema")


def _json_equal(left: Any, right: Any) -> bool:
    """JSON equality: ``True`` is not ``1``; ``1`` equals ``1.0``; containers compare deeply."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if _is_number(left) and _is_number(right):
        return left == right
    if isinstance(left, Mapping) and isinstance(right, Mapping):
        return left.keys() == right.keys() and all(_json_equal(left[k], right[k]) for k in left)
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return len(left) == len(right) and all(_json_equal(a, b) for a, b in zip(left, right))
    return type(left) is type(right) and left == right


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


class _Validation:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self._root = root

    def _resolve(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#"):
            raise InternalError(f"only same-document $ref is supported, got '{ref}'")
        node: Any = self._root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node

    def is_valid(self, instance: Any, schema: Mapping[str, Any]) -> bool:
        return next(self.errors(instance, schema, ""), None) is None

    def errors(self, instance: Any, schema: Mapping[str, Any] | bool, path: str) -> Iterator[str]:
        where = path or "(root)"
        if schema is True:
            return
        if schema is False:
            yield f"{where}: no value is allowed here"
            return
        if "$ref" in schema:
            yield from self.errors(instance, self._resolve(schema["$ref"]), path)
        if "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not any(_json_type_matches(instance, t) for t in types):
                yield f"{where}: {_quote(instance)} is not of type {' or '.join(types)}"
                return
        if "const" in schema and not _json_equal(instance, schema["const"]):
            yield f"{where}: expected {schema['const']!r}, got {_quote(instance)}"
        if "enum" in schema and not any(_json_equal(instance, option) for option in schema["enum"]):
            yield f"{where}: {_quote(instance)} is not one of {schema['enum']!r}"
        if _is_number(instance):
            yield from self._number_errors(instance, schema, where)
        elif isinstance(instance, str):
            yield from self._string_errors(instance, schema, where)
        elif isinstance(instance, Mapping):
            yield from self._object_errors(instance, schema, path)
        elif isinstance(instance, (list, tuple)):
            yield from self._array_errors(instance, schema, path)
        yield from self._composition_errors(instance, schema, path)

    def _number_errors(self, value: float, schema: Mapping[str, Any], where: str) -> Iterator[str]:
        if "minimum" in schema and value < schema["minimum"]:
            yield f"{where}: {_quote(value)} is less than the minimum of {schema['minimum']!r}"
        if "maximum" in schema and value > schema["maximum"]:
            yield f"{where}: {_quote(value)} is more than the maximum of {schema['maximum']!r}"
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            yield f"{where}: {_quote(value)} must be more than {schema['exclusiveMinimum']!r}"
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            yield f"{where}: {_quote(value)} must be less than {schema['exclusiveMaximum']!r}"

    def _string_errors(self, value: str, schema: Mapping[str, Any], where: str) -> Iterator[str]:
        if "minLength" in schema and len(value) < schema["minLength"]:
            yield f"{where}: {_quote(value)} is shorter than {schema['minLength']} characters"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            yield f"{where}: string of {len(value)} characters is longer than {schema['maxLength']}"
        if "pattern" in schema and _compiled(schema["pattern"]).search(value) is None:
            yield f"{where}: {_quote(value)} does not match the pattern {schema['pattern']!r}"

    def _object_errors(self, value: Mapping[str, Any], schema: Mapping[str, Any], path: str) -> Iterator[str]:
        where = path or "(root)"
        for name in schema.get("required", ()):
            if name not in value:
                yield f"{where}: required property '{name}' is missing"
        properties: Mapping[str, Any] = schema.get("properties", {})
        for name, sub in properties.items():
            if name in value:
                yield from self.errors(value[name], sub, _join(path, name))
        extra = schema.get("additionalProperties", True)
        for name in value:
            if name in properties:
                continue
            if extra is False:
                yield f"{where}: unexpected property {_quote(name)}"
            elif isinstance(extra, Mapping):
                yield from self.errors(value[name], extra, _join(path, name))

    def _array_errors(self, value: list[Any] | tuple[Any, ...], schema: Mapping[str, Any], path: str) -> Iterator[str]:
        where = path or "(root)"
        if "minItems" in schema and len(value) < schema["minItems"]:
            yield f"{where}: {len(value)} items, fewer than the minimum of {schema['minItems']}"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            yield f"{where}: {len(value)} items, more than the maximum of {schema['maxItems']}"
        if "items" in schema:
            for index, item in enumerate(value):
                yield from self.errors(item, schema["items"], _join(path, index))

    def _composition_errors(self, instance: Any, schema: Mapping[str, Any], path: str) -> Iterator[str]:
        where = path or "(root)"
        for sub in schema.get("allOf", ()):
            yield from self.errors(instance, sub, path)
        if "anyOf" in schema and not any(self.is_valid(instance, sub) for sub in schema["anyOf"]):
            yield f"{where}: {_quote(instance)} matches none of the allowed forms"
        if "oneOf" in schema:
            matches = sum(self.is_valid(instance, sub) for sub in schema["oneOf"])
            if matches != 1:
                yield f"{where}: {_quote(instance)} matches {matches} of the forms, expected exactly one"
        if "not" in schema and self.is_valid(instance, schema["not"]):
            yield f"{where}: {_quote(instance)} matches a form that is not allowed"
        if "if" in schema:
            branch = "then" if self.is_valid(instance, schema["if"]) else "else"
            if branch in schema:
                yield from self.errors(instance, schema[branch], path)
