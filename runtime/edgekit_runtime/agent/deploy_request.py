"""The ``args`` of a ``deploy`` command (``command.v1``), validated into a :class:`DeployRequest`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edgekit_runtime.agent.deploy_checks import refuse_unsigned_downgrade
from edgekit_runtime.agent.errors import DeployError
from edgekit_runtime.signing import decode_signature


@dataclass(frozen=True)
class DeployRequest:
    """The ``args`` of a ``deploy`` command (``command.v1``), plus an optional base64 ``signature``
    over manifest.json for bundles shipped without their ``manifest.sig``. ``allow_downgrade`` lets
    an older ``bundle_version`` in, ``allow_signature_change`` other inputs or outputs."""

    url: str
    sha256: str | None
    bundle_id: str | None = None
    signature: bytes | None = None
    command_id: str | None = None
    allow_downgrade: bool = False
    allow_signature_change: bool = False
    #: the model of the repository to deploy to (``None``: the default model)
    model: str | None = None

    @classmethod
    def from_args(cls, args: object, *, command_id: str | None = None, require_sha256: bool = True) -> DeployRequest:
        hint = 'send args {"bundle_id": ..., "url": "https://.../bundle.tar", "sha256": "<64 hex>"}'
        if not isinstance(args, Mapping):
            raise DeployError(f"deploy: args must be an object, got {type(args).__name__}", hint=hint)
        known = {"bundle_id", "url", "sha256", "size_bytes", "signature", "allow_downgrade", "allow_signature_change", "model"}
        unknown = sorted(set(args) - known)
        if unknown:
            raise DeployError(f"deploy: unknown args {unknown}", hint=f"known args: {', '.join(sorted(known))}")
        url = args.get("url")
        if not isinstance(url, str) or not url:
            raise DeployError("deploy: args.url is missing", hint=hint)
        sha256 = args.get("sha256")
        if sha256 is None and require_sha256:
            raise DeployError("deploy: args.sha256 is missing", hint=hint)
        if sha256 is not None and (not isinstance(sha256, str) or len(sha256) != 64 or not all(c in "0123456789abcdefABCDEF" for c in sha256)):
            raise DeployError(f"deploy: args.sha256 must be 64 hex digits, got {sha256!r}", hint=hint)
        bundle_id = args.get("bundle_id")
        if bundle_id is not None and not isinstance(bundle_id, str):
            raise DeployError(f"deploy: args.bundle_id must be a string, got {bundle_id!r}", hint=hint)
        signature = args.get("signature")
        raw_signature = None if signature is None else decode_signature(str(signature), where="deploy: args.signature")
        flags = {}
        for flag in ("allow_downgrade", "allow_signature_change"):
            value = args.get(flag, False)
            if not isinstance(value, bool):
                raise DeployError(f"deploy: args.{flag} must be true or false, got {value!r}", hint=f'e.g. "{flag}": true')
            flags[flag] = value
        model = args.get("model")
        if model is not None and not isinstance(model, str):
            raise DeployError(f"deploy: args.model must be a model name (a string), got {model!r}", hint='e.g. "model": "detector"')
        return cls(url, None if sha256 is None else sha256.lower(), bundle_id, raw_signature, command_id, **flags, model=model)

    @classmethod
    def from_command(cls, args: object, *, command_id: str | None, require_signed: bool,
                     config_file: Path | None) -> DeployRequest:
        """:meth:`from_args` for a fleet command: ``allow_downgrade`` only where commands must be signed."""
        request = cls.from_args(args, command_id=command_id)
        refuse_unsigned_downgrade(request.allow_downgrade, require_signed=require_signed, config_file=config_file,
                                  where=f"deploy {request.url}")  # fmt: skip
        return request
