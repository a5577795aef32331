"""Signing bundles on the build host: an Ed25519 key pair per fleet, and ``manifest.sig`` per bundle.

The device checks the signature with :mod:`edgekit_runtime.signing` against the fleet's public key
(``bundles.public_key`` in the agent config). Keep the private key off the devices and out of the
repository: whoever holds it can ship models to the whole fleet.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edgekit.bundle.disk_full import Place, disk_full_as_error
from edgekit.errors import BuildError, BundleError
from edgekit_runtime.bundle import MANIFEST_NAME, SIGNATURE_NAME, open_bundle
from edgekit_runtime.signing import (
    BundleSignatureError,
    SigningKeyError,
    decode_signature,
    encode_signature,
    load_private_key,
    public_key_fingerprint,
    verify_manifest_signature,
    verify_signature_bytes,
)

PRIVATE_KEY_NAME = "fleet.key.pem"
PUBLIC_KEY_NAME = "fleet.pub.pem"


def generate_keypair(private_path: str | os.PathLike[str], public_path: str | os.PathLike[str], *, force: bool = False) -> str:
    """Write a new Ed25519 key pair as PEM files (the private one readable by its owner only).

    Existing files are refused unless ``force``: overwriting a fleet key locks out every device that
    trusts the old one. Returns the public key's fingerprint.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    private_path, public_path = Path(private_path), Path(public_path)
    for path in (private_path, public_path):
        if path.exists() and not force:
            raise SigningKeyError(
                f"key file '{path}' already exists",
                hint="devices trust the existing key; pass --force only to replace it on purpose, or choose another --out",
            )
    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    for path in (private_path, public_path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise SigningKeyError(f"cannot write keys into '{path.parent}': it is a file, not a folder",
                                  hint="pass --out a folder (it is created if missing)") from None  # fmt: skip
        path.unlink(missing_ok=True)
    descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(private_pem)
    public_path.write_bytes(public_pem)
    return public_key_fingerprint(key.public_key())


def sign_bundle(bundle_dir: str | os.PathLike[str], private_key_path: str | os.PathLike[str]) -> Path:
    """Verify every file of the bundle, then write ``manifest.sig`` over its ``manifest.json``.

    Returns the path of ``manifest.sig``. The signature is checked against the key's own public half
    before returning, so a bundle never leaves this function with a signature that does not verify.
    """
    root = Path(bundle_dir)
    if root.is_file():
        raise BundleError(
            f"'{root}' is a file; sign the bundle directory, then pack it",
            hint="tar -xf the archive, run `edgekit sign DIR --key KEY`, then `edgekit pack DIR`",
        )
    open_bundle(root, verify=True)  # only sign what is intact: the signature vouches for every hash
    key = load_private_key(private_key_path)
    signature = key.sign((root / MANIFEST_NAME).read_bytes())
    target = root / SIGNATURE_NAME
    if target.exists() and not target.is_file():
        raise BundleError(f"'{target}' is a {'folder' if target.is_dir() else 'special file'}, not a signature file",
                          hint="remove it, then sign again")  # fmt: skip
    partial = root / f".{SIGNATURE_NAME}.partial"
    try:
        with disk_full_as_error("edgekit sign", [Place("bundle folder", root.resolve())]):
            try:
                partial.write_text(encode_signature(signature) + "\n", encoding="ascii")
                partial.replace(target)
            except OSError:
                partial.unlink(missing_ok=True)  # a leftover would fail the bundle's own file check
                raise
    except BuildError as err:  # its hint names --out, which sign has not: manifest.sig goes into the bundle
        raise BuildError(err.message, hint="free space on that disk, or copy the bundle to a larger disk and sign it there") from None
    except OSError as err:
        raise BundleError(f"cannot write '{target}': {err.strerror or err}",
                          hint="make the bundle folder writable, or copy the bundle somewhere writable and sign it there") from None  # fmt: skip
    verify_manifest_signature(root, key.public_key())
    return root / SIGNATURE_NAME


@dataclass(frozen=True)
class SignatureCheck:
    """What ``edgekit inspect`` found out about a bundle's signature.

    ``status``: ``verified`` (by the key ``key``), ``unsigned``, or ``not_checked`` (signed, but no
    public key was given, so the signature proves nothing yet).
    """

    status: str
    key: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {"status": self.status, "key": self.key}


def check_bundle_signature(
    manifest_bytes: bytes,
    signature_bytes: bytes | None,
    *,
    public_key: str | os.PathLike[str] | None = None,
    require: bool = False,
    where: str,
) -> SignatureCheck:
    """Check the signature over ``manifest_bytes`` against ``public_key`` (a PEM path).

    A signature that does not verify always raises :class:`BundleSignatureError`; an unsigned bundle
    raises it only with ``require``, which needs ``public_key`` (a signature nobody checked proves
    nothing).
    """
    if require and public_key is None:
        raise SigningKeyError(
            "requiring a signature needs the fleet's public key to check it against",
            hint="pass --key fleet.pub.pem (from `edgekit keygen`) with --require-signature",
        )
    signature = None if signature_bytes is None else decode_signature(signature_bytes, where=f"{where}: {SIGNATURE_NAME}")
    if signature is None:
        if require:
            raise BundleSignatureError(
                f"bundle '{where}' is not signed (no {SIGNATURE_NAME}) and a signature is required",
                hint="sign it on the build host: edgekit sign BUNDLE --key fleet.key.pem, then pack it again",
            )
        return SignatureCheck("unsigned")
    if public_key is None:
        return SignatureCheck("not_checked")
    return SignatureCheck("verified", verify_signature_bytes(manifest_bytes, signature, public_key, where=where))
