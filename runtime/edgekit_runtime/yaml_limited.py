"""Reading YAML that may be hostile, with limits that hold before any work grows with the input.

One reader for every YAML file edgekit reads: recipes and target profiles on the host
(:mod:`edgekit.config`) and the agent's own configuration on the device
(:mod:`edgekit_runtime.agent.config`). The file size is checked before it is read; the nesting depth and
the number of nodes the document has once its aliases are expanded are counted while the YAML is
composed, so an alias bomb or a recursive alias is refused after a few hundred nodes, not after
gigabytes; bytes that are not UTF-8, characters YAML does not allow, lone surrogate escapes, duplicate
keys and values PyYAML cannot construct are named errors with their line and column. Every failure is
raised as the caller's error class (an :class:`~edgekit_runtime.errors.EdgekitError` subclass).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from edgekit_runtime.errors import EdgekitError

#: The largest YAML file read (recipes, target profiles and agent configs are a few KB).
MAX_YAML_BYTES = 1 << 20
#: The deepest nesting of mappings and sequences (aliases expanded); recipes need about 8.
MAX_YAML_DEPTH = 48
#: The most nodes a document may have with every alias expanded (the shipped recipes have under 300).
MAX_YAML_NODES = 100_000

#: A path of keys and list indexes into a document, e.g. ``("build", "dims", 0)``.
Location = tuple[str | int, ...]
#: Location -> (line, column), both 1-based.
Positions = dict[Location, tuple[int, int]]

_SURROGATE = re.compile("[\ud800-\udfff]")


class _LimitError(yaml.composer.ComposerError):
    """The document breaks one of the reader's limits (nesting, size with aliases, recursive alias)."""


class LimitedLoader(yaml.SafeLoader):
    """A SafeLoader that records the line/column of every mapping key and sequence item, and refuses
    documents that nest too deep or expand (through aliases) to too many nodes while composing them."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.positions: Positions = {}
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
        if deepest > MAX_YAML_DEPTH:
            raise _LimitError(
                None, None, f"{what} nests deeper than {MAX_YAML_DEPTH} levels of mappings and sequences (aliases expanded)", mark
            )
        if self._nodes > MAX_YAML_NODES:
            raise _LimitError(
                None, None,
                f"{what} makes the document larger than {MAX_YAML_NODES:,} values with its aliases expanded "
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


#: Numbers in exponent form as YAML 1.2 writes them (``1e-4``, ``2E6``, ``-1.5e3``): YAML 1.1, which PyYAML reads,
#: takes them as text unless they have a decimal point and a signed exponent (``1.0e-4``). Read as floats, as every
#: YAML 1.2 editor and JSON read them; a quoted ``'1e-4'`` stays text.
EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")
LimitedLoader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789."))


def _duplicate_key_check(node: yaml.Node, path: Path, error: type[EdgekitError]) -> None:
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
            _duplicate_key_check(value_node, path, error)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _duplicate_key_check(item, path, error)


def read_limited_bytes(path: Path, error: type[EdgekitError], what: str = "file", *,
                       too_large_hint: str = "is this the right file?", missing_hint: str | None = None) -> bytes:  # fmt: skip
    """The bytes of a YAML file, read once and at most :data:`MAX_YAML_BYTES` of them; a missing file, a
    folder or too large a file raise ``error``."""
    path = Path(path)
    if not path.is_file():
        raise error(
            f"{what} not found: {path}" + (" (it is a directory)" if path.is_dir() else ""),
            hint=missing_hint or f"check the path; the current directory is {Path.cwd()}",
        )
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise error(f"{path}: the {what} is {size:,} bytes; configuration files are read up to {MAX_YAML_BYTES:,} bytes",
                    hint=too_large_hint)  # fmt: skip
    with path.open("rb") as handle:
        raw = handle.read(MAX_YAML_BYTES + 1)
    if len(raw) > MAX_YAML_BYTES:  # it grew after stat
        raise error(f"{path}: the {what} is larger than {MAX_YAML_BYTES:,} bytes", hint="is this the right file?")
    return raw


def decode_utf8(raw: bytes, path: Path, error: type[EdgekitError], what: str = "file") -> str:
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


def _line_column(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of character ``offset`` in ``text``."""
    line_start = text.rfind("\n", 0, offset) + 1
    return text.count("\n", 0, offset) + 1, offset - line_start + 1


def parse_yaml_limited(raw: bytes, path: Path, error: type[EdgekitError], what: str = "file", *,
                       empty_hint: str | None = None) -> tuple[Any, Positions]:  # fmt: skip
    """Parse the bytes of a YAML file (``path`` names it in errors); return (data, positions). An empty
    document, a document over the limits, duplicate keys and syntax errors raise ``error``."""
    path = Path(path)
    text = decode_utf8(raw, path, error, what)
    loader: LimitedLoader | None = None
    try:
        loader = LimitedLoader(text)  # checks that every character is printable
        node = loader.get_single_node()
        if node is None:
            raise error(f"{path}: the {what} is empty", hint=empty_hint)
        _duplicate_key_check(node, path, error)
        loader.record(node, ())
        data = loader.construct_document(node)
    except _LimitError as exc:
        mark = exc.problem_mark
        raise error(
            f"{path}:{mark.line + 1}:{mark.column + 1}: {exc.problem}",
            hint=f"the {what} is a small hand-written file: write the values out instead of nesting anchors and aliases",
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
