"""What a deploy must not do without being told to: go back to an older bundle, or change the
inputs and outputs that clients of the local API rely on.

* Anti-rollback: every bundle carries ``bundle_version`` in its signed manifest (``edgekit build``
  writes the build time in milliseconds since the Unix epoch; older bundles fall back to their
  ``created`` time in the same unit). The agent keeps the highest version it has accepted per model
  slot (one bundle store: ``bundles.dir``, or ``<models.dir>/<model>``), whatever the bundle's name,
  in the store's ``accepted_versions.json``, and refuses an older one unless the deploy says
  ``allow_downgrade: true``. Over MQTT that flag is honoured only when ``commands.require_signed`` is
  on (so only a command signed by the fleet key carries it), and an honoured downgrade is always
  reported as a ``downgrade_allowed`` event. The rollback command and the automatic rollback after a
  failed health watch return to the kept previous bundle and are not deploys, so they stay allowed.
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
from edgekit_runtime.agent.store import fsync_dir
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
    """The highest ``bundle_version`` accepted in one model slot (one bundle store), whatever the bundles'
    names, in one JSON file replaced atomically: ``{"slot": {"bundle_version", "bundle", ...}}``.

    Ledgers written before versions were per slot hold ``{"models": {bundle name: {...}}}``; every entry of
    such a file was accepted in this slot, so the highest of them all counts (and is kept). An unreadable
    ledger refuses deploys (it fails closed) with the file named in the error. ``slot`` names the model in
    messages (``None``: the one model of ``bundles.dir``).
    """

    def __init__(self, path: str | os.PathLike[str], slot: str | None = None) -> None:
        self.path = Path(path)
        self.slot = slot
        self._lock = threading.Lock()

    @property
    def slot_label(self) -> str:
        return f"model slot '{self.slot}'" if self.slot is not None else "this device's model slot"

    def _read(self) -> dict[str, Any]:
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
        if not isinstance(data, dict):
            raise self._broken("expected a JSON object")
        slot, legacy = data.get("slot"), data.get("models", {})
        if slot is not None and not (isinstance(slot, dict) and _is_version(slot.get("bundle_version"))):
            raise self._broken("expected {\"slot\": {\"bundle_version\": int, ...}}")
        if not isinstance(legacy, dict) or not all(
            isinstance(entry, dict) and _is_version(entry.get("bundle_version")) for entry in legacy.values()
        ):
            raise self._broken("expected {\"models\": {name: {\"bundle_version\": int, ...}}}")
        return data

    def _highest_entry(self, data: dict[str, Any]) -> tuple[int, str] | None:
        """(version, bundle name) of the highest version this slot accepted."""
        entries = [(int(e["bundle_version"]), str(name)) for name, e in data.get("models", {}).items()]
        if data.get("slot") is not None:
            entries.append((int(data["slot"]["bundle_version"]), str(data["slot"].get("bundle", "?"))))
        return max(entries) if entries else None

    def _broken(self, problem: str) -> DeployError:
        return DeployError(
            f"the anti-rollback ledger '{self.path}' cannot be read: {problem}; refusing deploys until it is fixed",
            hint="restore it from a backup, or delete it to trust whatever is deployed next (the device then "
            "forgets which versions it has seen)",
        )

    def highest(self) -> int | None:
        """The highest version this slot accepted, under any bundle name (None: none yet)."""
        entry = self._highest_entry(self._read())
        return None if entry is None else entry[0]

    def downgrade(self, version: int | None) -> tuple[int, str] | None:
        """(highest accepted version, its bundle name) when ``version`` is below it, or unknown while this slot
        has accepted a version; else None."""
        entry = self._highest_entry(self._read())
        if entry is None or (version is not None and version >= entry[0]):
            return None
        return entry

    def check(self, name: str, version: int | None, *, allow_downgrade: bool, where: str) -> None:
        """Refuse ``version`` of bundle ``name`` when it is below the highest this slot accepted (or unknown)."""
        found = self.downgrade(version)
        if found is None or allow_downgrade:
            return
        highest, accepted = found
        of = f" (bundle '{accepted}', {self.slot_label})" if accepted != name else f" ({self.slot_label})"
        hint = ("to go back on purpose, send the deploy again with allow_downgrade: true in a command signed by the "
                "fleet key (the agent needs commands.require_signed: true); the rollback command returns to the "
                "previous bundle without one")  # fmt: skip
        if version is None:
            raise DeployError(
                f"{where}: bundle '{name}' has neither bundle_version nor created, so this device cannot tell that it "
                f"is not older than version {highest} ({_iso(highest)}){of} it already accepted; refusing a possible "
                "downgrade", hint=hint,
            )  # fmt: skip
        raise DeployError(
            f"{where}: bundle '{name}' is version {version} ({_iso(version)}), older than version {highest} "
            f"({_iso(highest)}) this device already accepted; refusing a downgrade{of}",
            hint=hint,
        )

    def record(self, name: str, version: int | None, *, manifest_sha256: str) -> None:
        """Remember ``version`` of bundle ``name`` if it is the highest this slot has seen (a lower one changes nothing)."""
        if version is None:
            return
        with self._lock:
            data = self._read()
            highest = self._highest_entry(data)
            if highest is not None and highest[0] >= version:
                return
            data["slot"] = {"bundle_version": version, "bundle": name, "manifest_sha256": manifest_sha256,
                            "accepted_at_s": round(time.time(), 3)}  # fmt: skip
            partial = self.path.with_name(f".{self.path.name}.partial")
            try:
                with partial.open("w", encoding="utf-8") as handle:
                    json.dump(data, handle, indent=1, sort_keys=True)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(partial, self.path)
            except OSError:
                partial.unlink(missing_ok=True)  # (a full disk) the ledger stays as it was, no half-written copy beside it
                raise
            fsync_dir(self.path.parent)  # the rename itself survives a power cut: the version stays accepted
        logger.info("anti-rollback: %s is now at version %d (bundle %s)", self.slot_label, version, name)


def _is_version(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def refuse_unsigned_downgrade(allow_downgrade: bool, *, require_signed: bool, config_file: Path | None, where: str) -> None:
    """Refuse ``allow_downgrade`` in a fleet command unless the agent accepts only commands signed by the fleet
    key (``commands.require_signed``): otherwise anyone who can publish on the device's command topic could
    send an old, validly signed bundle with it."""
    if not allow_downgrade or require_signed:
        return
    raise DeployError(
        f"{where}: args.allow_downgrade is honoured only in commands signed by the fleet key, and this agent does not "
        f"require signed commands ({config_file or 'the agent config'}: commands.require_signed is false); refusing",
        hint="set commands.require_signed: true (with bundles.public_key) and send the deploy with `edgekit fleet "
             "deploy --sign-commands KEY`; or deploy a bundle with a higher bundle_version; the rollback command "
             "returns to the previous bundle without a downgrade",
    )


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
