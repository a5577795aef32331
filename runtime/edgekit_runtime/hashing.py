"""Content hashes of bundle files.

Bundles record the SHA-256 of every file so that the device can tell a tampered or truncated copy
from the one the host built.
"""

from __future__ import annotations

import hashlib
import os

ONE_MIB = 1 << 20


def sha256_file(path: str | os.PathLike[str], chunk_bytes: int = ONE_MIB) -> str:
    """Return the lowercase hex SHA-256 of the file at ``path``, read ``chunk_bytes`` at a time.

    Large model files are never read into memory whole. Raises :class:`OSError` (for example
    :class:`FileNotFoundError`) when the file cannot be read; callers turn that into an error that
    names the bundle.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while True:
            block = stream.read(chunk_bytes)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()
