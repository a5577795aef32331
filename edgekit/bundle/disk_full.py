"""A build, a sweep or a pack that runs out of disk space ends with an error that says where, not a traceback.

The files a build writes go to two places: its work folder (the system's temporary folder, ``TMPDIR``) and the
hidden staging folder beside ``--out``. When either file system fills, the error names both with the space left
on each, and the partial output is removed as for any failed build (nothing half-written is left at ``--out``)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from edgekit.errors import BuildError
from edgekit_runtime.errors import DISK_FULL_ERRNOS


class Place(NamedTuple):
    """A folder a command writes to, as the error names it; ``work_folder`` when it is the ``TMPDIR`` work folder."""

    label: str
    folder: Path
    work_folder: bool = False


def _free(folder: Path) -> str:
    probe = Path(folder)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError:
        return "free space unknown"
    return f"{usage.free / 2**20:,.1f} MiB free of {usage.total / 2**20:,.1f} MiB"


@contextlib.contextmanager
def disk_full_as_error(what: str, places: Sequence[Place]) -> Iterator[None]:
    """Turn ENOSPC / EDQUOT raised inside into :class:`BuildError` naming ``what`` ran out of space, the file being
    written when the error names one, and each of ``places`` with its free space now."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in DISK_FULL_ERRNOS:
            raise
        writing = f" writing {exc.filename}" if exc.filename else ""
        where = "; ".join(f"{place.label} {place.folder}: {_free(place.folder)}" for place in places)
        work = " and the work folder too (TMPDIR=/path/with/space)" if any(place.work_folder for place in places) else ""
        raise BuildError(f"{what} ran out of disk space{writing} ({exc.strerror}). {where}",
                         hint=f"free space there, or put the output on a larger disk (--out){work}") from None


def build_places(out_dir: Path) -> list[Place]:
    """Where a build writes: the folder that gets ``--out`` (its staging folder sits there) and the work folder."""
    return [Place("output folder (the bundle is staged there)", Path(out_dir).resolve().parent),
            Place("work folder (TMPDIR)", Path(tempfile.gettempdir()), work_folder=True)]
