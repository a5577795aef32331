"""``edgekit schema recipe|target``, and the published schema files under ``edgekit/schemas/``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgekit.cli import main as cli_main
from edgekit.cli.schema import SCHEMAS, published_path, schema_text


@pytest.fixture(autouse=True)
def only_schema_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_main, "COMMAND_MODULES", ("edgekit.cli.schema",))


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_published_schema_is_current(kind: str):
    path = published_path(kind)
    assert path.is_file(), f"{path} is missing: run `edgekit schema {kind} --out {path}`"
    assert path.read_text() == schema_text(kind), (
        f"{path} is out of date with the models: run `edgekit schema {kind} --out {path}`"
    )


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_schema_prints_to_stdout(kind: str, capsys: pytest.CaptureFixture[str]):
    assert cli_main.main(["schema", kind]) == 0
    out = capsys.readouterr().out
    schema = json.loads(out)
    assert schema == SCHEMAS[kind]()
    assert schema["title"] == {"recipe": "edgekit recipe", "target": "edgekit target profile"}[kind]


def test_schema_out_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "nested" / "target.schema.json"
    assert cli_main.main(["schema", "target", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert out.read_text() == schema_text("target")
    assert "wrote the target JSON Schema to" in captured.err


def test_schema_out_to_an_unwritable_place_fails_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert cli_main.main(["schema", "recipe", "--out", str(blocker / "recipe.schema.json")]) == 2
    err = capsys.readouterr().err
    assert f"error: cannot write the recipe schema to {blocker / 'recipe.schema.json'}" in err.replace("\n", "")
    assert "hint: choose a writable path with --out" in err


def test_schema_rejects_an_unknown_kind(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as info:
        cli_main.main(["schema", "bundle"])
    assert info.value.code == 2
    assert "invalid choice: 'bundle' (choose from 'recipe', 'target')" in capsys.readouterr().err
