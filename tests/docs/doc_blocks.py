"""Fenced code blocks of the project's Markdown, with the ``doc-test`` marker that precedes each.

The docs are tests (issue 19): every fenced block in README.md, docs/**/*.md, runtime/*.md and any
Mosquitto README is one test, named ``FILE:LINE`` (the line of its opening fence). What the test does
depends on the block's language and on an optional HTML comment on the line(s) just before the fence:

    <!-- doc-test: skip reason="needs a Jetson" -->          not run; the reason is required and listed
    <!-- doc-test: validate="recipe" -->                     a YAML/JSON block checked by that validator
    <!-- doc-test: validate="recipe-fragment" base="recipes/digits-cnn.yaml" -->
    <!-- doc-test: output="edgekit-agent detect --root tests/.../orin_nano" ignore="^onnxruntime" -->

The last one is for program output shown after a ``$ command`` line: the harness runs the marker's
command from the repository root (where the shown one needs a device, the marker names a fixture) and
its stdout must equal the block's lines after the ``$`` line, except lines matching ``ignore``.

Languages: ``bash``/``sh``/``shell`` blocks are run, ``python`` blocks executed, ``yaml``/``json``
blocks validated (they need a ``validate`` marker, or ``skip``), and ``text``/``conf`` blocks (trees,
diagrams, program output, other tools' configuration) are shown to readers only and listed as such.
A fence without a language is an error, so that no command hides in an untagged block.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RUN_LANGUAGES = frozenset({"bash", "sh", "shell"})
PYTHON_LANGUAGES = frozenset({"python", "py"})
DATA_LANGUAGES = frozenset({"yaml", "yml", "json"})
#: blocks that are not code for this project: file trees, diagrams, program output, other tools' files
SHOWN_LANGUAGES = frozenset({"text", "conf", "console-output"})
LANGUAGES = RUN_LANGUAGES | PYTHON_LANGUAGES | DATA_LANGUAGES | SHOWN_LANGUAGES

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*doc-test:(?P<body>.*?)-->\s*$")


class DocMarkerError(ValueError):
    """A ``doc-test`` marker that cannot be read (names the file and line)."""


@dataclass(frozen=True)
class DocBlock:
    """One fenced block: where it is, its language, its text (indentation removed) and its marker."""

    path: Path
    line: int
    language: str
    text: str
    marker: dict[str, str] = field(default_factory=dict)

    @property
    def relpath(self) -> str:
        try:
            return self.path.relative_to(REPO).as_posix()
        except ValueError:
            return self.path.as_posix()

    @property
    def test_id(self) -> str:
        return f"{self.relpath}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        return self.marker.get("reason") if "skip" in self.marker else None

    @property
    def kind(self) -> str:
        """``skip``, ``run``, ``python``, ``validate``, ``output``, ``shown`` or ``unknown`` (an error)."""
        if "skip" in self.marker:
            return "skip"
        if "output" in self.marker:
            return "output"
        if self.language in RUN_LANGUAGES:
            return "run"
        if self.language in PYTHON_LANGUAGES:
            return "python"
        if self.language in DATA_LANGUAGES:
            return "validate"
        if self.language in SHOWN_LANGUAGES:
            return "shown"
        return "unknown"


def doc_files(root: Path = REPO) -> list[Path]:
    """README.md, docs/**/*.md, runtime/*.md and every Mosquitto README under the repository."""
    found = {root / "README.md"} if (root / "README.md").is_file() else set()
    found.update((root / "docs").rglob("*.md"))
    found.update((root / "runtime").glob("*.md"))
    found.update(p for p in root.rglob("README.md") if "mosquitto" in p.parent.name.lower()
                 and not {".venv", "node_modules", ".git"} & set(p.relative_to(root).parts))
    return sorted(found)


def parse_marker(text: str, *, where: str) -> dict[str, str]:
    """``skip reason="x" validate=recipe`` -> ``{"skip": "", "reason": "x", "validate": "recipe"}``."""
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise DocMarkerError(f"{where}: unreadable doc-test marker {text!r}: {err}") from err
    marker: dict[str, str] = {}
    for word in words:
        key, _, value = word.partition("=")
        if not re.fullmatch(r"[a-z][a-z0-9-]*", key):
            raise DocMarkerError(f"{where}: doc-test marker word {word!r} is not key or key=value")
        marker[key] = value
    if "skip" in marker and not marker.get("reason"):
        raise DocMarkerError(f'{where}: a doc-test skip needs a reason: <!-- doc-test: skip reason="needs a Jetson" -->')
    return marker


def extract_blocks(path: Path) -> list[DocBlock]:
    """The fenced blocks of one Markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[DocBlock] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence, info = opening["indent"], opening["fence"], opening["info"].strip()
        start = index
        body: list[str] = []
        index += 1
        while index < len(lines):
            closing = _FENCE.match(lines[index])
            if closing and closing["fence"][0] == fence[0] and len(closing["fence"]) >= len(fence) and not closing["info"].strip():
                break
            line = lines[index]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            index += 1
        index += 1
        marker: dict[str, str] = {}
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        if before >= 0 and (found := _MARKER.match(lines[before])):
            marker = parse_marker(found["body"], where=f"{path}:{before + 1}")
        language = info.split()[0].lower() if info else ""
        blocks.append(DocBlock(path, start + 1, language, "\n".join(body) + "\n", marker))
    return blocks


def all_blocks(root: Path = REPO) -> list[DocBlock]:
    return [block for path in doc_files(root) for block in extract_blocks(path)]


_SPAN = re.compile(r"(?<!`)`(?P<code>(?:edgekit|edgekit-agent) [^`]+)`(?!`)")


def command_spans(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of the inline code spans outside fenced blocks that show an ``edgekit`` or
    ``edgekit-agent`` command line (synopses in tables and prose)."""
    fenced: set[int] = set()
    for block in extract_blocks(path):
        fenced.update(range(block.line, block.line + block.text.count("\n") + 2))
    spans: list[tuple[int, str]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if number not in fenced:
            spans.extend((number, found["code"]) for found in _SPAN.finditer(line))
    return spans
