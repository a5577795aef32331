"""The shared tar checker (edgekit_runtime.archive) against real hostile tar files."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from pathlib import Path

import pytest

from edgekit_runtime.archive import (
    HEADER_MAX_BYTES,
    ArchiveLimits,
    UnsafeArchiveError,
    extract_bundle_archive,
    scan_bundle_archive,
)
from edgekit_runtime.bundle import open_bundle
from tests.runtime.tiny_bundle import build_bundle

LIMITS = ArchiveLimits(max_unpacked_bytes=8 << 20, max_members=50)


def pack(bundle: Path, out: Path, *, mode: str = "w", top: str | None = "tiny") -> Path:
    with tarfile.open(out, mode) as tar:
        for path in sorted(bundle.rglob("*")):
            relative = path.relative_to(bundle).as_posix()
            tar.add(path, arcname=f"{top}/{relative}" if top else relative, recursive=False)
    return out


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def hostile(out: Path, *members: tarfile.TarInfo, manifest: bool = True) -> Path:
    with tarfile.open(out, "w") as tar:
        if manifest:
            add_bytes(tar, "tiny/manifest.json", b'{"files": {}}')
        for member in members:
            tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isreg() else None)
    return out


def member(name: str, kind: bytes = tarfile.REGTYPE, *, size: int = 1, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = size if kind == tarfile.REGTYPE else 0
    return info


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return build_bundle(tmp_path / "bundle")


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_a_packed_bundle_scans_and_extracts(bundle: Path, tmp_path: Path, mode: str) -> None:
    archive = scan_bundle_archive(pack(bundle, tmp_path / "b.tar", mode=mode), LIMITS)
    assert archive.top == "tiny" and archive.compression == {"w": "none", "w:gz": "gzip", "w:bz2": "bzip2", "w:xz": "xz"}[mode]
    assert archive.manifest_bytes == (bundle / "manifest.json").read_bytes() and archive.signature_bytes is None
    assert archive.unpacked_bytes == sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    root = extract_bundle_archive(archive, tmp_path / "out", LIMITS)
    assert root == tmp_path / "out" / "tiny"
    assert open_bundle(root).name == "tiny-linear-x86-64-cpu-fp32"  # every file's hash verified again


def test_a_bundle_at_the_top_of_the_tar(bundle: Path, tmp_path: Path) -> None:
    archive = scan_bundle_archive(pack(bundle, tmp_path / "b.tar", top=None), LIMITS)
    assert archive.top is None
    assert open_bundle(extract_bundle_archive(archive, tmp_path / "out", LIMITS)).root == tmp_path / "out"


@pytest.mark.parametrize(
    ("info", "fragment"),
    [
        (member("/etc/evil"), "member '/etc/evil' has an absolute or '..' path"),
        (member("tiny/../../evil"), "member 'tiny/../../evil' has an absolute or '..' path"),
        (member("tiny/model.onnx", tarfile.SYMTYPE, link="/etc/passwd"), "member 'tiny/model.onnx' is a link or special file (symbolic link to '/etc/passwd')"),
        (member("tiny/golden", tarfile.LNKTYPE, link="/etc/shadow"), "is a link or special file (hard link to '/etc/shadow')"),
        (member("tiny/dev", tarfile.CHRTYPE), "member 'tiny/dev' is a link or special file (character device)"),
        (member("tiny/disk", tarfile.BLKTYPE), "(block device)"),
        (member("tiny/pipe", tarfile.FIFOTYPE), "member 'tiny/pipe' is a link or special file (FIFO)"),
        (member("tiny/manifest.json"), "member 'tiny/manifest.json' appears twice"),
        (member("other/file.txt"), "member 'other/file.txt' lies outside the bundle folder 'tiny/'"),
        (member("tiny/huge.bin", size=9 << 20), "member 'tiny/huge.bin' (9437184 bytes) makes the unpacked bundle larger than the limit of 8388608 bytes"),
    ],
)
def test_hostile_members_are_refused_before_anything_is_written(tmp_path: Path, info: tarfile.TarInfo, fragment: str) -> None:
    tar = hostile(tmp_path / "hostile.tar", info)
    with pytest.raises(UnsafeArchiveError) as caught:
        scan_bundle_archive(tar, LIMITS)
    assert fragment in caught.value.message and str(tar) in caught.value.message
    assert caught.value.hint


def test_too_many_members(tmp_path: Path) -> None:
    tar = hostile(tmp_path / "many.tar", *(member(f"tiny/f{i:03d}") for i in range(60)))
    with pytest.raises(UnsafeArchiveError, match=r"more than 50 members \(at member 'tiny/f049'\)"):
        scan_bundle_archive(tar, LIMITS)


def test_gzip_bomb_stops_at_the_ratio_limit_quickly(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.tar.gz"
    with tarfile.open(bomb, "w:gz", compresslevel=1) as tar:
        add_bytes(tar, "tiny/manifest.json", b'{"files": {}}')
        add_bytes(tar, "tiny/zeros.bin", bytes(6 << 20))  # under the 8 MiB size limit, but 1000:1
    assert bomb.stat().st_size < 100_000
    started = time.monotonic()
    with pytest.raises(UnsafeArchiveError, match=r"compression ratio \d+:1 at member 'tiny/zeros.bin' is above the limit of 50:1"):
        scan_bundle_archive(bomb, LIMITS)
    assert time.monotonic() - started < 5


def test_a_huge_extended_header_is_refused_without_reading_it(tmp_path: Path) -> None:
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, 1 << 30  # tarfile would read 1 GiB into memory for it
    tar = tmp_path / "pax.tar"
    tar.write_bytes(header.tobuf(format=tarfile.GNU_FORMAT) + bytes(4096))
    with pytest.raises(UnsafeArchiveError, match=rf"a tar header of 1073741824 bytes .* is larger than {HEADER_MAX_BYTES} bytes"):
        scan_bundle_archive(tar, LIMITS)


def test_truncated_tar(bundle: Path, tmp_path: Path) -> None:
    whole = pack(bundle, tmp_path / "whole.tar")
    with tarfile.open(whole) as tar:
        model = tar.getmember("tiny/model.onnx")
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole.read_bytes()[: model.offset_data + model.size // 2])  # the copy stopped inside model.onnx
    with pytest.raises(UnsafeArchiveError, match=r"cut.tar: not a complete, readable tar \(at member 'tiny/model.onnx'\): unexpected end of data"):
        scan_bundle_archive(cut, LIMITS)


def test_truncated_gzip(bundle: Path, tmp_path: Path) -> None:
    whole = pack(bundle, tmp_path / "whole.tar.gz", mode="w:gz").read_bytes()
    tar = tmp_path / "cut.tar.gz"
    tar.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UnsafeArchiveError, match="not a complete, readable tar .*Compressed file ended"):
        scan_bundle_archive(tar, LIMITS)


def test_not_a_tar(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(os.urandom(3000))
    with pytest.raises(UnsafeArchiveError, match="not a complete, readable tar"):
        scan_bundle_archive(junk, LIMITS)


def test_no_manifest(tmp_path: Path) -> None:
    with pytest.raises(UnsafeArchiveError, match="has no manifest.json at its top or in a single top folder"):
        scan_bundle_archive(hostile(tmp_path / "none.tar", member("tiny/readme.txt"), manifest=False), LIMITS)


def test_extraction_writes_only_listed_files_with_their_hashes(bundle: Path, tmp_path: Path) -> None:
    (bundle / "extra.sh").write_text("#!/bin/sh\nrm -rf /\n", encoding="utf-8")
    archive = scan_bundle_archive(pack(bundle, tmp_path / "extra.tar"), LIMITS)
    with pytest.raises(UnsafeArchiveError, match="member 'tiny/extra.sh' is not listed in manifest.json files"):
        extract_bundle_archive(archive, tmp_path / "out", LIMITS)
    (bundle / "extra.sh").unlink()

    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    (bundle / manifest["model"]["path"]).write_bytes(b"not the model that was hashed")
    archive = scan_bundle_archive(pack(bundle, tmp_path / "swapped.tar"), LIMITS)
    with pytest.raises(UnsafeArchiveError, match=r"member 'tiny/model.onnx' does not match its sha256 in manifest.json \(expected [0-9a-f]{12}"):
        extract_bundle_archive(archive, tmp_path / "out2", LIMITS)
    assert not (tmp_path / "out2" / "tiny" / "model.onnx").exists()


def test_archive_replaced_between_the_passes(bundle: Path, tmp_path: Path) -> None:
    tar = pack(bundle, tmp_path / "b.tar")
    archive = scan_bundle_archive(tar, LIMITS)
    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    manifest["name"] = "swapped-after-the-signature-check"
    (bundle / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    pack(bundle, tar)
    with pytest.raises(UnsafeArchiveError, match="'tiny/manifest.json' changed while the archive was being read"):
        extract_bundle_archive(archive, tmp_path / "out", LIMITS)
