"""What a device is: board, SoC, OS, Jetson Linux / JetPack, CUDA, TensorRT, ONNX Runtime, CPU, memory.

Read once when the agent starts (:func:`read_identity`), from files under an injectable ``root``:

* board: the device-tree model (``proc/device-tree/model``, NUL-terminated, or
  ``sys/firmware/devicetree/base/model``), else DMI (``sys/class/dmi/id/product_name`` and
  ``sys_vendor``) on x86; the SoC is the last entry of ``proc/device-tree/compatible`` (NUL-separated,
  most specific first, e.g. ``nvidia,p3768-0000+p3767-0005``, ``nvidia,p3767-0005``, ``nvidia,tegra234``);
* OS: ``etc/os-release`` (``os-release(5)``: ``PRETTY_NAME``, ``ID``, ``VERSION_ID``);
* L4T: the first line of ``etc/nv_tegra_release`` (``# R36 (release), REVISION: 4.3, GCID: ...``), else
  the version of the ``nvidia-l4t-core`` package in ``var/lib/dpkg/status``; JetPack from
  :mod:`~edgekit_runtime.sensors.jetson_releases`;
* CUDA: ``usr/local/cuda/version.json`` (``{"cuda": {"version": "12.6.68"}}``), else ``version.txt``
  (``CUDA Version 10.2.300``);
* TensorRT: the ``tensorrt`` Python distribution, else the ``tensorrt`` / ``libnvinfer<N>`` package in
  ``var/lib/dpkg/status``, else the newest ``libnvinfer.so.<version>`` in the multiarch library folders;
* ONNX Runtime: the ``onnxruntime`` (or ``onnxruntime-gpu``) distribution's metadata, and its available
  providers once the process has imported ``onnxruntime`` (:meth:`DeviceIdentity.with_onnxruntime_providers`
  fills them in after a model has loaded; ``import_onnxruntime=True`` imports it to list them at once);
* CPU: ``proc/cpuinfo`` (``processor`` entries, ``model name`` or the Arm implementer/part, ISA flags
  among :data:`ISA_FLAGS_OF_INTEREST`); memory: ``MemTotal`` of ``proc/meminfo``;
* NVIDIA GPU on a PC or server: ``Model:`` in ``proc/driver/nvidia/gpus/<bus id>/information``.

The Python environment (TensorRT and ONNX Runtime distributions) is this process's own, so it is
consulted only for the live root ``/`` unless a :class:`PythonEnvironment` is passed. A field that
cannot be read is ``None``; nothing is guessed.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgekit_runtime.sensors._files import try_read_text
from edgekit_runtime.sensors.jetson_releases import jetpack_for_l4t

logger = logging.getLogger(__name__)

MODEL_PATHS = ("proc/device-tree/model", "sys/firmware/devicetree/base/model")
COMPATIBLE_PATHS = ("proc/device-tree/compatible", "sys/firmware/devicetree/base/compatible")
DMI_PRODUCT_PATH = "sys/class/dmi/id/product_name"
DMI_VENDOR_PATH = "sys/class/dmi/id/sys_vendor"
OS_RELEASE_PATHS = ("etc/os-release", "usr/lib/os-release")
NV_TEGRA_RELEASE_PATH = "etc/nv_tegra_release"
DPKG_STATUS_PATH = "var/lib/dpkg/status"
CUDA_VERSION_JSON = "usr/local/cuda/version.json"
CUDA_VERSION_TXT = "usr/local/cuda/version.txt"
LIBRARY_DIRS = ("usr/lib/aarch64-linux-gnu", "usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib")
CPUINFO_PATH = "proc/cpuinfo"
MEMINFO_PATH = "proc/meminfo"
NVIDIA_GPUS_DIR = "proc/driver/nvidia/gpus"
TENSORRT_PACKAGES = ("tensorrt", "libnvinfer10", "libnvinfer8", "libnvinfer7")

#: ISA extensions that change which kernels inference runs (reported when present, others left out).
ISA_FLAGS_OF_INTEREST = (
    # x86 (/proc/cpuinfo "flags")
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
    # Arm (/proc/cpuinfo "Features"): FP16 arithmetic, int8 dot product and matrix multiply, BF16, SVE
    "asimd", "asimdhp", "asimddp", "i8mm", "bf16", "sve", "sve2", "svei8mm", "svebf16", "sme",
)  # fmt: skip
#: Arm ``CPU implementer`` 0x41 parts (Linux ``arch/arm64/include/asm/cputype.h``).
ARM_CPU_PARTS = {
    "0xd03": "Cortex-A53", "0xd05": "Cortex-A55", "0xd08": "Cortex-A72", "0xd0b": "Cortex-A76", "0xd0c": "Neoverse-N1",
    "0xd40": "Neoverse-V1", "0xd41": "Cortex-A78", "0xd42": "Cortex-A78AE", "0xd4f": "Neoverse-V2",
    "0xd83": "Neoverse-V3AE", "0xd84": "Neoverse-V3",
}  # fmt: skip
_NV_TEGRA_RE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([0-9.]+)")


@dataclass(frozen=True)
class PythonEnvironment:
    """Where the TensorRT and ONNX Runtime versions come from: ``package_version(name)`` -> version or
    ``None``; ``onnxruntime_providers()`` -> the providers this ONNX Runtime build can use."""

    package_version: Callable[[str], str | None]
    onnxruntime_providers: Callable[[], list[str]]

    @classmethod
    def this_process(cls, *, import_onnxruntime: bool = False) -> PythonEnvironment:
        """This process's distributions, versions from their metadata. ONNX Runtime's providers are listed only
        once ``onnxruntime`` has been imported (a model loaded) unless ``import_onnxruntime``: importing it just
        to list them would cost an idle agent about 20 MB of RSS (its native library)."""
        return cls(_installed_version, _ort_providers if import_onnxruntime else _imported_ort_providers)

    @classmethod
    def empty(cls) -> PythonEnvironment:
        return cls(lambda name: None, list)


def _installed_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _ort_providers() -> list[str]:
    try:
        import onnxruntime
    except ImportError:
        return []
    return list(onnxruntime.get_available_providers())


def _imported_ort_providers() -> list[str]:
    """The providers of an ``onnxruntime`` this process has already imported; ``[]`` while it has not."""
    providers = getattr(sys.modules.get("onnxruntime"), "get_available_providers", None)  # None mid-import too
    return list(providers()) if providers is not None else []


@dataclass(frozen=True)
class DeviceIdentity:
    """What the device is. ``*_source`` fields name the file (or package) a value came from."""

    board: str | None
    board_source: str | None
    compatible: tuple[str, ...]
    soc: str | None
    os_name: str | None
    os_id: str | None
    os_version_id: str | None
    l4t: str | None
    l4t_source: str | None
    jetpack: str | None
    cuda: str | None
    tensorrt: str | None
    tensorrt_source: str | None
    onnxruntime: str | None
    onnxruntime_providers: tuple[str, ...]
    cpu_arch: str | None
    cpu_model: str | None
    cpu_cores: int | None
    isa_flags: tuple[str, ...]
    memory_total_mb: float | None
    gpu_name: str | None
    notes: tuple[str, ...] = field(default=())  # what could not be read or looked odd

    def with_onnxruntime_providers(self, python: PythonEnvironment | None = None) -> DeviceIdentity:
        """This identity with ONNX Runtime's providers filled in, when they were not known as it was read
        (``onnxruntime`` not yet imported) and are now; else this identity itself."""
        if self.onnxruntime is None or self.onnxruntime_providers:
            return self
        providers = tuple((python or PythonEnvironment.this_process()).onnxruntime_providers())
        return replace(self, onnxruntime_providers=providers) if providers else self

    def to_dict(self) -> dict[str, Any]:
        """The status message's ``identity`` object (see ``status.v1.json``; strings cut to its bounds)."""
        return {
            "board": _cut(self.board), "board_source": _cut(self.board_source),
            "compatible": [_cut(c) for c in self.compatible[:16]], "soc": _cut(self.soc),
            "os": {"name": _cut(self.os_name), "id": _cut(self.os_id), "version_id": _cut(self.os_version_id)},
            "l4t": _cut(self.l4t), "l4t_source": _cut(self.l4t_source), "jetpack": _cut(self.jetpack),
            "cuda": _cut(self.cuda), "tensorrt": _cut(self.tensorrt), "tensorrt_source": _cut(self.tensorrt_source),
            "onnxruntime": {"version": _cut(self.onnxruntime),
                            "providers": [_cut(p) for p in self.onnxruntime_providers[:32]]},
            "cpu": {"arch": _cut(self.cpu_arch), "model": _cut(self.cpu_model), "cores": self.cpu_cores,
                    "isa_flags": list(self.isa_flags)},
            "memory_total_mb": self.memory_total_mb, "gpu": _cut(self.gpu_name),
            "notes": [_cut(n, 512) for n in self.notes[:16]],
        }  # fmt: skip


def _cut(text: str | None, limit: int = 256) -> Any:
    return text if text is None or len(text) <= limit else text[: limit - 1] + "…"


def read_identity(root: Path = Path("/"), *, python: PythonEnvironment | None = None,
                  import_onnxruntime: bool = False) -> DeviceIdentity:
    """The identity of the machine whose filesystem is at ``root``; never raises for missing files.
    ``import_onnxruntime``: for the live root, import ``onnxruntime`` to list its providers (see
    :meth:`PythonEnvironment.this_process`)."""
    root = Path(root)
    if python is None and root != Path("/"):
        python = PythonEnvironment.empty()
    elif python is None:
        python = PythonEnvironment.this_process(import_onnxruntime=import_onnxruntime)
    notes: list[str] = []
    board, board_source = _read_board(root)
    compatible = _read_compatible(root)
    os_release = parse_os_release(_first_text(root, OS_RELEASE_PATHS) or "")
    dpkg = parse_dpkg_status(try_read_text(root / DPKG_STATUS_PATH) or "")
    l4t, l4t_source = _read_l4t(root, dpkg)
    jetpack = None
    if l4t is not None:
        release = jetpack_for_l4t(l4t)
        jetpack = release.jetpack if release is not None else None
        if release is None:
            notes.append(f"L4T {l4t} is not in edgekit's JetPack table (edgekit_runtime/sensors/jetson_releases.py)")
    tensorrt, tensorrt_source = _read_tensorrt(root, dpkg, python)
    ort_version = python.package_version("onnxruntime") or python.package_version("onnxruntime-gpu")
    providers = tuple(python.onnxruntime_providers()) if ort_version is not None else ()
    cpu = parse_cpuinfo(try_read_text(root / CPUINFO_PATH) or "")
    return DeviceIdentity(
        board=board, board_source=board_source, compatible=compatible,
        soc=compatible[-1] if compatible else None,
        os_name=os_release.get("PRETTY_NAME"), os_id=os_release.get("ID"), os_version_id=os_release.get("VERSION_ID"),
        l4t=l4t, l4t_source=l4t_source, jetpack=jetpack, cuda=_read_cuda(root),
        tensorrt=tensorrt, tensorrt_source=tensorrt_source, onnxruntime=ort_version, onnxruntime_providers=providers,
        cpu_arch=cpu.arch, cpu_model=cpu.model, cpu_cores=cpu.cores, isa_flags=cpu.isa_flags,
        memory_total_mb=_read_memory_total_mb(root), gpu_name=_read_nvidia_gpu(root), notes=tuple(notes),
    )  # fmt: skip


def _first_text(root: Path, relatives: tuple[str, ...]) -> str | None:
    for relative in relatives:
        text = try_read_text(root / relative)
        if text:
            return text
    return None


def _read_board(root: Path) -> tuple[str | None, str | None]:
    for relative in MODEL_PATHS:
        text = try_read_text(root / relative)
        if text:
            return text.rstrip("\x00").strip(), "/" + relative
    product = try_read_text(root / DMI_PRODUCT_PATH)
    if product:
        vendor = try_read_text(root / DMI_VENDOR_PATH)
        board = f"{vendor} {product}" if vendor and not product.startswith(vendor) else product
        return board, "/" + DMI_PRODUCT_PATH
    return None, None


def _read_compatible(root: Path) -> tuple[str, ...]:
    text = _first_text(root, COMPATIBLE_PATHS)
    return tuple(part for part in (text or "").split("\x00") if part.strip())


def parse_os_release(text: str) -> dict[str, str]:
    """``KEY=value`` lines (values optionally quoted), as ``os-release(5)`` writes them."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
                value = value[1:-1]
            fields[key] = value
    return fields


def parse_dpkg_status(text: str) -> dict[str, str]:
    """Installed package -> version, from ``/var/lib/dpkg/status`` stanzas."""
    packages: dict[str, str] = {}
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1].isspace():
                continue  # a continuation line (Description, Conffiles)
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        name, version = fields.get("Package"), fields.get("Version")
        if name and version and fields.get("Status", "install ok installed").endswith(" installed"):
            packages[name] = version
    return packages


def _upstream_version(debian_version: str) -> str:
    """``10.3.0.30-1+cuda12.5`` -> ``10.3.0.30``; ``36.4.3-20250107174145`` -> ``36.4.3``."""
    version = debian_version.split(":", 1)[-1]
    return version.rsplit("-", 1)[0] if "-" in version else version


def parse_nv_tegra_release(text: str) -> str | None:
    """``# R36 (release), REVISION: 4.3, ...`` -> ``"36.4.3"``; ``None`` for anything else."""
    match = _NV_TEGRA_RE.search(text.splitlines()[0] if text else "")
    return f"{match.group(1)}.{match.group(2)}" if match else None


def _read_l4t(root: Path, dpkg: dict[str, str]) -> tuple[str | None, str | None]:
    text = try_read_text(root / NV_TEGRA_RELEASE_PATH)
    if text is not None:
        version = parse_nv_tegra_release(text)
        if version is not None:
            return version, "/" + NV_TEGRA_RELEASE_PATH
        logger.warning("/%s has no '# R<n> (release), REVISION: <x>' first line: %r", NV_TEGRA_RELEASE_PATH, text[:80])
    if "nvidia-l4t-core" in dpkg:
        return _upstream_version(dpkg["nvidia-l4t-core"]), "dpkg nvidia-l4t-core"
    return None, None


def _read_cuda(root: Path) -> str | None:
    text = try_read_text(root / CUDA_VERSION_JSON)
    if text:
        try:
            version = json.loads(text).get("cuda", {}).get("version")
        except (ValueError, AttributeError):
            version = None
        if isinstance(version, str) and version:
            return version
    text = try_read_text(root / CUDA_VERSION_TXT)
    match = re.search(r"CUDA Version\s+([0-9.]+)", text or "")
    return match.group(1) if match else None


def _read_tensorrt(root: Path, dpkg: dict[str, str], python: PythonEnvironment) -> tuple[str | None, str | None]:
    version = python.package_version("tensorrt")
    if version:
        return version, "python tensorrt"
    for package in TENSORRT_PACKAGES:
        if package in dpkg:
            return _upstream_version(dpkg[package]), f"dpkg {package}"
    best: tuple[tuple[int, ...], str, str] | None = None
    for directory in LIBRARY_DIRS:
        try:
            entries = list((root / directory).glob("libnvinfer.so.*"))
        except OSError:
            continue
        for entry in entries:
            suffix = entry.name[len("libnvinfer.so."):]
            if re.fullmatch(r"\d+(\.\d+)*", suffix):
                key = tuple(int(p) for p in suffix.split("."))
                if best is None or key > best[0]:
                    best = (key, suffix, f"/{directory}/{entry.name}")
    return (best[1], best[2]) if best is not None else (None, None)


@dataclass(frozen=True)
class CpuInfo:
    arch: str | None
    model: str | None
    cores: int | None
    isa_flags: tuple[str, ...]


def parse_cpuinfo(text: str) -> CpuInfo:
    """Architecture, model, logical core count and the ISA flags of interest from ``/proc/cpuinfo``."""
    fields: dict[str, str] = {}
    cores = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep:
            continue
        if key == "processor":
            cores += 1
        fields.setdefault(key, value.strip())
    if "vendor_id" in fields or "flags" in fields:
        arch, flags, model = "x86_64", fields.get("flags", ""), fields.get("model name")
    elif "Features" in fields or fields.get("CPU architecture") == "8":
        arch, flags = "arm64", fields.get("Features", "")
        part = fields.get("CPU part", "").lower()
        model = ARM_CPU_PARTS.get(part) if fields.get("CPU implementer", "").lower() == "0x41" else None
        implementer = fields.get("CPU implementer", "").lower()
        model = model or fields.get("model name") or (f"Arm implementer {implementer} part {part}" if part else None)
    elif fields.get("isa", "").startswith("rv64"):
        arch, flags, model = "riscv64", "", fields.get("uarch")
    else:
        arch, flags, model = None, "", fields.get("model name")
    present = set(flags.split())
    return CpuInfo(arch, model, cores or None, tuple(flag for flag in ISA_FLAGS_OF_INTEREST if flag in present))


def _read_memory_total_mb(root: Path) -> float | None:
    for line in (try_read_text(root / MEMINFO_PATH) or "").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1]) / 1024.0
    return None


def _read_nvidia_gpu(root: Path) -> str | None:
    try:
        boards = sorted((root / NVIDIA_GPUS_DIR).iterdir())
    except OSError:
        return None
    for board in boards:
        for line in (try_read_text(board / "information") or "").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "Model":
                return value.strip()
    return None


__all__ = [
    "ISA_FLAGS_OF_INTEREST",
    "CpuInfo",
    "DeviceIdentity",
    "PythonEnvironment",
    "parse_cpuinfo",
    "parse_dpkg_status",
    "parse_nv_tegra_release",
    "parse_os_release",
    "read_identity",
]
