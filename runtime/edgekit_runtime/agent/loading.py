"""Every check a bundle passes before the agent serves it, in one place (deploy, start, ``check``).

1. the signature over ``manifest.json`` against the fleet key (unless unsigned bundles are allowed
   and this one carries no signature; with a key configured, a signature that is present must
   verify even then);
2. the manifest and every file's sha256 (:func:`~edgekit_runtime.bundle.open_bundle`);
3. the runner loads, and the golden inputs reproduce the golden outputs (:func:`self_check`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit_runtime.agent.config import BundlesConfig
from edgekit_runtime.backends import create_runner
from edgekit_runtime.backends.base import Runner
from edgekit_runtime.bundle import Bundle, SelfCheckResult, open_bundle, self_check
from edgekit_runtime.signing import read_signature, verify_manifest_signature, verify_signature_bytes

logger = logging.getLogger(__name__)

#: Receives ``(step, details)`` as each check passes: ``signature_verified`` / ``signature_skipped``,
#: ``files_verified``, ``self_check_passed``.
StepCallback = Callable[[str, dict[str, Any]], None]


@dataclass
class LoadedBundle:
    """A bundle that passed every check, with its loaded runner (the caller owns and closes it)."""

    bundle: Bundle
    runner: Runner
    check: SelfCheckResult
    signed_by: str | None

    @property
    def name(self) -> str:
        return self.bundle.name

    def summary(self) -> dict[str, Any]:
        return {
            "bundle": self.bundle.name,
            "path": str(self.bundle.root),
            "signed_by": self.signed_by,
            "self_check": {"passed": self.check.passed, "batches": self.check.batches,
                           "providers": list(self.check.providers)},
        }  # fmt: skip


def check_signature_bytes(manifest_bytes: bytes, signature: bytes | None, config: BundlesConfig, *, where: str) -> str | None:
    """Verify ``signature`` over ``manifest_bytes`` per ``config``; the key fingerprint, ``None`` if skipped."""
    if signature is None and config.allow_unsigned:
        logger.warning("bundle %s is unsigned; accepted because bundles.allow_unsigned is true", where)
        return None
    if config.public_key is None:  # allow_unsigned without a key, and the bundle is signed: cannot check
        logger.warning("bundle %s is signed but bundles.public_key is not set; signature not checked", where)
        return None
    return verify_signature_bytes(manifest_bytes, signature, config.public_key, where=where)


def check_signature(root: Path, config: BundlesConfig, *, signature: bytes | None = None) -> str | None:
    """Verify the bundle's signature per ``config``; returns the key fingerprint, ``None`` if skipped."""
    if signature is None:
        signature = read_signature(root)
    if signature is None and config.allow_unsigned:
        return check_signature_bytes(b"", None, config, where=str(root))
    if config.public_key is None:
        return check_signature_bytes(b"", signature, config, where=str(root))
    return verify_manifest_signature(root, config.public_key, signature=signature)


def load_bundle(
    root: Path,
    config: BundlesConfig,
    *,
    on_step: StepCallback | None = None,
    runner_options: dict[str, dict[str, Any]] | None = None,
) -> LoadedBundle:
    """Run every check on the bundle at ``root`` and return it with a loaded runner; ``runner_options``:
    options over the manifest's, by backend name (:meth:`~edgekit_runtime.agent.config.RunnerConfig.backend_options`).

    Raises :class:`~edgekit_runtime.errors.BundleError` (signature, hashes, self-check) or
    :class:`~edgekit_runtime.errors.BackendError` (the runner cannot load).
    """
    def step(name: str, **details: Any) -> None:
        if on_step is not None:
            on_step(name, details)

    fingerprint = check_signature(root, config)
    step("signature_verified" if fingerprint else "signature_skipped", key=fingerprint)
    bundle = open_bundle(root, verify=True)
    step("files_verified", files=len(bundle.files))
    runner = create_runner(bundle, **(runner_options or {}).get(str(bundle.backend.get("name")), {}))
    try:
        runner.load()
        result = self_check(bundle, runner)
    except BaseException:
        runner.close()
        raise
    step("self_check_passed", batches=result.batches, providers=list(result.providers))
    return LoadedBundle(bundle=bundle, runner=runner, check=result, signed_by=fingerprint)
