"""What a deploy must not do without being told to: go back to an older bundle, or change the
inputs and outputs that clients of the local API rely on.

* Anti-rollback: every bundle carries ``bundle_version`` in its signed manifest (``edgekit build``
  writes the build time in milliseconds since the Unix epoch; older bundles fall back to their
  ``created`` time in the same unit). The agent keeps the highest version it has accepted per
  bundle name in ``<bundles.dir>/accepted_versions.json`` and refuses an older one unless the deploy
  says ``allow_downgrade: true``. The rollback command and the automatic rollback after a failed
  health watch return to the kept previous bundle and are not deploys, so they stay allowed.
* Served signature: a bundle whose inputs or outputs differ from the served ones (names, dtypes,
  shapes, or a narrower dim range) is refused unless the deploy says ``allow_signature_change: true``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgekit_runtime.agent.errors import DeployError
from edgekit_runtime.signature import IOSignature, TensorSignature

logger = logging.getLogger(__name__)

LEDGER_NAME = "accepted_versions.json"


def _iso(version_ms: int) -> str:
    try:
        return dt.datetime.fromtimestamp(version_ms / 1000, tz=dt.timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return "not a time"


def bundle_version(manifest: Mapping[str, Any], *, where: str) -> int | None:
    """The manifest's ``bundle_version``, else its ``created`` time in ms since the epoch, else ``None``."""
    value = manifest.get("bundle_version")
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DeployError(
                f"{where}: bundle_version must be a non-negative integer, got {value!r}",
                hint="rebuild the bundle with `edgekit build`, which writes the build time in milliseconds",
            )
        return value
    created = manifest.get("created")
    if not isinstance(created, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(created)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return int(moment.timestamp() * 1000)


class VersionLedger:
    """The highest ``bundle_version`` accepted per bundle name, in one JSON file replaced atomically.

    An unreadable ledger refuses deploys (it fails closed) with the file named in the error.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as err:
            raise self._broken(err.strerror or str(err)) from err
        try:
            data = json.loads(text)
        except ValueError as err:
            raise self._broken(f"not valid JSON ({err})") from err
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, dict) or not all(
            isinstance(entry, dict) and isinstance(entry.get("bundle_version"), int) for entry in models.values()
        ):
            raise self._broken("expected {\"models\": {name: {\"bundle_version\": int, ...}}}")
        return models

    def _broken(self, problem: str) -> DeployError:
        return DeployError(
            f"the anti-rollback ledger '{self.path}' cannot be read: {problem}; refusing deploys until it is fixed",
            hint="restore it from a backup, or delete it to trust whatever is deployed next (the device then "
            "forgets which versions it has seen)",
        )

    def highest(self, name: str) -> int | None:
        entry = self._read().get(name)
        return None if entry is None else int(entry["bundle_version"])

    def check(self, name: str, version: int | None, *, allow_downgrade: bool, where: str) -> None:
        """Refuse ``version`` of bundle ``name`` when it is below the highest accepted (or unknown)."""
        highest = self.highest(name)
        if highest is None or allow_downgrade:
            return
        hint = ("to go back on purpose, send the deploy again with allow_downgrade: true; the rollback command "
                "returns to the previous bundle without one")  # fmt: skip
        if version is None:
            raise DeployError(
                f"{where}: bundle '{name}' has neither bundle_version nor created, so this device cannot tell that it "
                f"is not older than version {highest} ({_iso(highest)}) it already accepted; refusing a possible downgrade",
                hint=hint,
            )
        if version < highest:
            raise DeployError(
                f"{where}: bundle '{name}' is version {version} ({_iso(version)}), older than version {highest} "
                f"({_iso(highest)}) this device already accepted; refusing a downgrade",
                hint=hint,
            )

    def record(self, name: str, version: int | None, *, manifest_sha256: str) -> None:
        """Remember ``version`` of ``name`` if it is the highest so far (a lower one changes nothing)."""
        if version is None:
            return
        with self._lock:
            models = self._read()
            if name in models and int(models[name]["bundle_version"]) >= version:
                return
            models[name] = {"bundle_version": version, "manifest_sha256": manifest_sha256, "accepted_at_s": round(time.time(), 3)}
            partial = self.path.with_name(f".{self.path.name}.partial")
            with partial.open("w", encoding="utf-8") as handle:
                json.dump({"models": models}, handle, indent=1, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(partial, self.path)
        logger.info("anti-rollback: %s is now at version %d", name, version)


# -- the served signature ---------------------------------------------------------------------------------


def _tensor_changes(kind: str, old: tuple[TensorSignature, ...], new: tuple[TensorSignature, ...]) -> list[str]:
    old_by_name, new_by_name = {t.name: t for t in old}, {t.name: t for t in new}
    changes = [f"{kind} '{name}' removed" for name in old_by_name if name not in new_by_name]
    changes += [f"{kind} '{name}' added ({new_by_name[name].describe()})" for name in new_by_name if name not in old_by_name]
    for name, tensor in old_by_name.items():
        other = new_by_name.get(name)
        if other is not None and (tensor.dtype, tensor.shape) != (other.dtype, other.shape):
            changes.append(f"{kind} '{name}' {tensor.describe()} -> {other.describe()}")
    return changes


def signature_changes(old: IOSignature, new: IOSignature) -> list[str]:
    """What a client of ``old`` would notice in ``new``: inputs and outputs added, removed or reshaped,
    and dims whose accepted range narrowed (a wider range accepts every old request)."""
    changes = _tensor_changes("input", old.inputs, new.inputs) + _tensor_changes("output", old.outputs, new.outputs)
    for name, bounds in old.dims.items():
        other = new.dims.get(name)
        if other is None:
            continue
        if other.min > bounds.min or other.max < bounds.max:
            changes.append(f"dim {bounds.describe()} -> {other.min}..{other.max}")
    return changes
