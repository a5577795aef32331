"""`edgekit build`, `edgekit pack` and `edgekit sign` onto a real full file system (a small tmpfs, root only): a clear error that
names the disk and its free space, exit code 2, no traceback, and nothing half-written left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.cli.main import main
from edgekit.bundle.signing import generate_keypair
from tests.runtime.agent.small_fs import fill, mounted_tmpfs
from tests.runtime.tiny_bundle import build_bundle


@pytest.fixture
def full_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    with mounted_tmpfs(tmp_path / "fs", size_kib=256) as mount_point:
        fill(mount_point)
        yield mount_point


def test_a_build_onto_a_full_disk_says_so_and_leaves_nothing(tiny_recipe, full_disk: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["build", str(tiny_recipe()), "--target", "x86-64-cpu", "--out", str(full_disk / "bundle")]) == 2
    err = capsys.readouterr().err
    assert "error: the build ran out of disk space" in err and "Traceback" not in err
    assert f"output folder (the bundle is staged there) {full_disk}: 0.0 MiB free of 0.2 MiB" in err
    assert "work folder (TMPDIR)" in err and "TMPDIR=/path/with/space" in err
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]  # no staging folder, no partial bundle


def test_a_pack_onto_a_full_disk_says_so_and_leaves_no_partial_tar(tiny_recipe, tmp_path: Path, full_disk: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bundle = tmp_path / "bundle"
    assert main(["build", str(tiny_recipe()), "--target", "x86-64-cpu", "--out", str(bundle)]) == 0
    capsys.readouterr()
    assert main(["pack", str(bundle), "--out", str(full_disk / "tiny.tar")]) == 2
    err = capsys.readouterr().err
    assert "error: edgekit pack ran out of disk space" in err and f"output folder {full_disk}: 0.0 MiB free" in err
    assert "TMPDIR" not in err and "Traceback" not in err
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]


def test_a_sign_on_a_full_disk_says_so_and_leaves_no_partial_signature(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    private, public = tmp_path / "fleet.key.pem", tmp_path / "fleet.pub.pem"
    generate_keypair(private, public)
    with mounted_tmpfs(tmp_path / "fs", size_kib=1024) as mount_point:
        bundle = build_bundle(mount_point / "bundle")  # the bundle first, then the disk fills under it
        before = sorted(p.name for p in bundle.iterdir())
        fill(mount_point)
        assert main(["sign", str(bundle), "--key", str(private)]) == 2
        err = capsys.readouterr().err
        assert "error: edgekit sign ran out of disk space" in err and f"bundle folder {bundle}: 0.0 MiB free" in err
        assert "hint: free space on that disk, or copy the bundle to a larger disk and sign it there" in " ".join(err.split())
        assert "--out" not in err and "Traceback" not in err
        assert sorted(p.name for p in bundle.iterdir()) == before  # no manifest.sig, no .manifest.sig.partial
