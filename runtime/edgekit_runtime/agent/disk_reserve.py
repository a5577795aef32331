"""Space kept back on the agent's state file system, so the writes that must not fail still fit when it is full.

The spool keeps a pre-allocated file, ``.edgekit-disk-reserve`` in its directory (the command replay record
lives beside it by default). When a write that must succeed (a command's replay record, a deploy result, a
checkpoint that lets SQLite shrink its write-ahead log) fails for want of space, the writer releases the
reserve (:meth:`DiskReserve.release`) and tries once more. The spool puts the reserve back
(:meth:`DiskReserve.ensure`) once the file system has room for it and the spool's own headroom again.

The file is written with real blocks (``posix_fallocate``, else zeros), so deleting it really frees space on
every file system, tmpfs included.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from edgekit_runtime.errors import DISK_FULL_ERRNOS

logger = logging.getLogger(__name__)

RESERVE_NAME = ".edgekit-disk-reserve"
#: what the spool holds back by default: a bounded WAL's checkpoint plus a few small commits
DEFAULT_RESERVE_BYTES = 256 * 1024


def free_bytes(directory: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged writer may still use on the file system holding ``directory``."""
    stats = os.statvfs(directory)
    return int(stats.f_bavail) * int(stats.f_frsize)


class DiskReserve:
    """The reserve file in ``directory``: ``size_bytes`` of real blocks, released when a vital write needs them."""

    def __init__(self, directory: str | os.PathLike[str], size_bytes: int = DEFAULT_RESERVE_BYTES, *,
                 name: str = RESERVE_NAME, purpose: str = "a vital write") -> None:  # fmt: skip
        self.directory = Path(directory)
        self.path = self.directory / name
        self.size_bytes = max(int(size_bytes), 0)
        self.purpose = purpose

    @classmethod
    def beside(cls, path: str | os.PathLike[str]) -> DiskReserve:
        """The reserve of the directory that holds ``path`` (the spool's, when ``path`` is next to it)."""
        return cls(Path(path).parent)

    @property
    def held(self) -> bool:
        try:
            return self.path.stat().st_size >= self.size_bytes > 0
        except OSError:
            return False

    def ensure(self, *, keep_free_bytes: int = 0) -> bool:
        """Allocate the reserve if it is missing and the file system has room for it plus ``keep_free_bytes``;
        True when the reserve is held afterwards."""
        if self.size_bytes == 0:
            return False
        if self.held:
            return True
        try:
            if free_bytes(self.directory) < self.size_bytes + keep_free_bytes:
                return False
            partial = self.path.with_name(self.path.name + ".partial")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _allocate(fd, self.size_bytes)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(partial, self.path)
        except OSError as exc:
            self.path.with_name(self.path.name + ".partial").unlink(missing_ok=True)
            if exc.errno not in DISK_FULL_ERRNOS:
                logger.warning("cannot keep the disk reserve %s: %s", self.path, exc)
            return False
        logger.info("disk reserve %s allocated (%d bytes)", self.path, self.size_bytes)
        return True

    def release(self) -> int:
        """Delete the reserve; returns the bytes freed (0 when there was none)."""
        try:
            size = self.path.stat().st_size
            self.path.unlink()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            logger.warning("cannot release the disk reserve %s: %s", self.path, exc)
            return 0
        logger.warning("file system of %s is full: released the disk reserve %s (%d bytes) for %s",
                       self.directory, self.path.name, size, self.purpose)  # fmt: skip
        return size


def _allocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
            raise
    block = b"\0" * 65536
    written = 0
    while written < size:
        written += os.write(fd, block[: min(len(block), size - written)])
