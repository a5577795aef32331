"""``edgekit pack`` (edgekit/bundle/pack.py): where the tar goes, and what an --out it cannot use gives."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from edgekit.bundle.pack import pack_bundle
from edgekit.cli.main import main
from tests.runtime.tiny_bundle import build_bundle


def test_the_default_tar_keeps_every_dotted_part_of_the_folder_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """detector-v1.2 and detector-v1.3 pack into two tars (not both into detector-v1.tar)."""
    first, second = build_bundle(tmp_path / "detector-v1.2"), build_bundle(tmp_path / "detector-v1.3")
    assert pack_bundle(first) == tmp_path / "detector-v1.2.tar"
    assert pack_bundle(second) == tmp_path / "detector-v1.3.tar"
    assert sorted(p.name for p in tmp_path.glob("*.tar")) == ["detector-v1.2.tar", "detector-v1.3.tar"]
    monkeypatch.chdir(first)  # "." resolves to its folder's name
    assert pack_bundle(Path("."), force=True) == tmp_path / "detector-v1.2.tar"
    with tarfile.open(tmp_path / "detector-v1.2.tar") as tar:
        assert "tiny-linear-x86-64-cpu-fp32/manifest.json" in tar.getnames()


@pytest.mark.parametrize("force", [False, True])
def test_an_out_that_is_a_folder_is_refused_and_nothing_is_left(tmp_path: Path, force: bool, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = build_bundle(tmp_path / "b")
    (tmp_path / "out").mkdir()
    code = main(["pack", str(bundle), "--out", str(tmp_path / "out"), *(["--force"] if force else [])])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "Traceback" not in err
    assert f"cannot write {tmp_path / 'out'}: --out names a folder; it must name the tar file to write" in err
    assert f"hint: pass a tar file path, e.g. --out {tmp_path / 'out' / 'tiny-linear-x86-64-cpu-fp32.tar'}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "out"]  # no hidden .out.partial
    assert list((tmp_path / "out").iterdir()) == []


def test_a_failed_rename_leaves_no_partial_tar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = build_bundle(tmp_path / "b")

    def refuse(self: Path, target: object) -> Path:
        raise PermissionError(13, "Permission denied", str(target))

    monkeypatch.setattr(Path, "replace", refuse)
    with pytest.raises(PermissionError):
        pack_bundle(bundle, tmp_path / "b.tar")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
