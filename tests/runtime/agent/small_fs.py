"""A real, small file system for disk-full tests: a tmpfs of a few MiB mounted in the test's tmp dir.

Needs root and a kernel that lets this process mount tmpfs (true on the development hosts and in CI's
privileged container); elsewhere the tests that use it skip, saying why.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted_tmpfs(mount_point: Path, size_kib: int) -> Iterator[Path]:
    mount_point.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(mount_point)],
                            capture_output=True, text=True, check=False)  # fmt: skip
    if result.returncode != 0:
        pytest.skip(f"cannot mount a {size_kib} KiB tmpfs at {mount_point} (needs root): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


def fill(directory: Path, name: str = "filler") -> Path:
    """Write zeros to ``directory/name`` until the file system has no byte left; returns the file."""
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (64 * 1024, 4096, 512, 1):
            block = b"\0" * chunk
            while True:
                try:
                    os.write(fd, block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    assert os.statvfs(directory).f_bavail == 0, "the file system still has free blocks"
    return path
