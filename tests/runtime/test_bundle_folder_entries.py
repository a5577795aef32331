"""Folder entries in a bundle tar (review finding: a folder bomb inside a signed tar): no manifest hash or
limit covers them, so they are never created, a member too deep is refused by name, and verification
reports a folder in a bundle directory that holds no listed file. Real tar files, a real bundle, the
real filesystem."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from edgekit_runtime import archive as archive_module
from edgekit_runtime.archive import ArchiveLimits, UnsafeArchiveError, extract_bundle_archive, scan_bundle_archive
from edgekit_runtime.bundle import open_bundle, verify_files
from edgekit_runtime.errors import BundleError
from tests.runtime.tiny_bundle import build_bundle, load_manifest

LIMITS = ArchiveLimits(max_unpacked_bytes=8 << 20, max_members=500)
MAX_MEMBER_DEPTH = 32  # archive.MAX_MEMBER_DEPTH, checked below


def _tar_with_folders(bundle: Path, out: Path, folders: list[str]) -> Path:
    """The bundle's files under ``tiny/`` (as ``tar`` packs a folder: folder entries included), plus ``folders``."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(bundle.rglob("*")):
            tar.add(path, arcname=f"tiny/{path.relative_to(bundle).as_posix()}", recursive=False)
        for name in folders:
            info = tarfile.TarInfo(f"tiny/{name}")
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
    return out


def _folders(root: Path) -> list[str]:
    return sorted(Path(d).relative_to(root).as_posix() for d, _, _ in os.walk(root) if Path(d) != root)


def test_folder_entries_are_not_created_only_the_folders_of_listed_files(tmp_path: Path) -> None:
    bundle = build_bundle(tmp_path / "bundle")
    holders = _folders(bundle)  # the folders the listed files lie in (golden/...)
    assert holders, "the tiny bundle keeps files in sub-folders"
    extra = [f"d{i}/" + "/".join(["a"] * 20) for i in range(40)] + ["empty"]
    archive = scan_bundle_archive(_tar_with_folders(bundle, tmp_path / "b.tar", extra), LIMITS)
    root = extract_bundle_archive(archive, tmp_path / "out", LIMITS)
    assert _folders(root) == holders  # before: 40 x 21 + 1 extra folders, unsigned, installed
    assert open_bundle(root).name == "tiny-linear-x86-64-cpu-fp32"


@pytest.mark.parametrize("depth", [MAX_MEMBER_DEPTH, 400, 1000])
def test_a_member_deeper_than_the_limit_is_refused_by_name(tmp_path: Path, depth: int) -> None:
    bundle = build_bundle(tmp_path / "bundle")
    tar = _tar_with_folders(bundle, tmp_path / "b.tar", ["/".join(["a"] * depth)])  # tiny/ + depth parts
    with pytest.raises(UnsafeArchiveError) as caught:
        scan_bundle_archive(tar, LIMITS)  # before: accepted (400) or RecursionError (1000) later
    assert f"{depth + 1} folders deep, deeper than the limit of {MAX_MEMBER_DEPTH} (MAX_MEMBER_DEPTH)" in caught.value.message
    assert "edgekit pack" in (caught.value.hint or "")
    assert not (tmp_path / "out").exists()


def test_a_member_at_the_depth_limit_is_accepted(tmp_path: Path) -> None:
    assert getattr(archive_module, "MAX_MEMBER_DEPTH", None) == MAX_MEMBER_DEPTH
    bundle = build_bundle(tmp_path / "bundle")
    tar = _tar_with_folders(bundle, tmp_path / "b.tar", ["/".join(["a"] * (MAX_MEMBER_DEPTH - 1))])
    root = extract_bundle_archive(scan_bundle_archive(tar, LIMITS), tmp_path / "out", LIMITS)
    assert not (root / "a").exists()


def test_verification_reports_folders_that_hold_no_listed_file(tmp_path: Path) -> None:
    bundle = build_bundle(tmp_path / "bundle")
    verify_files(bundle, load_manifest(bundle))  # the folders of listed files are fine
    (bundle / "empty").mkdir()
    (bundle / "deep" / "a" / "a" / "a").mkdir(parents=True)
    (bundle / "golden" / "cache").mkdir()  # inside a folder that does hold listed files
    with pytest.raises(BundleError) as caught:
        verify_files(bundle, load_manifest(bundle))  # before: passed, the folders are empty
    message = caught.value.message
    assert "3 problem(s)" in message
    for folder in ("deep/", "empty/", "golden/cache/"):
        assert f"unlisted: {folder} (a folder that holds no file manifest.json lists)" in message
    assert "deep/a" not in message  # one line for an unlisted tree, however deep


def test_a_bundle_directory_with_an_empty_folder_deploys_as_its_tar_would(tmp_path: Path) -> None:
    """Copied from a local directory, only the folders of its files are made (as from a tar), so the copy verifies; before,
    the empty folder was copied and the new folder check refused the directory that the same bundle's tar passed."""
    from edgekit_runtime.agent.fetch import _copy_directory

    bundle = build_bundle(tmp_path / "bundle")
    (bundle / "notes").mkdir()
    copy = tmp_path / "copy"
    _copy_directory(bundle, copy, url=str(bundle), max_bytes=8 << 20)
    assert not (copy / "notes").exists()
    verify_files(copy, load_manifest(copy))
