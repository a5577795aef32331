"""The bundle directory on the device: versions, and the ``current`` / ``previous`` links.

::

    <bundles.dir>/
      versions/<name>-<sha12>/   one complete bundle per deployed version (moved in with one rename)
      staging/                   downloads and unpacking in progress (emptied at start)
      current -> versions/...    what the agent serves
      previous -> versions/...   what a rollback returns to

Links are replaced atomically: a new symlink is written under a temporary name and renamed over the
old one, and the directory is fsync'ed. A power cut therefore leaves each link at its old or its new
target, never missing; a switch updates ``previous`` first, so at every moment both links name
complete versions.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from edgekit_runtime.agent.errors import DeployError

logger = logging.getLogger(__name__)

CURRENT = "current"
PREVIOUS = "previous"
VERSIONS_DIR = "versions"
STAGING_DIR = "staging"
META_SUFFIX = ".deploy.json"
REPLACED_MARK = ".replaced-"  # .<version><mark><hex>: an old copy of a version moved aside while a new one moves in
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def version_name(bundle_name: str, manifest_sha256: str) -> str:
    """The directory name of a version: the bundle's name made path-safe plus 12 hex of its manifest hash.

    This is also the bundle's id everywhere: ``edgekit pack`` prints it, ``edgekit fleet deploy`` sends it,
    the agent and the simulator report it, the fleet store keys on it (content-addressed: the same bytes of
    ``manifest.json`` give the same id)."""
    safe = _UNSAFE_CHARS.sub("-", bundle_name).strip(".-")[:80] or "bundle"
    return f"{safe}-{manifest_sha256[:12]}"


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in ``path`` durable (best effort: file systems that refuse are left as they are)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


LOCK_NAME = ".agent.lock"
_held_locks: dict[str, list[int]] = {}  # resolved bundle dir -> [descriptor holding its lock, stores using it]
_held_locks_guard = threading.Lock()


def take_process_lock(root: Path, what: str = "bundle directory") -> None:
    """Take ``root``'s lock for this process (counted: again in the same process is one more user), so that
    two processes never move one store's links or clear its staging under each other: ``edgekit-agent
    install`` while the agent runs, or two agents on one ``bundles.dir``."""
    key = str(root.resolve())
    with _held_locks_guard:
        if key in _held_locks:
            _held_locks[key][1] += 1
            return
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise DeployError(
                f"{what} '{root}' is in use by another process (pid {holder}): an edgekit-agent runs on it",
                hint="deploy to a running agent with `edgekit fleet deploy`, or stop the agent (systemctl stop "
                f"edgekit-agent) before `edgekit-agent install`; one agent per {'models.dir' if what == 'models.dir' else 'bundles.dir'}",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        _held_locks[key] = [fd, 1]


def drop_process_lock(root: Path) -> None:
    key = str(root.resolve())
    with _held_locks_guard:
        held = _held_locks.get(key)
        if held is None:
            return
        held[1] -= 1
        if held[1] <= 0:
            del _held_locks[key]
            os.close(held[0])  # closing the descriptor releases the flock


class BundleStore:
    """The on-disk layout above; all paths it returns are inside ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._locked = False

    def release(self) -> None:
        """Give up this store's share of the bundle directory's lock (taken by :meth:`prepare`)."""
        if self._locked:
            self._locked = False
            drop_process_lock(self.root)

    @property
    def versions_dir(self) -> Path:
        return self.root / VERSIONS_DIR

    @property
    def staging_dir(self) -> Path:
        return self.root / STAGING_DIR

    def prepare(self) -> None:
        """Create the layout and clear leftovers of an interrupted run (temporary links, staging)."""
        try:
            self.versions_dir.mkdir(parents=True, exist_ok=True)
            if not self._locked:
                take_process_lock(self.root)
                self._locked = True
            if self.staging_dir.exists():
                shutil.rmtree(self.staging_dir, ignore_errors=True)
            self.staging_dir.mkdir(parents=True, exist_ok=True)
            self._restore_replaced()
        except OSError as err:
            raise DeployError(
                f"bundle directory '{self.root}' cannot be prepared: {err.strerror or err}",
                hint="make bundles.dir writable by the agent (ReadWritePaths= in the systemd unit)",
            ) from err
        for leftover in self.root.glob(".*.tmp-*"):
            logger.info("removing %s left by an interrupted switch", leftover)
            leftover.unlink(missing_ok=True)

    def new_staging_dir(self) -> Path:
        path = self.staging_dir / uuid.uuid4().hex
        path.mkdir(parents=True)
        return path

    # -- links ----------------------------------------------------------------------------------------

    def target(self, link: str) -> Path | None:
        """Where ``current`` or ``previous`` points (even when that is gone), or ``None`` without the link."""
        path = self.root / link
        if not path.is_symlink():
            return None
        target = Path(os.readlink(path))
        return target if target.is_absolute() else self.root / target

    @property
    def current(self) -> Path | None:
        return self.target(CURRENT)

    @property
    def previous(self) -> Path | None:
        return self.target(PREVIOUS)

    def _point(self, link: str, version_dir: Path) -> None:
        relative = os.path.relpath(version_dir, self.root)
        temporary = self.root / f".{link}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            os.symlink(relative, temporary)
            os.replace(temporary, self.root / link)
        except OSError as err:
            temporary.unlink(missing_ok=True)
            raise DeployError(f"cannot point '{self.root / link}' at '{version_dir}': {err.strerror or err}") from err
        fsync_dir(self.root)

    def switch_to(self, version_dir: Path) -> Path | None:
        """Make ``version_dir`` current; the old current becomes previous. Returns the old current."""
        old_current, old_previous = self.current, self.previous
        if old_current is not None and old_current != version_dir:
            self._point(PREVIOUS, old_current)
        try:
            self._point(CURRENT, version_dir)
        except DeployError:  # (a full disk: no inode for the new link) the switch did not happen: previous as it was
            if old_previous is not None and old_previous != old_current:
                with contextlib.suppress(DeployError, OSError):
                    self._point(PREVIOUS, old_previous)
            raise
        return old_current

    def swap_current_and_previous(self) -> tuple[Path, Path | None]:
        """Rollback on disk: ``current`` <- ``previous`` and ``previous`` <- the old current.

        ``current`` is moved first, so a power cut in between leaves both links at the rollback target.
        Returns ``(new current, new previous)``.
        """
        previous, current = self.previous, self.current
        if previous is None:
            raise DeployError(
                f"no previous bundle to roll back to in '{self.root}'",
                hint="a rollback needs an earlier deploy; deploy the wanted bundle instead",
            )
        self._point(CURRENT, previous)
        if current is not None and current != previous:
            self._point(PREVIOUS, current)
        return previous, current

    def point_current(self, version_dir: Path) -> None:
        """Point only ``current`` (used at start when ``current`` is broken and ``previous`` works)."""
        self._point(CURRENT, version_dir)

    # -- versions -------------------------------------------------------------------------------------

    def install(self, staged_bundle: Path, name: str) -> Path:
        """Move a verified staged bundle into ``versions/<name>`` with one rename. An older copy of that
        version is replaced, since only the staged copy was just verified (the caller does not
        replace the version it serves)."""
        destination = self.versions_dir / name
        replaced = self.versions_dir / f".{name}{REPLACED_MARK}{uuid.uuid4().hex[:8]}"
        try:  # the old copy moves aside with a rename, not a delete: a kill in between leaves it to restore
            if destination.exists():
                os.replace(destination, replaced)
            os.replace(staged_bundle, destination)
        except OSError as err:
            if replaced.exists() and not destination.exists():
                with contextlib.suppress(OSError):
                    os.replace(replaced, destination)
            raise DeployError(f"cannot move '{staged_bundle}' to '{destination}': {err.strerror or err}") from err
        fsync_dir(self.versions_dir)
        shutil.rmtree(replaced, ignore_errors=True)
        return destination

    def _restore_replaced(self) -> None:
        """Finish an :meth:`install` a kill interrupted: an old copy moved aside goes back where no new copy
        arrived, and is deleted where one did."""
        for aside in self.versions_dir.glob(f".*{REPLACED_MARK}*"):
            original = self.versions_dir / aside.name[1:].rsplit(REPLACED_MARK, 1)[0]
            if original.exists():
                shutil.rmtree(aside, ignore_errors=True)
                continue
            logger.info("restoring %s, moved aside by an interrupted install", original.name)
            with contextlib.suppress(OSError):
                os.replace(aside, original)

    def prune(self, keep: int = 2) -> list[Path]:
        """Delete versions other than current and previous, oldest first, keeping ``keep`` in all."""
        protected = {p.resolve() for p in (self.current, self.previous) if p is not None}
        candidates = sorted(
            (p for p in self.versions_dir.iterdir() if p.is_dir() and not p.name.startswith(".") and p.resolve() not in protected),
            key=lambda p: p.stat().st_mtime,
        )
        removable = max(len(candidates) + len(protected) - keep, 0)
        removed = candidates[:removable]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
            self.meta_path(path).unlink(missing_ok=True)
            logger.info("removed old bundle version %s", path.name)
        return removed

    # -- per-version metadata (bundle id, source), beside the version: a bundle holds only its files --

    def meta_path(self, version_dir: Path) -> Path:
        return version_dir.with_name(f".{version_dir.name}{META_SUFFIX}")

    def write_meta(self, version_dir: Path, **meta: Any) -> None:
        meta["installed_at_s"] = time.time()
        path = self.meta_path(version_dir)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(meta), encoding="utf-8")
        os.replace(partial, path)

    def bundle_id(self, version_dir: Path) -> str:
        """The id a version is reported under: the one its deploy command named, else its content id (the
        version's directory name, :func:`version_name`). A bare bundle name, which agents before issue 32
        recorded for ``edgekit-agent install``, counts as no id."""
        named = self.read_meta(version_dir).get("bundle_id")
        if not isinstance(named, str) or not named or version_dir.name == f"{named}-{version_dir.name[-12:]}":
            return version_dir.name
        return named

    def read_meta(self, version_dir: Path) -> dict[str, Any]:
        try:
            data = json.loads(self.meta_path(version_dir).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}
