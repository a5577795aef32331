"""Small readers for sysfs/procfs files that turn OS errors into :class:`SensorError`."""

from __future__ import annotations

import errno
import math
from pathlib import Path

from edgekit_runtime.errors import SensorError


def read_text(path: Path) -> str:
    """The stripped content of ``path``; :class:`SensorError` naming the path when unreadable."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except PermissionError as exc:
        raise SensorError(
            f"cannot read {path}: permission denied", hint="run the agent as a user allowed to read it"
        ) from exc
    except OSError as exc:
        raise SensorError(f"cannot read {path}: {describe_os_error(exc)}") from exc


def read_number(path: Path) -> float:
    """``path`` parsed as one number (int or float); :class:`SensorError` otherwise."""
    text = read_text(path)
    # Some drivers append a unit ("32760 ma"); the number always comes first.
    token = text.split()[0] if text else ""
    try:
        value = float(int(token)) if token.lstrip("-").isdigit() else float(token)
    except (ValueError, OverflowError) as exc:  # OverflowError: an integer of hundreds of digits
        raise SensorError(f"{path} should hold a number, found {text[:40]!r}") from exc
    if not math.isfinite(value):  # "nan", "inf", "1e999": no reading, and it would poison every sum after it
        raise SensorError(f"{path} should hold a finite number, found {text[:40]!r}")
    return value


def try_read_text(path: Path) -> str | None:
    """The stripped content of ``path``, or ``None`` when it does not exist or cannot be read."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def os_errno(error: SensorError) -> int | None:
    """The ``errno`` of the OS error a :func:`read_text`/:func:`read_number` failure came from, if any."""
    cause = error.__cause__
    return cause.errno if isinstance(cause, OSError) else None


def describe_os_error(exc: OSError) -> str:
    if exc.errno is not None and exc.errno in errno.errorcode:
        return f"{exc.strerror or errno.errorcode[exc.errno]} ({errno.errorcode[exc.errno]})"
    return str(exc)
