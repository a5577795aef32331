"""A small, strict parser of Prometheus' text exposition format 0.0.4, to check what /metrics serves."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE_RE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})? (\S+)(?: (-?\d+))?$")
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass
class Family:
    name: str
    type: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def value(self, labels: dict[str, str]) -> float:
        matches = [value for sample_labels, value in self.samples if sample_labels == labels]
        if len(matches) != 1:
            raise AssertionError(f"{self.name}{labels}: {len(matches)} samples, expected 1 among {self.samples}")
        return matches[0]


def _labels(text: str, line: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _LABEL_RE.match(text, position)
        if match is None:
            raise ValueError(f"bad labels at {text[position:]!r} in {line!r}")
        name = match.group(1)
        if name in labels:
            raise ValueError(f"label {name} twice in {line!r}")
        labels[name] = re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], match.group(2))
        position = match.end()
        if position < len(text):
            if text[position] != ",":
                raise ValueError(f"expected ',' at {text[position:]!r} in {line!r}")
            position += 1
    return labels


def _value(text: str, line: str) -> float:
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if text in special:
        return special[text]
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"bad value {text!r} in {line!r}") from None


def parse_exposition(text: str) -> dict[str, Family]:
    """Families by name; raises ValueError on anything the format does not allow."""
    if not text.endswith("\n"):
        raise ValueError("the exposition must end with a line feed")
    families: dict[str, Family] = {}
    helps: dict[str, str] = {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            helps[name] = help_text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            if kind not in _TYPES or name in families:
                raise ValueError(f"bad or repeated TYPE line {line!r}")
            families[name] = Family(name, kind, helps.get(name, ""))
        elif line.startswith("#"):
            continue
        else:
            match = _SAMPLE_RE.match(line)
            if match is None:
                raise ValueError(f"not a sample line: {line!r}")
            name = match.group(1)
            if name not in families:
                raise ValueError(f"sample {name} before its TYPE line")
            families[name].samples.append((_labels(match.group(2) or "", line), _value(match.group(3), line)))
    return families
