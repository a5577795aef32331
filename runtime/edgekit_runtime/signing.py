"""Ed25519 signatures of bundles: verified on the device (the agent) and by ``edgekit inspect``.

The signature covers the exact bytes of ``manifest.json``; the manifest's ``files`` hashes then cover
every other file, so a valid signature plus :func:`~edgekit_runtime.bundle.verify_files` proves the
whole bundle is what the holder of the fleet's private key signed. The signature lives next to the
manifest as ``manifest.sig``: the 64 signature bytes in base64 (one line of ASCII).

Keys are PEM files: the public key as ``SubjectPublicKeyInfo``, the private key (host only) as
unencrypted PKCS#8. ``cryptography`` is imported when a key is first used.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from edgekit_runtime.bundle import MANIFEST_NAME, SIGNATURE_NAME
from edgekit_runtime.errors import BundleError, EdgekitError

SIGNATURE_BYTES = 64


class SigningKeyError(EdgekitError):
    """A signing or verification key is missing, unreadable or not an Ed25519 PEM key."""


class BundleSignatureError(BundleError):
    """A bundle is unsigned where a signature is required, or its signature does not verify."""


def _ed25519() -> ModuleType:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as err:
        raise SigningKeyError(
            f"bundle signatures need the 'cryptography' package, which cannot be imported: {err}",
            hint="pip install cryptography (a dependency of edgekit-runtime)",
        ) from err
    return ed25519


def _read_pem(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as err:
        raise SigningKeyError(
            f"{what} '{path}' does not exist",
            hint="create a key pair with `edgekit keygen --out DIR`",
        ) from err
    except OSError as err:
        raise SigningKeyError(f"{what} '{path}' cannot be read: {err.strerror or err}") from err


def load_public_key(path: str | os.PathLike[str]) -> Any:
    """The Ed25519 public key in the PEM file at ``path``."""
    path = Path(path)
    ed25519 = _ed25519()
    from cryptography.hazmat.primitives import serialization

    from cryptography.exceptions import UnsupportedAlgorithm

    try:
        key = serialization.load_pem_public_key(_read_pem(path, "public key"))
    except UnsupportedAlgorithm as err:  # an EC curve or key type this cryptography build cannot load
        raise SigningKeyError(f"public key '{path}' is not an Ed25519 key: {err}", hint="create one with `edgekit keygen`") from err
    except ValueError as err:
        raise SigningKeyError(
            f"public key '{path}' is not a PEM public key: {err}",
            hint="pass the .pub.pem file `edgekit keygen` wrote, not the private key",
        ) from err
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise SigningKeyError(f"public key '{path}' is a {type(key).__name__}, not an Ed25519 key", hint="create one with `edgekit keygen`")
    return key


def load_private_key(path: str | os.PathLike[str]) -> Any:
    """The Ed25519 private key in the (unencrypted PKCS#8) PEM file at ``path``."""
    path = Path(path)
    ed25519 = _ed25519()
    from cryptography.hazmat.primitives import serialization

    from cryptography.exceptions import UnsupportedAlgorithm

    try:
        key = serialization.load_pem_private_key(_read_pem(path, "private key"), password=None)
    except UnsupportedAlgorithm as err:
        raise SigningKeyError(f"private key '{path}' is not an Ed25519 key: {err}", hint="create one with `edgekit keygen`") from err
    except (ValueError, TypeError) as err:
        raise SigningKeyError(
            f"private key '{path}' is not an unencrypted PEM private key: {err}",
            hint="pass the .key.pem file `edgekit keygen` wrote",
        ) from err
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SigningKeyError(f"private key '{path}' is a {type(key).__name__}, not an Ed25519 key", hint="create one with `edgekit keygen`")
    return key


def public_key_fingerprint(key: Any) -> str:
    """The first 16 hex digits of the SHA-256 of the raw public key, to name a key in logs and events."""
    from cryptography.hazmat.primitives import serialization

    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def decode_signature(text: str | bytes, *, where: str) -> bytes:
    """Base64 text -> the 64 signature bytes; anything else raises :class:`BundleSignatureError`."""
    try:
        raw = base64.b64decode(text.strip() if isinstance(text, (str, bytes)) else text, validate=True)
    except (binascii.Error, ValueError, TypeError) as err:
        raise BundleSignatureError(f"{where}: the signature is not valid base64: {err}", hint="sign the bundle again with `edgekit sign`") from err
    if len(raw) != SIGNATURE_BYTES:
        raise BundleSignatureError(
            f"{where}: the signature is {len(raw)} bytes, an Ed25519 signature is {SIGNATURE_BYTES}",
            hint="sign the bundle again with `edgekit sign`",
        )
    return raw


def encode_signature(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def read_signature(bundle_dir: str | os.PathLike[str]) -> bytes | None:
    """The signature in ``<bundle_dir>/manifest.sig``, or ``None`` when the bundle is unsigned."""
    path = Path(bundle_dir) / SIGNATURE_NAME
    if not path.is_file():
        return None
    return decode_signature(path.read_bytes(), where=str(path))


def verify_signature_bytes(manifest_bytes: bytes, signature: bytes | None, public_key: Any, *, where: str) -> str:
    """Check ``signature`` over the exact ``manifest_bytes``; returns the key's fingerprint.

    ``public_key`` is a key from :func:`load_public_key` or the path of its PEM file; ``where`` names
    the bundle or archive in errors. A missing signature or one that does not match raises
    :class:`BundleSignatureError`.
    """
    _ed25519()  # a clear error when cryptography is missing
    from cryptography.exceptions import InvalidSignature

    if isinstance(public_key, (str, os.PathLike)):
        public_key = load_public_key(public_key)
    fingerprint = public_key_fingerprint(public_key)
    if signature is None:
        raise BundleSignatureError(
            f"bundle '{where}' is not signed (no {SIGNATURE_NAME}); the fleet accepts only signed bundles",
            hint="sign it on the build host: edgekit sign BUNDLE --key fleet.key.pem",
        )
    try:
        public_key.verify(signature, manifest_bytes)
    except InvalidSignature as err:
        raise BundleSignatureError(
            f"bundle '{where}': the signature in {SIGNATURE_NAME} does not match {MANIFEST_NAME} under the fleet "
            f"key {fingerprint}: the manifest was changed after signing, or it was signed with another key",
            hint="refusing a possibly tampered bundle; rebuild and sign it again with the fleet's private key",
        ) from err
    return fingerprint


def verify_manifest_signature(
    bundle_dir: str | os.PathLike[str], public_key: Any, *, signature: bytes | None = None
) -> str:
    """Check the signature over ``<bundle_dir>/manifest.json``; returns the key's fingerprint.

    ``public_key`` is a key from :func:`load_public_key` or the path of its PEM file. The signature
    is ``signature`` when given, else the bundle's ``manifest.sig``. An unsigned bundle or a
    signature that does not match raises :class:`BundleSignatureError`. Check the files with
    :func:`~edgekit_runtime.bundle.verify_files` as well: the signature only covers the manifest.
    """
    root = Path(bundle_dir)
    if isinstance(public_key, (str, os.PathLike)):
        public_key = load_public_key(public_key)
    if signature is None:
        signature = read_signature(root)
    if signature is None:
        return verify_signature_bytes(b"", None, public_key, where=str(root))
    try:
        manifest_bytes = (root / MANIFEST_NAME).read_bytes()
    except OSError as err:
        raise BundleSignatureError(f"bundle '{root}': {MANIFEST_NAME} cannot be read: {err.strerror or err}") from err
    return verify_signature_bytes(manifest_bytes, signature, public_key, where=str(root))
