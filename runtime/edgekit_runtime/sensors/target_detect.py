"""Which edgekit target profile (``targets/*.yaml``) a device is, from its :class:`DeviceIdentity`.

The runtime cannot read the host's ``targets/`` (it never imports ``edgekit``), so :data:`TARGET_RULES`
carries what detection needs, one row per target; ``tests/runtime/sensors/test_target_rules_sync.py``
fails when a target is added without a row or a row disagrees with its YAML (arch, memory, Jetson Linux
major). A board-specific row matches on the device tree's ``compatible`` entries (exact strings), the
NVIDIA GPU model, or the CPU model; a generic row (``arm64-cpu``, ``x86-64-cpu``) matches only when no
specific row did, and never a board of a family edgekit knows (a Jetson no target describes gets no
target rather than a CPU-only profile that would hide its GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgekit_runtime.sensors.identity import DeviceIdentity, PythonEnvironment, read_identity
from edgekit_runtime.sensors.power_mode import NvpModelConfig, PowerModeReader, PowerModeState

#: Memory the OS reports (MemTotal) next to the module's: carve-outs take up to this share.
MEMORY_TOLERANCE = 0.2


@dataclass(frozen=True)
class TargetRule:
    """How to recognise one target. Empty tuples / ``None`` mean "not checked"."""

    target: str
    arch: str
    memory_gb: float | None  # the target's memory.gb (None for generic rows, whose figure is a placeholder)
    compatible_any: tuple[str, ...] = ()
    gpu_model_any: tuple[str, ...] = ()  # substrings of the NVIDIA GPU model
    cpu_model_any: tuple[str, ...] = ()  # substrings of the CPU model
    nvpmodel_mode: str | None = None  # nvpmodel.conf must offer this mode
    without_nvpmodel_mode: str | None = None  # ... must not offer this one
    l4t_major: int | None = None  # the target's Jetson Linux major: another one is noted
    memory_required: bool = False  # memory outside the tolerance rules the target out (two modules, one SoC)
    generic: bool = False
    not_for_compatible_prefixes: tuple[str, ...] = ()  # generic rows: boards of these families are not generic


TARGET_RULES: tuple[TargetRule, ...] = (
    # Orin Nano 8GB module (p3767-0003) and the developer kit's (p3767-0005); JetPack 6.2 adds MAXN_SUPER.
    TargetRule("jetson-orin-nano-super", "arm64", 8, compatible_any=("nvidia,p3767-0003", "nvidia,p3767-0005"),
               nvpmodel_mode="MAXN_SUPER", l4t_major=36),
    TargetRule("jetson-orin-nano-8gb", "arm64", 8, compatible_any=("nvidia,p3767-0003", "nvidia,p3767-0005"),
               without_nvpmodel_mode="MAXN_SUPER", l4t_major=36),
    TargetRule("jetson-orin-nx-16gb", "arm64", 16, compatible_any=("nvidia,p3767-0000",), l4t_major=36),
    TargetRule("jetson-agx-orin-64gb", "arm64", 64, compatible_any=("nvidia,p3701-0005",), l4t_major=36),
    # Thor: the T5000 (128 GB) and T4000 (64 GB) modules share the tegra264 SoC.
    TargetRule("jetson-agx-thor", "arm64", 128, compatible_any=("nvidia,tegra264",), l4t_major=38,
               memory_required=True),
    TargetRule("raspberry-pi-5", "arm64", 8, compatible_any=("raspberrypi,5-model-b", "brcm,bcm2712")),
    TargetRule("qualcomm-qcs6490", "arm64", 6, compatible_any=("qcom,qcs6490-rb3gen2", "qcom,qcm6490")),
    TargetRule("nvidia-h100", "x86_64", 128, gpu_model_any=("H100",)),
    TargetRule("nvidia-h200", "x86_64", 128, gpu_model_any=("H200",)),
    TargetRule("intel-core-ultra-npu", "x86_64", 32, cpu_model_any=("Core(TM) Ultra",)),
    # the same chip's Arc iGPU (another accelerator of the one device): the NPU row comes first, detection notes this one
    TargetRule("intel-core-ultra-igpu", "x86_64", 32, cpu_model_any=("Core(TM) Ultra",)),
    TargetRule("arm64-cpu", "arm64", None, generic=True, not_for_compatible_prefixes=("nvidia,", "qcom,")),
    TargetRule("x86-64-cpu", "x86_64", None, generic=True),
)  # fmt: skip


@dataclass(frozen=True)
class TargetDetection:
    """The detected target (``None`` when none matches) with the evidence; ``reason`` says why none."""

    target: str | None
    evidence: tuple[str, ...]
    notes: tuple[str, ...]
    reason: str | None
    candidates: tuple[tuple[str, str], ...]  # (target, why it did not match) for the specific rows checked

    def to_status(self) -> dict[str, object]:
        """The status message's ``target`` object (see ``status.v1.json``)."""
        return {"name": self.target, "evidence": [line[:512] for line in self.evidence[:16]],
                "reason": self.reason[:1024] if self.reason is not None else None}  # fmt: skip

    def to_dict(self) -> dict[str, object]:
        return {"target": self.target, "evidence": list(self.evidence), "notes": list(self.notes),
                "reason": self.reason, "rejected": [{"target": t, "why": why} for t, why in self.candidates]}  # fmt: skip


def detect_target(identity: DeviceIdentity, nvpmodel: NvpModelConfig | None = None,
                  rules: tuple[TargetRule, ...] = TARGET_RULES) -> TargetDetection:  # fmt: skip
    """The first specific rule that matches, else the generic one for the architecture, else none."""
    rejected: list[tuple[str, str]] = []
    matched: list[tuple[TargetRule, list[str], list[str]]] = []
    for rule in (r for r in rules if not r.generic):
        outcome = _check(rule, identity, nvpmodel)
        if isinstance(outcome, str):
            rejected.append((rule.target, outcome))
        else:
            matched.append((rule, *outcome))
    if matched:
        rule, evidence, notes = matched[0]
        if len(matched) > 1:
            notes.append(f"also matched {', '.join(m[0].target for m in matched[1:])}; {rule.target} comes first")
        return TargetDetection(rule.target, tuple(evidence), tuple(notes), None, tuple(rejected))
    for rule in (r for r in rules if r.generic):
        outcome = _check(rule, identity, nvpmodel)
        if not isinstance(outcome, str):
            evidence, notes = outcome
            notes.append("no board-specific target matched; this generic profile describes the CPU only")
            return TargetDetection(rule.target, tuple(evidence), tuple(notes), None, tuple(rejected))
    board = identity.board or "an unknown board"
    details = [f"arch {identity.cpu_arch or 'unknown'}"]
    if identity.compatible:
        details.append(f"compatible {', '.join(identity.compatible)}")
    family = _known_family(identity, rules)
    why = f"{board} ({'; '.join(details)}) matches no target in edgekit's table"
    if family:
        why += f"; its family ({family}) is not a generic CPU host, so no generic profile applies"
    why += "; add a targets/<name>.yaml profile and a row in edgekit_runtime/sensors/target_detect.py TARGET_RULES"
    return TargetDetection(None, (), (), why, tuple(rejected))


def _known_family(identity: DeviceIdentity, rules: tuple[TargetRule, ...]) -> str | None:
    for rule in rules:
        if rule.generic and rule.arch == identity.cpu_arch:
            for prefix in rule.not_for_compatible_prefixes:
                if any(entry.startswith(prefix) for entry in identity.compatible):
                    return prefix.rstrip(",")
    return None


def _check(rule: TargetRule, identity: DeviceIdentity,
           nvpmodel: NvpModelConfig | None) -> tuple[list[str], list[str]] | str:  # fmt: skip
    """(evidence, notes) when ``rule`` matches, else why not."""
    if identity.cpu_arch != rule.arch:
        return f"needs arch {rule.arch}, the CPU is {identity.cpu_arch or 'unknown'}"
    evidence = [f"CPU architecture {rule.arch} (/proc/cpuinfo)"]
    notes: list[str] = []
    if rule.compatible_any:
        found = [entry for entry in identity.compatible if entry in rule.compatible_any]
        if not found:
            return f"needs device-tree compatible {' or '.join(rule.compatible_any)}"
        evidence.append(f"device-tree compatible {found[0]} (board {identity.board or 'unnamed'})")
    if rule.gpu_model_any:
        gpu = identity.gpu_name or ""
        if not any(text in gpu for text in rule.gpu_model_any):
            return f"needs an NVIDIA GPU model containing {' or '.join(rule.gpu_model_any)}, found {gpu or 'none'}"
        evidence.append(f"NVIDIA GPU {gpu} (/proc/driver/nvidia/gpus)")
    if rule.cpu_model_any:
        model = identity.cpu_model or ""
        if not any(text in model for text in rule.cpu_model_any):
            return f"needs a CPU model containing {' or '.join(rule.cpu_model_any)}, found {model or 'none'}"
        evidence.append(f"CPU model {model}")
    modes = set(nvpmodel.modes.values()) if nvpmodel is not None else set()
    if rule.nvpmodel_mode is not None:
        if rule.nvpmodel_mode not in modes:
            return f"needs nvpmodel mode {rule.nvpmodel_mode} in /etc/nvpmodel.conf, found {sorted(modes) or 'none'}"
        evidence.append(f"nvpmodel mode {rule.nvpmodel_mode} offered (/etc/nvpmodel.conf)")
    if rule.without_nvpmodel_mode is not None:
        if rule.without_nvpmodel_mode in modes:
            return f"nvpmodel offers {rule.without_nvpmodel_mode}, which this target does not have"
        evidence.append(f"no nvpmodel mode {rule.without_nvpmodel_mode}")
    if rule.generic:
        prefixes = [p for p in rule.not_for_compatible_prefixes if any(e.startswith(p) for e in identity.compatible)]
        if prefixes:
            return f"a {prefixes[0].rstrip(',')} board is not a generic {rule.arch} host"
    if rule.memory_gb is not None and identity.memory_total_mb is not None:
        found_gb = identity.memory_total_mb / 1024.0
        if abs(found_gb - rule.memory_gb) > MEMORY_TOLERANCE * rule.memory_gb:
            text = f"memory {found_gb:.1f} GiB, the target describes {rule.memory_gb:g} GB"
            if rule.memory_required:
                return f"needs about {rule.memory_gb:g} GB of memory, found {found_gb:.1f} GiB"
            notes.append(text)
        elif rule.memory_required:
            evidence.append(f"memory {found_gb:.1f} GiB (/proc/meminfo)")
    if rule.l4t_major is not None and identity.l4t is not None:
        major = identity.l4t.split(".")[0]
        if major != str(rule.l4t_major):
            notes.append(f"L4T {identity.l4t}: the target is described for Jetson Linux {rule.l4t_major}")
        else:
            evidence.append(f"L4T {identity.l4t} ({identity.l4t_source})")
    return evidence, notes


@dataclass(frozen=True)
class DeviceReport:
    """What ``edgekit-agent detect`` prints: the identity, the power mode now and the detected target."""

    identity: DeviceIdentity
    power_mode: PowerModeState
    detection: TargetDetection

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.detection.to_dict(), "identity": self.identity.to_dict(),
                "power_mode": self.power_mode.to_dict()}  # fmt: skip


def inspect_device(root: Path = Path("/"), *, python: PythonEnvironment | None = None) -> DeviceReport:
    """Identity, power mode and target of the machine whose filesystem is at ``root`` (for the live root,
    ``onnxruntime`` is imported to list its providers)."""
    reader = PowerModeReader(root)
    identity = read_identity(root, python=python, import_onnxruntime=True)
    return DeviceReport(identity, reader.read(), detect_target(identity, reader.config))


__all__ = ["TARGET_RULES", "DeviceReport", "TargetDetection", "TargetRule", "detect_target", "inspect_device"]
