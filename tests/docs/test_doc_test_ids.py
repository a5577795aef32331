"""Test ids the docs cite (`tests/x/test_y.py::test_z`, docs/threats.md's last column) name tests that exist: a
renamed test left docs/threats.md citing one that no longer did."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.doc_blocks import REPO, doc_files

TEST_ID = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")


def cited_test_problems(text: str, root: Path = REPO) -> list[str]:
    problems = []
    for match in TEST_ID.finditer(text):
        path, name = root / match.group(1), match.group(2)
        if not path.is_file():
            problems.append(f"{match.group(0)}: no file {match.group(1)}")
        elif not re.search(rf"^\s*((async\s+)?def {name}\(|class {name}\b)", path.read_text(encoding="utf-8"), re.MULTILINE):
            problems.append(f"{match.group(0)}: {match.group(1)} has no test {name}")
    return problems


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_cited_test_ids_exist(doc: Path) -> None:
    problems = cited_test_problems(doc.read_text(encoding="utf-8"))
    assert not problems, f"{doc.relative_to(REPO)}:\n" + "\n".join(problems)


def test_the_checker_names_a_missing_test_and_a_missing_file() -> None:
    assert cited_test_problems("tests/docs/test_doc_test_ids.py::test_cited_test_ids_exist") == []
    assert cited_test_problems("tests/docs/test_doc_test_ids.py::test_gone") == [
        "tests/docs/test_doc_test_ids.py::test_gone: tests/docs/test_doc_test_ids.py has no test test_gone"]
    assert cited_test_problems("tests/nowhere.py::test_x") == ["tests/nowhere.py::test_x: no file tests/nowhere.py"]
