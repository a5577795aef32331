"""Ed25519 signatures on fleet commands, with the fleet key that signs bundles.

The host signs, the device verifies, the bytes

    b"edgekit.command/1\\n" + fleet + b"\\n" + device + b"\\n" + canonical JSON of the command without "signature"

(canonical: keys sorted, no spaces, UTF-8, as :func:`canonical_command_bytes` writes it), and sends
the 64 signature bytes in base64 as the command's ``signature`` field. Fleet and device are part of
what is signed, so a command signed for one device is refused by every other; ``id`` and
``issued_at`` are inside the JSON, so the replay window (:mod:`~edgekit_runtime.agent.replay`) still
refuses a captured signed command.

On the device, ``commands.require_signed: true`` refuses unsigned commands; a signature that is present
is always checked against ``bundles.public_key``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from edgekit_runtime.errors import EdgekitError
from edgekit_runtime.signing import SIGNATURE_BYTES, public_key_fingerprint

SIGNATURE_FIELD = "signature"
_CONTEXT = b"edgekit.command/1\n"


class CommandSignatureError(EdgekitError):
    """A command is unsigned where a signature is required, or its signature does not verify."""


def canonical_command_bytes(command: Mapping[str, Any], *, fleet: str, device: str) -> bytes:
    """What a command's signature covers (see the module docstring)."""
    body = {key: value for key, value in command.items() if key != SIGNATURE_FIELD}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return _CONTEXT + fleet.encode("utf-8") + b"\n" + device.encode("utf-8") + b"\n" + text.encode("utf-8")


def sign_command(command: Mapping[str, Any], private_key: Any, *, fleet: str, device: str) -> dict[str, Any]:
    """``command`` plus its ``signature`` for ``fleet``/``device``; ``private_key`` from
    :func:`edgekit_runtime.signing.load_private_key`."""
    signature = private_key.sign(canonical_command_bytes(command, fleet=fleet, device=device))
    return {**{k: v for k, v in command.items() if k != SIGNATURE_FIELD},
            SIGNATURE_FIELD: base64.b64encode(signature).decode("ascii")}  # fmt: skip


def verify_command(command: Mapping[str, Any], public_key: Any, *, fleet: str, device: str) -> str:
    """Check the ``signature`` of ``command`` for ``fleet``/``device``; returns the key's fingerprint.
    A missing, malformed or non-matching signature raises :class:`CommandSignatureError`."""
    from cryptography.exceptions import InvalidSignature

    fingerprint = public_key_fingerprint(public_key)
    hint = "sign commands with the fleet's private key: edgekit fleet deploy --sign-commands fleet.key.pem"
    text = command.get(SIGNATURE_FIELD)
    if text is None:
        raise CommandSignatureError("command is not signed, and this agent accepts only signed commands "
                                    "(commands.require_signed)", hint=hint)  # fmt: skip
    try:
        raw = base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError) as err:
        raise CommandSignatureError(f"command signature is not valid base64: {err}", hint=hint) from err
    if len(raw) != SIGNATURE_BYTES:
        raise CommandSignatureError(f"command signature is {len(raw)} bytes, an Ed25519 signature is {SIGNATURE_BYTES}",
                                    hint=hint)  # fmt: skip
    try:
        public_key.verify(raw, canonical_command_bytes(command, fleet=fleet, device=device))
    except InvalidSignature as err:
        raise CommandSignatureError(
            f"command signature does not verify under the fleet key {fingerprint} for device {fleet}/{device}: the "
            "command was changed after signing, signed for another device, or signed with another key", hint=hint,
        ) from err
    return fingerprint
