"""What a deploy command says about a bundle: id, URL, sha256, size, and the signature it carries.

The agent's contract (``command.v1`` and :mod:`edgekit_runtime.agent.fetch`): ``sha256`` is the hash
of the tar made by ``edgekit pack`` or, for a bundle directory reached through a ``file://`` URL,
the hash of its ``manifest.json``. The bundle must be signed (``manifest.sig``, from ``edgekit
sign``); the signature travels inside the bundle, where the agent checks it against the fleet key.
"""

from __future__ import annotations

import base64
import hashlib
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit.fleet.errors import FleetError
from edgekit_runtime.agent.store import version_name
from edgekit_runtime.bundle import MANIFEST_NAME, MAX_MANIFEST_BYTES, SIGNATURE_NAME, check_bundle_name, parse_manifest_json
from edgekit_runtime.errors import BundleError
from edgekit_runtime.signing import decode_signature


class RolloutError(FleetError):
    """A rollout cannot start or go on (see the subclasses)."""


class BundleNotSignedError(RolloutError):
    """The bundle has no ``manifest.sig``: agents refuse unsigned bundles."""


class BundleArtifactError(RolloutError):
    """The bundle path is not a bundle directory or a tar from ``edgekit pack``."""


@dataclass(frozen=True)
class BundleArtifact:
    """A signed bundle ready to be named in deploy commands."""

    path: Path
    bundle_id: str
    name: str
    target: str | None
    url: str
    sha256: str
    size_bytes: int
    manifest_sha256: str
    signature_b64: str
    signed_by: str | None  # key fingerprint, when a key was given to check the signature

    def deploy_args(self) -> dict[str, Any]:
        """``args`` of a ``command.v1`` deploy (the schema has no field for the signature: it is in the bundle)."""
        return {"bundle_id": self.bundle_id, "url": self.url, "sha256": self.sha256, "size_bytes": self.size_bytes}


def _read_tar(path: Path) -> tuple[bytes, bytes | None]:
    """(manifest.json bytes, manifest.sig bytes or None) of a tar from ``edgekit pack``."""
    try:
        with tarfile.open(path) as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            manifests = [name for name in members if name.split("/")[-1] == MANIFEST_NAME and name.count("/") <= 1]
            if len(manifests) != 1:
                raise BundleArtifactError(f"{path}: expected one {MANIFEST_NAME} at the top of the tar, found {len(manifests)}",
                                          hint="pack the bundle with `edgekit pack BUNDLE_DIR`")  # fmt: skip
            prefix = manifests[0][: -len(MANIFEST_NAME)]
            if members[manifests[0]].size > MAX_MANIFEST_BYTES:
                raise BundleArtifactError(f"{path}: {manifests[0]} is {members[manifests[0]].size:,} bytes, more than a manifest's "
                                          f"{MAX_MANIFEST_BYTES:,}", hint="pack the bundle with `edgekit pack BUNDLE_DIR`")  # fmt: skip
            manifest = tar.extractfile(members[manifests[0]]).read()  # type: ignore[union-attr]
            signature_member = members.get(prefix + SIGNATURE_NAME)
            signature = tar.extractfile(signature_member).read() if signature_member else None  # type: ignore[union-attr]
            return manifest, signature
    except (tarfile.TarError, OSError) as err:
        raise BundleArtifactError(f"{path} cannot be read as a tar: {err}", hint="pass the .tar from `edgekit pack` or a bundle directory") from err


def _directory_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def prepare_bundle(path: str | Path, *, url_base: str | None = None, key: str | Path | None = None,
                   bundle_id: str | None = None) -> BundleArtifact:  # fmt: skip
    """Read a bundle directory or packed tar and work out what its deploy commands carry.

    ``url_base`` (``https://host/bundles``) makes the URL ``<url_base>/<tar name>`` and needs a tar;
    without it the URL is the ``file://`` URL of ``path`` (devices that share this file system, and
    simulated ones). ``key``, the fleet's private or public PEM key, checks the signature here, before
    any device sees the bundle. ``bundle_id`` defaults to ``<manifest name>-<12 hex of its sha256>``.
    """
    path = Path(path).expanduser().resolve()
    if not path.exists():
        raise BundleArtifactError(f"bundle {path} does not exist", hint="pass the directory `edgekit build` wrote or the .tar from `edgekit pack`")
    if path.is_dir():
        manifest_file = path / MANIFEST_NAME
        if not manifest_file.is_file():
            raise BundleArtifactError(f"{path} has no {MANIFEST_NAME}: not a bundle directory", hint="pass the directory `edgekit build` wrote")
        manifest_bytes = manifest_file.read_bytes()
        signature_file = path / SIGNATURE_NAME
        signature_bytes = signature_file.read_bytes() if signature_file.is_file() else None
        if url_base:
            raise BundleArtifactError(f"--url-base needs a packed bundle, but {path} is a directory",
                                      hint=f"run `edgekit pack {path}` and deploy the .tar it writes")  # fmt: skip
        sha256, size_bytes = hashlib.sha256(manifest_bytes).hexdigest(), _directory_size(path)
    else:
        manifest_bytes, signature_bytes = _read_tar(path)
        sha256, size_bytes = _sha256_file(path), path.stat().st_size
    try:  # bounded size and nesting, a JSON object, a safe name: the name becomes the bundle id devices store
        manifest = parse_manifest_json(manifest_bytes, f"{path}: {MANIFEST_NAME}")
        name = check_bundle_name(manifest.get("name"), f"{path}: {MANIFEST_NAME}")
    except BundleError as err:
        raise BundleArtifactError(err.message, hint=err.hint or "rebuild the bundle") from err
    if signature_bytes is None:
        raise BundleNotSignedError(
            f"bundle {path} is not signed (no {SIGNATURE_NAME}); agents accept only bundles signed with the fleet key",
            hint="sign it with `edgekit sign BUNDLE_DIR --key fleet.key.pem` (then `edgekit pack` it again) before deploying",
        )
    signature = decode_signature(signature_bytes, where=f"{path}: {SIGNATURE_NAME}")
    signed_by = _check_signature(path, manifest_bytes, signature, key) if key is not None else None
    manifest_sha256 = hashlib.sha256(manifest_bytes).hexdigest()
    url = f"{url_base.rstrip('/')}/{path.name}" if url_base else path.as_uri()
    target = manifest.get("target", {}).get("name") if isinstance(manifest.get("target"), dict) else None
    return BundleArtifact(path=path, bundle_id=bundle_id or version_name(name, manifest_sha256), name=name, target=target,
                          url=url, sha256=sha256, size_bytes=max(1, size_bytes), manifest_sha256=manifest_sha256,
                          signature_b64=base64.b64encode(signature).decode("ascii"), signed_by=signed_by)  # fmt: skip


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_signature(path: Path, manifest_bytes: bytes, signature: bytes, key: str | Path) -> str:
    """Verify ``signature`` over the manifest with the fleet key (a private key's public half works too)."""
    from cryptography.exceptions import InvalidSignature

    from edgekit_runtime.signing import BundleSignatureError, SigningKeyError, load_private_key, load_public_key, public_key_fingerprint

    try:
        public_key = load_public_key(key)
    except SigningKeyError:
        public_key = load_private_key(key).public_key()
    fingerprint = public_key_fingerprint(public_key)
    try:
        public_key.verify(signature, manifest_bytes)
    except InvalidSignature as err:
        raise BundleSignatureError(
            f"bundle {path}: {SIGNATURE_NAME} does not match {MANIFEST_NAME} under key {fingerprint} ({key})",
            hint="the bundle was signed with another key or changed after signing; sign it again with the fleet key",
        ) from err
    return fingerprint
