"""What deploy commands carry about a bundle, and the checks made before any device sees it."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from edgekit.bundle.pack import pack_bundle
from edgekit.fleet.commands import build_command
from edgekit.fleet.rollout import RolloutPolicy
from edgekit.fleet.rollout_bundle import (
    BundleArtifactError,
    BundleNotSignedError,
    BundleVerificationError,
    RolloutError,
    SignatureKeyMissingError,
    prepare_bundle,
)
from edgekit_runtime.schemas import schema_problems
from edgekit_runtime.signing import BundleSignatureError
from tests.runtime.agent_service.bundles import make_bundle


def test_directory_bundle_is_named_by_its_manifest(signed_bundle, fleet_keys) -> None:
    root = signed_bundle("vision")
    artifact = prepare_bundle(root, key=fleet_keys[0])  # the private key's public half checks the signature
    manifest = (root / "manifest.json").read_bytes()
    assert artifact.sha256 == hashlib.sha256(manifest).hexdigest()  # the agent hashes a directory's manifest
    assert artifact.bundle_id == f"vision-{artifact.sha256[:12]}" and artifact.target == "x86-64-cpu"
    assert artifact.url == root.resolve().as_uri() and artifact.signed_by
    command = build_command("deploy", artifact.deploy_args())
    assert schema_problems(command, "command.v1") == []


def test_packed_bundle_is_hashed_as_a_tar_and_served_from_url_base(signed_bundle, fleet_keys) -> None:
    tar = pack_bundle(signed_bundle("vision"), None)
    artifact = prepare_bundle(tar, url_base="https://bundles.example.com/fleet/", key=fleet_keys[1])
    assert artifact.sha256 == hashlib.sha256(tar.read_bytes()).hexdigest() and artifact.size_bytes == tar.stat().st_size
    assert artifact.url == f"https://bundles.example.com/fleet/{tar.name}"
    assert len(artifact.signature_b64) == 88  # 64 bytes of Ed25519 signature, base64


def test_unsigned_bundle_is_refused(tmp_path: Path, fleet_keys) -> None:
    root = make_bundle(tmp_path / "plain", name="plain")
    with pytest.raises(BundleNotSignedError, match=r"is not signed \(no manifest.sig\).*") as info:
        prepare_bundle(root, key=fleet_keys[1])
    assert "edgekit sign" in info.value.hint


def test_bundle_signed_with_another_key_is_refused(signed_bundle, tmp_path: Path) -> None:
    from edgekit.bundle.signing import generate_keypair

    generate_keypair(tmp_path / "other.key.pem", tmp_path / "other.pub.pem")
    with pytest.raises(BundleSignatureError, match="does not match manifest.json under key"):
        prepare_bundle(signed_bundle("vision"), key=tmp_path / "other.pub.pem")


def test_url_base_needs_a_tar_and_paths_must_be_bundles(signed_bundle, tmp_path: Path) -> None:
    with pytest.raises(BundleArtifactError, match="--url-base needs a packed bundle"):
        prepare_bundle(signed_bundle("vision"), url_base="https://x.example")
    with pytest.raises(BundleArtifactError, match="does not exist"):
        prepare_bundle(tmp_path / "nothing")
    with pytest.raises(BundleArtifactError, match="has no manifest.json"):
        prepare_bundle(tmp_path)
    with tarfile.open(tmp_path / "empty.tar", "w"):
        pass
    with pytest.raises(BundleVerificationError, match=r"refusing to publish tar .*empty.tar: .*has no manifest.json at its top"):
        prepare_bundle(tmp_path / "empty.tar", skip_signature_check=True)


def _repack(tar: Path, out: Path, change: dict[str, bytes], extra: dict[str, bytes] | None = None) -> Path:
    """A copy of ``tar`` with the members in ``change`` holding other bytes (manifest and signature kept)."""
    import io

    with tarfile.open(tar) as source, tarfile.open(out, "w") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            if member.name in change:
                data = change[member.name]
                member.size = len(data)
            target.addfile(member, io.BytesIO(data) if data is not None else None)
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            target.addfile(info, io.BytesIO(data))
    return out


def test_tar_with_a_modified_model_is_refused_before_publishing(signed_bundle, fleet_keys, tmp_path: Path) -> None:
    tar = pack_bundle(signed_bundle("vision"), tmp_path / "vision.tar")
    original = prepare_bundle(tar, key=fleet_keys[1])
    assert original.files_verified == 5  # model.onnx and two golden batches of inputs and outputs
    model = tarfile.open(tar).extractfile("vision/model.onnx").read()  # type: ignore[union-attr]
    tampered = _repack(tar, tmp_path / "tampered.tar", {"vision/model.onnx": model[:-1] + bytes([model[-1] ^ 1])})
    with pytest.raises(BundleVerificationError) as info:
        prepare_bundle(tampered, key=fleet_keys[1])  # the signature is fine: it covers manifest.json, which is unchanged
    message = str(info.value)
    assert f"refusing to publish tar {tampered}" in message
    assert "member 'vision/model.onnx' does not match its sha256 in manifest.json" in message
    assert "nothing was sent to any device" in info.value.hint and "edgekit pack" in info.value.hint
    smuggled = _repack(tar, tmp_path / "smuggled.tar", {}, extra={"vision/run.sh": b"#!/bin/sh\n"})
    with pytest.raises(BundleVerificationError, match="member 'vision/run.sh' is not listed in manifest.json files"):
        prepare_bundle(smuggled, key=fleet_keys[1])


def test_directory_with_a_modified_or_missing_file_is_refused(signed_bundle, fleet_keys) -> None:
    root = signed_bundle("vision")
    with (root / "model.onnx").open("ab") as handle:
        handle.write(b"\0")
    (root / "golden" / "outputs_001.npz").unlink()
    with pytest.raises(BundleVerificationError) as info:
        prepare_bundle(root, key=fleet_keys[1])
    message = str(info.value)
    assert f"refusing to publish bundle directory {root}" in message
    assert "modified: model.onnx (expected sha256" in message and "missing: golden/outputs_001.npz" in message


def test_a_key_is_required_unless_the_check_is_skipped(signed_bundle) -> None:
    root = signed_bundle("vision")
    with pytest.raises(SignatureKeyMissingError, match=f"no fleet key to check the signature of {root}") as info:
        prepare_bundle(root)
    assert "--key fleet.pub.pem" in info.value.hint and "--skip-signature-check" in info.value.hint
    assert prepare_bundle(root, skip_signature_check=True).signed_by is None


def test_inbox_gets_a_checked_copy_of_the_tar(signed_bundle, fleet_keys, tmp_path: Path) -> None:
    tar = pack_bundle(signed_bundle("vision"), tmp_path / "vision.tar")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    artifact = prepare_bundle(tar, key=fleet_keys[1], inbox=inbox)
    assert artifact.url == (inbox / "vision.tar").as_uri() and (inbox / "vision.tar").read_bytes() == tar.read_bytes()
    assert [p.name for p in inbox.iterdir()] == ["vision.tar"]  # no partial file left
    with pytest.raises(BundleArtifactError, match=r"--inbox .*nowhere is not a directory"):
        prepare_bundle(tar, key=fleet_keys[1], inbox=tmp_path / "nowhere")
    with pytest.raises(BundleArtifactError, match="--inbox needs a packed bundle"):
        prepare_bundle(signed_bundle("other"), key=fleet_keys[1], inbox=inbox)


def test_deploy_args_carry_the_downgrade_and_signature_change_flags_only_when_set(signed_bundle, fleet_keys) -> None:
    artifact = prepare_bundle(signed_bundle("vision", bundle_version=7), key=fleet_keys[1])
    assert artifact.bundle_version == 7
    assert "allow_downgrade" not in artifact.deploy_args() and "allow_signature_change" not in artifact.deploy_args()
    args = artifact.deploy_args(allow_downgrade=True, allow_signature_change=True)
    assert args["allow_downgrade"] is True and args["allow_signature_change"] is True
    assert schema_problems(build_command("deploy", args), "command.v1") == []


@pytest.mark.parametrize(("spec", "total", "expected"), [("10%", 20, 2), ("10%", 3, 1), ("1", 5, 1), ("50%", 5, 3), ("9", 4, 4)])
def test_canary_size(spec: str, total: int, expected: int) -> None:
    assert RolloutPolicy(canary=spec).canary_count(total) == expected


@pytest.mark.parametrize("spec", ["0%", "ten", "0", "150%"])
def test_bad_canary_is_explained(spec: str) -> None:
    with pytest.raises(RolloutError, match=rf"--canary '{spec}' is neither a share"):
        RolloutPolicy(canary=spec).canary_count(10)


def test_rollout_records_round_trip_through_the_table_beside_the_store(store_url: str) -> None:
    import datetime as dt

    from edgekit.fleet.rollout_state import RolloutRecord, open_rollout_log

    now = dt.datetime.now(dt.timezone.utc)
    record = RolloutRecord("r1", "lab", "b-1", "file:///b", "0" * 64, "canary", ("d1",), ("d1", "d2"), now, now,
                           previous_bundles={"d1": "b-0", "d2": None}, outcomes={"d1": "deploying", "d2": "pending"})  # fmt: skip
    with open_rollout_log(store_url) as log:
        log.save(record)
        log.save(record.with_state("completed", outcomes={"d1": "succeeded", "d2": "succeeded"}))
        stored = log.recent()
    assert len(stored) == 1 and stored[0].state == "completed" and stored[0].previous_bundles == {"d1": "b-0", "d2": None}
    assert stored[0].canary == ("d1",) and stored[0].started_at == now
    from edgekit.fleet.errors import StoreError

    with pytest.raises(StoreError, match="fleet store URL 'mysql://x' is not usable: scheme 'mysql'"):
        open_rollout_log("mysql://x")
