"""edgekit-runtime supports Python 3.10 (JetPack 6); see README, "Supported device software".

The code may use 3.10 features (``zip(strict=)``, ``match``, ``X | Y`` evaluated at run time) but no
3.11+ syntax or standard-library names. CI also runs the runtime's tests under a real 3.10 where one
is installed (pyenv); this test catches the common slips on any interpreter."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
FLOOR = (3, 10)

# Standard-library names that appeared after the floor: module -> attributes (empty: the module itself).
NEWER_STDLIB: dict[str, set[str]] = {
    "tomllib": set(),  # 3.11
    "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type", "Required",
               "NotRequired", "dataclass_transform", "override", "TypeAliasType", "get_overloads"},  # fmt: skip
    "enum": {"StrEnum", "ReprEnum", "verify", "EnumCheck", "member", "nonmember"},
    "datetime": {"UTC"},
    "asyncio": {"TaskGroup", "timeout", "Runner"},
    "hashlib": {"file_digest"},
    "itertools": {"batched"},
    "builtins": {"ExceptionGroup", "BaseExceptionGroup"},
}
SOURCES = sorted((RUNTIME / "edgekit_runtime").rglob("*.py"))


def test_requires_python_is_the_floor() -> None:
    text = (RUNTIME / "pyproject.toml").read_text()
    assert re.search(r'^requires-python = ">=3\.10"$', text, re.MULTILINE), "runtime/pyproject.toml requires-python"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(RUNTIME)))
def test_module_uses_nothing_newer_than_the_floor(path: Path) -> None:
    source = path.read_text()
    tree = ast.parse(source, filename=str(path), feature_version=FLOOR)  # 3.11+ syntax is a SyntaxError
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name in NEWER_STDLIB and not NEWER_STDLIB[alias.name]]
        elif isinstance(node, ast.ImportFrom) and node.module in NEWER_STDLIB:
            names = NEWER_STDLIB[node.module]
            found += [f"{node.module}.{alias.name}" for alias in node.names if not names or alias.name in names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.attr in NEWER_STDLIB.get(node.value.id, ()):
                found.append(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Name) and node.id in NEWER_STDLIB["builtins"]:
            found.append(node.id)
        elif type(node).__name__ == "TryStar":  # except* (3.11), in case feature_version let it through
            found.append("except*")
    assert not found, f"{path.relative_to(RUNTIME)} uses {sorted(set(found))}, newer than Python {FLOOR[0]}.{FLOOR[1]}"
