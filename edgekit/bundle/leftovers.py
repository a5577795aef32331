"""Folders a build writes into, held with a lock while it runs, so that what a killed build left is found and
removed by the next one.

``edgekit build`` writes into a work folder (``edgekit-build-flock-*`` in the temporary folder: exported and quantized
models, hundreds of MB for a large model) and into a hidden staging folder beside ``--out``
(``.NAME.partial-flock-*``). A failed or interrupted build removes both; a build that is killed (``kill -9``, the OOM
killer, a power cut) cannot. Each such folder is held with ``flock`` on its directory while its build runs (the
kernel drops the lock when the process dies, in any PID namespace); a later build removes the folders of its
pattern whose lock it can take and that have not changed for :data:`ABANDONED_AFTER_S` (a folder made a moment
ago is not yet locked)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

#: A folder of a build's pattern is someone else's, still starting, unless unchanged for this long.
ABANDONED_AFTER_S = 60.0
#: In the names of the folders held this way, so that an older edgekit's folders (never locked, maybe in use by
#: a build of that version running beside this one) never match the pattern removed.
HELD = "flock-"


def hold(folder: Path) -> int:
    """Lock ``folder`` for this process (an open descriptor with ``flock``); :func:`release` or exiting drops it."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def release(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def remove_abandoned(parent: Path, pattern: str, *, older_than_s: float = ABANDONED_AFTER_S) -> list[Path]:
    """Remove the folders in ``parent`` matching ``pattern`` that no running build holds (their lock is free)
    and that are older than ``older_than_s``; returns them. Anything else (a file, a link, a held folder) stays."""
    removed: list[Path] = []
    now = time.time()
    try:
        candidates = sorted(Path(parent).glob(pattern))
    except OSError:
        return removed
    for candidate in candidates:
        try:
            if candidate.is_symlink() or not candidate.is_dir() or now - candidate.stat().st_mtime < older_than_s:
                continue
            fd = hold(candidate)
        except OSError:  # held by a running build, or gone meanwhile
            continue
        try:
            shutil.rmtree(candidate, ignore_errors=True)
        finally:
            release(fd)
        if not candidate.exists():
            removed.append(candidate)
            log.info("removed %s, left by a build that was killed", candidate)
    return removed


@contextlib.contextmanager
def work_folder(prefix: str) -> Iterator[Path]:
    """A temporary folder like :class:`tempfile.TemporaryDirectory`, held while in use, after removing the
    ``prefix*`` folders killed runs left in the temporary folder."""
    remove_abandoned(Path(tempfile.gettempdir()), f"{prefix}{HELD}*")
    path = Path(tempfile.mkdtemp(prefix=prefix + HELD))
    fd = hold(path)
    try:
        yield path
    finally:
        release(fd)
        shutil.rmtree(path, ignore_errors=True)
