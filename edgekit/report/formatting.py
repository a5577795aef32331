"""Reading a manifest that may have gaps, and writing its numbers for people.

Every function here accepts anything (a missing key, ``None``, a string where a number was
expected) and answers :data:`NA` rather than raising: a report is written for whatever a build
produced, including builds that stopped half way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from edgekit_runtime.timing import PEAK_SINCE_BENCHMARK

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


def as_list(value: Any) -> list[Any]:
    """``value`` when it is a list, else ``[]`` (a manifest field that is null or of another type)."""
    return value if isinstance(value, list) else []


def as_dict(value: Any) -> dict[Any, Any]:
    """``value`` when it is a dict, else ``{}`` (a manifest field that is null or of another type)."""
    return value if isinstance(value, dict) else {}


def number(value: Any) -> float | None:
    """``value`` as a finite float, or ``None`` for anything else (bools, strings, NaN, None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        x = float(value)
    except OverflowError:  # an integer past any float (a hostile manifest)
        return None
    return x if math.isfinite(x) else None


def fmt_number(value: Any, digits: int = 4) -> str:
    """A plain number to ``digits`` significant digits; non-numbers as text."""
    x = number(value)
    if x is None:
        return fmt_value(value)
    rounded = float(f"{x:.{digits}g}")  # 9999.6 to 4 digits is 10,000, not 1e+04: the threshold applies to what is written
    if isinstance(value, int) or (abs(rounded) >= 10**digits and abs(x) < 1e15):
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
    if abs(float(f"{x:.2f}")) >= 100:  # compared as written: 99.996 is "100 ms", not "100.00 ms"
        return f"{x:,.0f} ms"
    if abs(float(f"{x:.3g}")) >= 1:  # 0.9996 is "1.00 ms", not "1 ms"
        return f"{x:.2f} ms"
    return f"{x:.3g} ms"


def fmt_seconds(value: Any) -> str:
    x = number(value)
    if x is None:
        return fmt_value(value)
    return f"{x * 1000:.0f} ms" if abs(x) < 1 else f"{x:.2f} s"


#: Units of :func:`fmt_bytes`, decimal (1 MB = 10^6 bytes) as everywhere in edgekit's output.
BYTE_UNITS = (("B", 1.0), ("KB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12))


def fmt_bytes(value: Any, unit: str | None = None) -> str:
    """A size for people, the one way edgekit writes sizes (CLI, report, sweep): ``8 B``, ``1.5 KB``,
    ``90.5 MB``, ``1.23 GB``; three significant digits, never an exponent, whole bytes below 1 KB.
    ``unit`` ("MB", ...) fixes the unit, for columns that compare sizes."""
    x = number(value)
    if x is None:
        return fmt_value(value)
    scales = dict(BYTE_UNITS)
    if unit is not None:
        if unit not in scales:
            raise ValueError(f"fmt_bytes: unit {unit!r} is not one of {', '.join(scales)}")
        return f"{_three_digits(x / scales[unit], whole=unit == 'B')} {unit}"
    chosen, scale = BYTE_UNITS[0]
    for name, size in BYTE_UNITS:
        if abs(x) >= size:
            chosen, scale = name, size
    text = _three_digits(x / scale, whole=chosen == "B")
    if chosen != BYTE_UNITS[-1][0] and float(text.replace(",", "")) >= 1000:  # 999.96 KB rounds to 1000 KB: say 1 MB
        index = [name for name, _ in BYTE_UNITS].index(chosen) + 1
        chosen, scale = BYTE_UNITS[index]
        text = _three_digits(x / scale, whole=False)
    return f"{text} {chosen}"


def _three_digits(x: float, *, whole: bool) -> str:
    """``x`` to three significant digits in fixed notation (``0.00012``, ``1.5``, ``90.5``, ``1,234``)."""
    if whole or x == 0:
        return f"{x:,.0f}"
    magnitude = math.floor(math.log10(abs(x)))
    decimals = max(0, 2 - magnitude)
    return f"{x:,.{decimals}f}".rstrip("0").rstrip(".") if decimals else f"{x:,.0f}"


def fmt_mib(value: Any) -> str:
    """A figure recorded in MiB (``peak_rss_mb``: VmHWM kB / 1024) written as :func:`fmt_bytes` writes sizes (decimal)."""
    x = number(value)
    return fmt_value(value) if x is None else fmt_bytes(x * 2**20)




def peak_rss_note(bench: Any) -> str:
    """What a manifest's ``benchmark.peak_rss_mb`` covers. The build benchmarks in its own process, so the figure is that
    process's resident memory (torch, the exporter and quantizer included), never the model's own footprint on the device;
    without ``peak_rss_scope`` (the process could not reset its peak, or an older manifest) it is the build's lifetime peak."""
    if dig(bench, "peak_rss_scope") == PEAK_SINCE_BENCHMARK:  # the peak was reset just before the benchmark
        return "the build process's peak during the benchmark, torch and the build's libraries included: not the model's own footprint"
    return "the build process's lifetime peak (torch, export, quantization, evaluation): not the model's own footprint"


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


def measured_on_target(manifest: Any) -> bool:
    """Whether the build host's numbers (benchmark, accuracy) are the target's own: only for a profile that
    describes the build host itself (``cpu.isa: host``, as ``x86-64-cpu``)."""
    return dig(manifest, "target", "cpu", "isa") == "host"


def host_cpu(manifest: Any) -> str:
    """The build host's CPU as the manifest's benchmark recorded it, e.g. ``Intel(R) Xeon(R) ..., 2 cores``."""
    return fmt_host(dig(manifest, "benchmark", "host"), short=True)


def where_measured(manifest: Any) -> str:
    """Where the benchmark and accuracy numbers come from, for a label: ``on this host (CPU, 2 cores)``,
    plus ``, not on <target>`` when the target is another device."""
    host = dig(manifest, "benchmark", "host")
    where = f"on this host ({host_cpu(manifest)})" if host else "on this host"
    if measured_on_target(manifest):
        return where
    target = dig(manifest, "target", "display_name") or dig(manifest, "target", "name")
    return f"{where}, not on the {target}" if target else where


def bundle_vs_fp32(manifest: Any) -> dict[str, Any] | None:
    """The built model's own deviation from the FP32 reference, as the golden self-check measured it on the
    golden inputs: ``{max_abs_diff, cosine_min, outputs}`` over all outputs (worst of each); ``None`` when the
    manifest has no measurements (older bundles, a build that stopped before the golden stage)."""
    outputs = dig(manifest, "golden", "outputs")
    if not isinstance(outputs, Mapping):
        return None
    diffs = [d for entry in outputs.values() if (d := number(dig(entry, "measured", "max_abs_diff"))) is not None]
    cosines = [c for entry in outputs.values() if (c := number(dig(entry, "measured", "cosine_min"))) is not None]
    if not diffs and not cosines:
        return None
    return {"max_abs_diff": max(diffs) if diffs else None, "cosine_min": min(cosines) if cosines else None,
            "outputs": len(outputs)}  # fmt: skip


def device_applied_precision(manifest: Any) -> bool:
    """A TensorRT bundle whose precision (fp16, bf16, ...) TensorRT applies through builder flags on the device: its ONNX
    graph is the FP32 one (``backend.tensorrt.onnx_precision: as-exported``), so whatever this host measured on it is the
    FP32 graph's, not the bundle precision's."""
    precision = dig(manifest, "precision")
    return dig(manifest, "backend", "tensorrt", "onnx_precision") == "as-exported" and precision is not None and precision != "fp32"


def status(passed: Any) -> tuple[str, str]:
    """A badge for a pass/fail flag: (text, css class)."""
    if passed is True:
        return "PASSED", "pass"
    if passed is False:
        return "FAILED", "fail"
    return NA, "na"
