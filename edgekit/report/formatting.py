"""Reading a manifest that may have gaps, and writing its numbers for people.

Every function here accepts anything (a missing key, ``None``, a string where a number was
expected) and answers :data:`NA` rather than raising: a report is written for whatever a build
produced, including builds that stopped half way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

NA = "n/a"


def dig(data: Any, *keys: str | int) -> Any:
    """``data[k1][k2]...``, or ``None`` where a key is missing or a level is not a mapping/list."""
    for key in keys:
        if isinstance(key, str) and isinstance(data, Mapping):
            data = data.get(key)
        elif isinstance(key, int) and isinstance(data, (list, tuple)) and -len(data) <= key < len(data):
            data = data[key]
        else:
            return None
    return data


def number(value: Any) -> float | None:
    """``value`` as a finite float, or ``None`` for anything else (bools, strings, NaN, None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def fmt_number(value: Any, digits: int = 4) -> str:
    """A plain number to ``digits`` significant digits; non-numbers as text."""
    x = number(value)
    if x is None:
        return fmt_value(value)
    if isinstance(value, int) or (abs(x) >= 10**digits and abs(x) < 1e15):
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def fmt_sci(value: Any) -> str:
    """Small differences and tolerances: ``3.10e-06``; zero as ``0``."""
    x = number(value)
    if x is None:
        return fmt_value(value)
    return "0" if x == 0 else f"{x:.2e}"


def fmt_cosine(value: Any) -> str:
    """Cosine similarities near 1 written so that they still differ from 1: ``1 - 2.8e-14``,
    ``0.99995``."""
    x = number(value)
    if x is None:
        return fmt_value(value)
    if x == 1 or abs(x) > 1:
        return f"{x:.6g}"
    if 1 - x < 1e-6:
        return f"1 - {1 - x:.1e}"
    return f"{x:.8f}".rstrip("0").rstrip(".")


def fmt_ms(value: Any) -> str:
    x = number(value)
    if x is None:
        return fmt_value(value)
    if abs(x) >= 100:
        return f"{x:,.0f} ms"
    if abs(x) >= 1:
        return f"{x:.2f} ms"
    return f"{x:.3g} ms"


def fmt_seconds(value: Any) -> str:
    x = number(value)
    if x is None:
        return fmt_value(value)
    return f"{x * 1000:.0f} ms" if abs(x) < 1 else f"{x:.2f} s"


def fmt_bytes(value: Any) -> str:
    """Decimal units (1 MB = 10^6 bytes), as the rest of the report uses."""
    x = number(value)
    if x is None:
        return fmt_value(value)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def fmt_mb(value: Any) -> str:
    x = number(value)
    return fmt_value(value) if x is None else f"{x:,.0f} MB" if x >= 100 else f"{x:.3g} MB"


def fmt_percent(part: float | None, whole: float | None) -> str:
    if part is None or not whole:
        return NA
    share = 100 * part / whole
    return "<0.01%" if 0 < share < 0.01 else f"{share:.2g}%" if share < 10 else f"{share:.0f}%"


def fmt_value(value: Any) -> str:
    """Anything as short text: lists as ``[1, 3, seq]``, mappings as ``k=v, ...``, None as n/a."""
    if value is None or value == "":
        return NA
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return NA if number(value) is None else fmt_number(value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={fmt_value(v)}" for k, v in value.items()) or NA
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt_value(v) for v in value) + "]"
    return str(value)


def fmt_host(host: Any, short: bool = False) -> str:
    """A benchmark host: text as is; a mapping (cpu, machine, cores, os, python, ...) as one line.
    ``short`` keeps the processor and core count only."""
    if not isinstance(host, Mapping):
        return fmt_value(host)
    known = ("cpu", "machine", "cores", "os", "python", "cpu_isa")
    cpu, machine, cores, isa = host.get("cpu"), host.get("machine"), host.get("cores"), host.get("cpu_isa")
    parts = [
        f"{cpu} ({machine})" if cpu and machine and not short else cpu or machine,
        f"{cores} cores" if cores else None,
        f"ISA {' '.join(map(str, isa))}" if isa and not short and isinstance(isa, (list, tuple)) else None,
    ]
    if not short:
        parts += [host.get("os"), f"Python {host['python']}" if host.get("python") else None]
        parts += [f"{key}={fmt_value(value)}" for key, value in host.items() if key not in known and value is not None]
    return ", ".join(str(part) for part in parts if part) or NA


def status(passed: Any) -> tuple[str, str]:
    """A badge for a pass/fail flag: (text, css class)."""
    if passed is True:
        return "PASSED", "pass"
    if passed is False:
        return "FAILED", "fail"
    return NA, "na"
