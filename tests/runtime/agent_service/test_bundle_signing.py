"""Ed25519 bundle signatures: key generation, signing on the host, verification on the device."""

from __future__ import annotations

import base64
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgekit.bundle.signing import generate_keypair, sign_bundle
from edgekit.cli.main import main as edgekit_main
from edgekit_runtime.bundle import open_bundle
from edgekit_runtime.errors import BundleError
from edgekit_runtime.signing import (
    BundleSignatureError,
    SigningKeyError,
    load_public_key,
    public_key_fingerprint,
    read_signature,
    verify_manifest_signature,
)


def test_sign_and_verify_round_trip(signed_bundle: Callable[..., Path], fleet_keys: tuple[Path, Path]) -> None:
    root = signed_bundle()
    signature = read_signature(root)
    assert signature is not None and len(signature) == 64
    assert (root / "manifest.sig").read_text(encoding="ascii").strip() == base64.b64encode(signature).decode()
    fingerprint = verify_manifest_signature(root, fleet_keys[1])
    assert fingerprint == public_key_fingerprint(load_public_key(fleet_keys[1])) and len(fingerprint) == 16
    open_bundle(root, verify=True)  # manifest.sig is the one file verify_files accepts unlisted


def test_private_key_is_owner_only_and_not_overwritten(tmp_path: Path) -> None:
    private, public = tmp_path / "k" / "fleet.key.pem", tmp_path / "k" / "fleet.pub.pem"
    generate_keypair(private, public)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    with pytest.raises(SigningKeyError, match="already exists") as info:
        generate_keypair(private, public)
    assert "--force" in str(info.value)
    old = public.read_bytes()
    generate_keypair(private, public, force=True)
    assert public.read_bytes() != old


def test_tampered_manifest_fails_verification(signed_bundle: Callable[..., Path], fleet_keys: tuple[Path, Path]) -> None:
    root = signed_bundle()
    manifest = root / "manifest.json"
    data = bytearray(manifest.read_bytes())
    data[data.index(b"tiny-a")] = ord("T")  # one byte
    manifest.write_bytes(bytes(data))
    with pytest.raises(BundleSignatureError, match="does not match manifest.json") as info:
        verify_manifest_signature(root, fleet_keys[1])
    assert "tampered" in str(info.value)


def test_other_key_unsigned_and_garbage_signatures(signed_bundle: Callable[..., Path], tmp_path: Path) -> None:
    other_private, other_public = tmp_path / "o.key.pem", tmp_path / "o.pub.pem"
    generate_keypair(other_private, other_public)
    root = signed_bundle()
    with pytest.raises(BundleSignatureError, match="signed with another key"):
        verify_manifest_signature(root, other_public)
    unsigned = signed_bundle("tiny-u", sign=False)
    with pytest.raises(BundleSignatureError, match="is not signed") as info:
        verify_manifest_signature(unsigned, other_public)
    assert "edgekit sign" in str(info.value)
    (unsigned / "manifest.sig").write_text("not base64!!\n")
    with pytest.raises(BundleSignatureError, match="not valid base64"):
        verify_manifest_signature(unsigned, other_public)
    (unsigned / "manifest.sig").write_text(base64.b64encode(b"abc").decode())
    with pytest.raises(BundleSignatureError, match="is 3 bytes, an Ed25519 signature is 64"):
        verify_manifest_signature(unsigned, other_public)


def test_key_file_problems(tmp_path: Path, fleet_keys: tuple[Path, Path], signed_bundle: Callable[..., Path]) -> None:
    with pytest.raises(SigningKeyError, match="does not exist"):
        load_public_key(tmp_path / "missing.pem")
    with pytest.raises(SigningKeyError, match="not a PEM public key") as info:
        load_public_key(fleet_keys[0])  # the private key
    assert "not the private key" in str(info.value)
    with pytest.raises(SigningKeyError, match="not an unencrypted PEM private key"):
        sign_bundle(signed_bundle("tiny-k", sign=False), fleet_keys[1])


def test_signing_refuses_a_damaged_bundle(signed_bundle: Callable[..., Path], fleet_keys: tuple[Path, Path]) -> None:
    root = signed_bundle("tiny-d", sign=False)
    (root / "extra.txt").write_text("not listed")
    with pytest.raises(BundleError, match="unlisted: extra.txt"):
        sign_bundle(root, fleet_keys[0])
    assert not (root / "manifest.sig").exists()


def test_cli_keygen_and_sign(tmp_path: Path, signed_bundle: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "cli-keys"
    assert edgekit_main(["keygen", "--out", str(keys), "--json"]) == 0
    assert (keys / "fleet.key.pem").is_file() and (keys / "fleet.pub.pem").is_file()
    assert '"fingerprint"' in capsys.readouterr().out
    root = signed_bundle("tiny-cli", sign=False)
    assert edgekit_main(["sign", str(root), "--key", str(keys / "fleet.key.pem")]) == 0
    verify_manifest_signature(root, keys / "fleet.pub.pem")
    assert edgekit_main(["keygen", "--out", str(keys)]) == 2  # refuses to overwrite
    assert "already exists" in capsys.readouterr().err


@pytest.mark.parametrize(("errno_code", "strerror", "expected", "hint"), [
    (28, "No space left on device", "edgekit sign ran out of disk space (No space left on device). bundle folder {root}: ",
     "hint: free space on that disk, or copy the bundle to a larger disk and sign it there"),
    (30, "Read-only file system", "cannot write '{root}/manifest.sig': Read-only file system",
     "hint: make the bundle folder writable, or copy the bundle somewhere writable and sign it there"),
], ids=["disk-full", "read-only"])  # fmt: skip
def test_a_signature_that_cannot_be_written_is_an_error_not_a_traceback(
    signed_bundle: Callable[..., Path], fleet_keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, errno_code: int, strerror: str, expected: str, hint: str,
) -> None:
    """A full (or read-only) disk under the bundle: exit 2 naming the folder and the fix; no partial file left.
    (tests/cli/test_disk_full_cli.py signs onto a real full tmpfs where this host lets the tests mount one.)"""
    root = signed_bundle("tiny-full", sign=False)
    before = sorted(p.name for p in root.iterdir())
    real_write_text = Path.write_text

    def write_text(self: Path, *args: Any, **kwargs: Any) -> int:
        if self.name == ".manifest.sig.partial":
            real_write_text(self, "")  # the file exists, as after a short write
            raise OSError(errno_code, strerror)
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    assert edgekit_main(["sign", str(root), "--key", str(fleet_keys[0])]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "error: " + expected.format(root=root) in err and hint in err and "Traceback" not in err
    assert sorted(p.name for p in root.iterdir()) == before  # no manifest.sig, no .manifest.sig.partial


SECT163K1_PUBLIC_KEY = """-----BEGIN PUBLIC KEY-----
MEAwEAYHKoZIzj0CAQYFK4EEAAEDLAAEBYrAgLTO/BLHQI96hPS4LPGMFh8vAzos
mac4naCTVhZeCm2bTvoSiWo8
-----END PUBLIC KEY-----
"""


def test_hostile_keys_bundles_and_arguments_are_errors_not_tracebacks(signed_bundle: Callable[..., Path], tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Found by a review: each of these ended in a traceback (exit 1) instead of an error naming the fix (exit 2)."""
    import json
    import os

    bundle = signed_bundle("tiny-a")
    curve = tmp_path / "b163.pub.pem"
    curve.write_text(SECT163K1_PUBLIC_KEY)  # an EC curve this cryptography build cannot load (UnsupportedAlgorithm)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    unsigned = signed_bundle("tiny-u", sign=False)
    (unsigned / "manifest.sig").mkdir()  # an empty folder where the signature goes
    hostile = signed_bundle("tiny-h", sign=False)
    manifest = json.loads((hostile / "manifest.json").read_text())
    manifest["files"]["\ud800x.bin"] = "0" * 64  # an unpaired surrogate as a file name
    manifest["model"]["size_bytes"] = 10**400  # an integer past any float
    (hostile / "manifest.json").write_text(json.dumps(manifest))
    cases = [(["inspect", str(bundle), "--key", str(curve)], "is not an Ed25519 key"),
             (["keygen", "--out", str(a_file)], "it is a file, not a folder"),
             (["pack", str(bundle), "--out", str(tmp_path / "missing" / "x.tar")], "does not exist"),
             (["sign", str(unsigned), "--key", str(tmp_path / "keys" / "fleet.key.pem")], "not a signature file"),
             (["inspect", str(hostile)], "cannot be a file name (an unpaired surrogate)")]  # fmt: skip
    edgekit_main(["keygen", "--out", str(tmp_path / "keys")])
    capsys.readouterr()
    for argv, message in cases:
        assert edgekit_main(argv) == 2, argv
        captured = capsys.readouterr()
        assert message in " ".join((captured.out + captured.err).split()), argv


def test_pack_writes_files_never_links(signed_bundle: Callable[..., Path], tmp_path: Path) -> None:
    import hashlib
    import json
    import os
    import tarfile

    from edgekit.bundle.pack import pack_bundle
    from edgekit_runtime.archive import ArchiveLimits, scan_bundle_archive

    bundle = signed_bundle("tiny-l", sign=False)
    manifest = json.loads((bundle / "manifest.json").read_text())
    os.link(bundle / "model.onnx", bundle / "twin.onnx")  # a hard link of a listed file, listed too
    manifest["files"]["twin.onnx"] = hashlib.sha256((bundle / "model.onnx").read_bytes()).hexdigest()
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    out = pack_bundle(bundle, tmp_path / "b.tar")
    with tarfile.open(out) as tar:
        assert all(member.isreg() or member.isdir() for member in tar.getmembers())  # before: a LNKTYPE member
    scan_bundle_archive(out, ArchiveLimits(max_unpacked_bytes=1 << 30))  # its own reader takes it (before: "link or special file")
