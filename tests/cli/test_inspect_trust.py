"""``edgekit inspect``: signatures (--key, --require-signature) and hostile tars (a clean exit 2, never a traceback)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from edgekit.bundle.signing import generate_keypair, sign_bundle
from edgekit.cli.main import main
from tests.runtime.tiny_bundle import build_bundle, load_manifest, save_manifest


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("keys")
    pairs = {}
    for name in ("fleet", "foreign"):
        pairs[name] = (directory / f"{name}.key.pem", directory / f"{name}.pub.pem")
        generate_keypair(*pairs[name])
    return pairs


@pytest.fixture
def signed(tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> Path:
    root = build_bundle(tmp_path / "bundle")
    sign_bundle(root, keys["fleet"][0])
    return root


def pack(root: Path, out: Path, mode: str = "w") -> Path:
    with tarfile.open(out, mode) as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=f"tiny/{path.relative_to(root).as_posix()}", recursive=False)
    return out


def inspect(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict | None, str]:
    code = main(["inspect", *args, "--json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    payload = json.loads(out.strip().splitlines()[-1]) if code == 0 else None
    return code, payload, " ".join(err.split())


def test_key_verifies_the_signature(signed: Path, keys: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for target in (signed, pack(signed, tmp_path / "b.tar"), pack(signed, tmp_path / "b.tar.gz", "w:gz")):
        code, payload, _ = inspect(capsys, str(target), "--key", str(keys["fleet"][1]), "--require-signature")
        assert code == 0 and payload["verified"] is True
        assert payload["signature"]["status"] == "verified" and len(payload["signature"]["key"]) == 16
    code, payload, _ = inspect(capsys, str(signed))
    assert code == 0 and payload["signature"] == {"status": "not_checked", "key": None}
    assert main(["inspect", str(signed)]) == 0
    assert "signature not checked: pass --key" in " ".join(capsys.readouterr().out.split())


def test_a_rehashed_model_with_a_stale_signature_fails(
    signed: Path, keys: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = signed / "model.onnx"
    model.write_bytes(model.read_bytes() + b"\x00")  # the model changed ...
    manifest = load_manifest(signed)
    manifest["files"]["model.onnx"] = manifest["model"]["sha256"] = hashlib.sha256(model.read_bytes()).hexdigest()
    save_manifest(signed, manifest)  # ... and was re-hashed, but manifest.sig is the old one
    for target in (signed, pack(signed, tmp_path / "stale.tar")):
        code, _, err = inspect(capsys, str(target), "--key", str(keys["fleet"][1]))
        assert code == 2 and "the signature in manifest.sig does not match manifest.json under the fleet key" in err


def test_a_foreign_signature_fails(signed: Path, keys: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]) -> None:
    sign_bundle(signed, keys["foreign"][0])
    code, _, err = inspect(capsys, str(signed), "--key", str(keys["fleet"][1]))
    assert code == 2 and "signed with another key" in err


def test_require_signature(tmp_path: Path, keys: dict[str, tuple[Path, Path]], capsys: pytest.CaptureFixture[str]) -> None:
    unsigned = pack(build_bundle(tmp_path / "unsigned"), tmp_path / "unsigned.tar")
    code, _, err = inspect(capsys, str(unsigned), "--key", str(keys["fleet"][1]), "--require-signature")
    assert code == 2 and "is not signed (no manifest.sig) and a signature is required" in err
    code, payload, _ = inspect(capsys, str(unsigned), "--key", str(keys["fleet"][1]))
    assert code == 0 and payload["signature"]["status"] == "unsigned"
    code, _, err = inspect(capsys, str(unsigned), "--require-signature")
    assert code == 2 and "requiring a signature needs the fleet's public key" in err and "--key" in err


def test_the_signature_is_checked_before_files_are_written(
    signed: Path, keys: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (signed / "payload.bin").write_bytes(b"\x00" * 1000)  # unlisted: extraction would refuse it ...
    tar = pack(signed, tmp_path / "b.tar")
    code, _, err = inspect(capsys, str(tar), "--key", str(keys["foreign"][1]))
    assert code == 2 and "does not match manifest.json" in err and "payload.bin" not in err  # ... but the signature fails first
    code, _, err = inspect(capsys, str(tar), "--key", str(keys["fleet"][1]))
    assert code == 2 and "member 'tiny/payload.bin' is not listed in manifest.json files" in err


def _hostile(out: Path, info: tarfile.TarInfo, data: bytes = b"") -> Path:
    with tarfile.open(out, "w") as tar:
        manifest = b'{"name": "x"}'
        head = tarfile.TarInfo("tiny/manifest.json")
        head.size = len(manifest)
        tar.addfile(head, io.BytesIO(manifest))
        tar.addfile(info, io.BytesIO(data) if data else None)
    return out


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, size
    return info


@pytest.mark.parametrize(
    ("name", "info", "fragment"),
    [
        ("absolute", _info("/tmp/evil.sh", size=1), "member '/tmp/evil.sh' has an absolute or '..' path"),
        ("dotdot", _info("tiny/../../evil.sh", size=1), "member 'tiny/../../evil.sh' has an absolute or '..' path"),
        ("symlink", _info("tiny/model.onnx", tarfile.SYMTYPE, "/etc/passwd"), "member 'tiny/model.onnx' is a link or special file (symbolic link to '/etc/passwd')"),
        ("device", _info("tiny/sda", tarfile.BLKTYPE), "member 'tiny/sda' is a link or special file (block device)"),
    ],
)
def test_hostile_tars_exit_2_naming_the_member(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, info: tarfile.TarInfo, fragment: str) -> None:
    tar = _hostile(tmp_path / f"{name}.tar", info, b"x" * info.size)
    code, _, err = inspect(capsys, str(tar))
    assert code == 2 and fragment in err and "error:" in err
    assert not (tmp_path / "evil.sh").exists() and not Path("/tmp/evil.sh").exists()


def test_truncated_tar(signed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = pack(signed, tmp_path / "whole.tar")
    with tarfile.open(whole) as tar:
        model = tar.getmember("tiny/model.onnx")
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole.read_bytes()[: model.offset_data + 100])
    code, _, err = inspect(capsys, str(cut))
    assert code == 2 and "not a complete, readable tar (at member 'tiny/model.onnx'): unexpected end of data" in err


def test_gzip_bomb_and_size_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bomb = tmp_path / "bomb.tar.gz"
    with tarfile.open(bomb, "w:gz", compresslevel=9) as tar:
        info = _info("tiny/weights.bin", size=48 << 20)
        tar.addfile(info, io.BytesIO(bytes(info.size)))
        manifest = _info("tiny/manifest.json", size=2)
        tar.addfile(manifest, io.BytesIO(b"{}"))
    assert bomb.stat().st_size < 200_000  # 48 MiB of zeros
    code, _, err = inspect(capsys, str(bomb))
    assert code == 2 and "compression ratio" in err and "at member 'tiny/weights.bin' is above the limit of 50:1" in err
    code, _, err = inspect(capsys, str(bomb), "--max-unpacked-mb", "16")
    assert code == 2 and "member 'tiny/weights.bin' (50331648 bytes) makes the unpacked bundle larger than the limit of 16777216 bytes" in err


def test_too_many_members(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    many = tmp_path / "many.tar"
    with tarfile.open(many, "w") as tar:
        for index in range(10_001):
            tar.addfile(_info(f"tiny/f{index:05d}"))
    code, _, err = inspect(capsys, str(many))
    assert code == 2 and "more than 10000 members (at member 'tiny/f10000')" in err


def test_not_a_tar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"\x89PNG not a tar at all" * 100)
    code, _, err = inspect(capsys, str(junk))
    assert code == 2 and "junk.tar: not a complete, readable tar" in err


def test_a_tolerance_too_large_for_a_float_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = build_bundle(tmp_path / "bundle")
    manifest = load_manifest(root)
    manifest["golden"]["atol"] = 10**400  # valid JSON; float() of it overflows
    save_manifest(root, manifest)
    code, _, err = inspect(capsys, str(root))
    assert code == 2 and "manifest.json': golden.atol must be a number >= 0.0, got an integer too large for a float" in err
    assert "hint: rebuild the bundle with edgekit build" in err
