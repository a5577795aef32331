"""Which integer kernels a CPU target runs int8 with, from its instruction-set extensions.

ONNX Runtime's x86 u8s8 kernels (uint8 activations times int8 weights) need a dot-product instruction
to be exact. With AVX-512 VNNI, AVX-VNNI or AMX they accumulate straight into int32. With AVX2 alone
they use ``vpmaddubsw``, which adds two u8 x s8 products into an int16 and saturates. 255 x 127 x 2 =
64,770 does not fit in 32,767, so large activations times large weights come out clipped. ONNX
Runtime's remedy is ``reduce_range``: weights in 7 bits (-64..64), so that 255 x 64 x 2 = 32,640
always fits. The plan takes it for an x86 CPU target without a dot-product extension. ARM kernels
widen before they multiply, so they never saturate.

A target names its extensions in ``cpu.isa``. ``host`` reads them from the build machine's
``/proc/cpuinfo``, for a profile of the dev host itself.
"""

from __future__ import annotations

from pathlib import Path

from edgekit.precision import Backend
from edgekit.target import TargetProfile

CPUINFO = Path("/proc/cpuinfo")

#: x86 extensions with an int8 dot product that accumulates in int32 (no int16 saturation).
X86_INT8_DOT_PRODUCT = ("avx512_vnni", "avx_vnni", "amx_int8")

#: The flags that decide int8 kernels; everything else in /proc/cpuinfo is left out of plans and manifests.
KNOWN_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


def read_host_isa(cpuinfo: Path = CPUINFO) -> tuple[str, ...]:
    """The known int8-relevant flags of this machine, from the first ``flags`` (x86) or ``Features``
    (arm64) line of ``cpuinfo``; empty when the file is missing or has neither."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            present = set(value.split())
            return tuple(flag for flag in KNOWN_FLAGS if flag in present)
    return ()


def target_isa(target: TargetProfile, cpuinfo: Path = CPUINFO) -> tuple[tuple[str, ...] | None, str]:
    """(extensions, where they came from); ``None`` when the profile does not say."""
    declared = target.cpu.isa
    if declared == "host":
        return read_host_isa(cpuinfo), f"read from this host's {cpuinfo}"
    if declared is None:
        return None, f"target {target.name} does not set cpu.isa"
    return tuple(declared), f"target {target.name} cpu.isa"


def reduce_range_for(target: TargetProfile, backend: Backend, cpuinfo: Path = CPUINFO) -> tuple[bool, str | None]:
    """(7-bit weights?, why) for an int8 plan: yes on an x86 target whose int8 runs on ONNX Runtime's CPU
    provider without a dot-product extension, or whose extensions are unknown. ``why`` is None when the
    question does not arise (other backends, providers and architectures)."""
    if backend is not Backend.ONNXRUNTIME or target.cpu.arch != "x86_64":
        return False, None
    providers = [ep.name for ep in target.backend(backend).execution_providers]
    if providers and providers[0] != "CPUExecutionProvider":
        return False, None
    isa, source = target_isa(target, cpuinfo)
    if isa is None:
        return True, (f"7-bit int8 weights (reduce_range): {source}, and x86 CPUs without VNNI saturate u8s8 products "
                      "in int16; list the CPU's flags there (e.g. [avx2, avx512_vnni]) to keep 8-bit weights")
    dot_product = [flag for flag in isa if flag in X86_INT8_DOT_PRODUCT]
    if dot_product:
        return False, f"8-bit int8 weights: the CPU has {dot_product[0]} ({source})"
    shown = ", ".join(isa) or "none of " + ", ".join(KNOWN_FLAGS)
    return True, (f"7-bit int8 weights (reduce_range): the CPU has {shown} but no VNNI/AMX ({source}), and ONNX Runtime's "
                  "AVX2 u8s8 kernels would saturate their int16 pair sums")
