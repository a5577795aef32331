"""The runtime's detection table and JetPack table stay in sync with targets/*.yaml (read as data), and every
detection row is exercised by a board tree."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from edgekit_runtime.sensors.jetson_releases import JETPACK_RELEASES, jetpack_for_l4t, normalize_l4t
from edgekit_runtime.sensors.target_detect import TARGET_RULES, inspect_device

REPO = Path(__file__).resolve().parents[3]
IDENTITY = Path(__file__).parent / "fixtures" / "identity"
TARGETS = {path.stem: yaml.safe_load(path.read_text(encoding="utf-8")) for path in sorted((REPO / "targets").glob("*.yaml"))}


def test_every_target_has_one_detection_row_and_every_row_a_target() -> None:
    rows = [rule.target for rule in TARGET_RULES]
    assert len(rows) == len(set(rows)), "a target has two rows in TARGET_RULES"
    assert sorted(rows) == sorted(TARGETS), (
        "targets/ and edgekit_runtime/sensors/target_detect.py TARGET_RULES differ: add a row for each new target "
        f"(missing: {sorted(set(TARGETS) - set(rows))}; unknown: {sorted(set(rows) - set(TARGETS))})")


@pytest.mark.parametrize("rule", TARGET_RULES, ids=lambda rule: rule.target)
def test_detection_row_agrees_with_its_target(rule) -> None:
    target = TARGETS[rule.target]
    assert rule.arch == target["cpu"]["arch"]
    if rule.generic:
        assert rule.memory_gb is None  # generic profiles carry placeholder figures, not checked
    else:
        assert rule.memory_gb == target["memory"]["gb"]
    jetson_linux = target.get("software", {}).get("jetson_linux")
    assert rule.l4t_major == (int(str(jetson_linux).split(".")[0]) if jetson_linux else None)
    if rule.nvpmodel_mode is not None:
        assert rule.nvpmodel_mode in target["power_modes"], f"{rule.target} has no power mode {rule.nvpmodel_mode}"


@pytest.mark.parametrize("name", sorted(n for n, t in TARGETS.items() if t.get("software", {}).get("jetson_linux")))
def test_jetpack_table_agrees_with_the_targets(name: str) -> None:
    software = TARGETS[name]["software"]
    release = jetpack_for_l4t(str(software["jetson_linux"]))
    assert release is not None, f"Jetson Linux {software['jetson_linux']} of {name} is not in JETPACK_RELEASES"
    assert release.jetpack == str(software["jetpack"])


def test_jetpack_rows_are_unique_and_cited() -> None:
    assert len({row.l4t for row in JETPACK_RELEASES}) == len(JETPACK_RELEASES)
    for row in JETPACK_RELEASES:
        assert row.l4t == normalize_l4t(row.l4t)
        assert row.source.startswith(("developer.nvidia.com/embedded/", "docs.nvidia.com/jetson/")), row


def _tree(root: Path, *, model: str | None = None, compatible: tuple[str, ...] = (), cpuinfo: str,
          gpu: str | None = None) -> Path:  # fmt: skip
    if model is not None:
        (root / "proc/device-tree").mkdir(parents=True)
        (root / "proc/device-tree/model").write_bytes(model.encode() + b"\x00")
        (root / "proc/device-tree/compatible").write_bytes(b"".join(c.encode() + b"\x00" for c in compatible))
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/cpuinfo").write_text(cpuinfo)
    if gpu is not None:
        (root / "proc/driver/nvidia/gpus/0000:01:00.0").mkdir(parents=True)
        (root / "proc/driver/nvidia/gpus/0000:01:00.0/information").write_text(f"Model: \t\t {gpu}\nIRQ:   \t\t 37\n")
    return root


ARM = "processor\t: 0\nFeatures\t: fp asimd asimdhp asimddp\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd42\n"
X86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: {model}\nflags\t\t: fpu sse sse2 avx avx2\n"


def test_every_detection_row_is_exercised(tmp_path: Path) -> None:
    """The board trees under fixtures/identity, plus small trees for the boards without one (constructed)."""
    detected = {inspect_device(tree).detection.target for tree in IDENTITY.iterdir()}
    constructed = {
        "jetson-orin-nx-16gb": _tree(tmp_path / "nx", model="NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
                                     compatible=("nvidia,p3768-0000+p3767-0000", "nvidia,p3767-0000", "nvidia,tegra234"),
                                     cpuinfo=ARM),
        "qualcomm-qcs6490": _tree(tmp_path / "rb3", model="Qualcomm Technologies, Inc. Robotics RB3gen2",
                                  compatible=("qcom,qcs6490-rb3gen2", "qcom,qcm6490"), cpuinfo=ARM),
        "intel-core-ultra-npu": _tree(tmp_path / "mtl", cpuinfo=X86.format(model="Intel(R) Core(TM) Ultra 7 155H")),
        "arm64-cpu": _tree(tmp_path / "graviton", cpuinfo=ARM),
        "nvidia-h200": _tree(tmp_path / "h200", cpuinfo=X86.format(model="Intel(R) Xeon(R) Platinum 8480C"), gpu="NVIDIA H200"),
    }  # fmt: skip
    for expected, root in constructed.items():
        assert inspect_device(root).detection.target == expected
    # one Core Ultra chip, two accelerator profiles: the NPU's row wins and the detection names the iGPU's too
    core_ultra = inspect_device(constructed["intel-core-ultra-npu"]).detection
    assert "also matched intel-core-ultra-igpu; intel-core-ultra-npu comes first" in core_ultra.notes
    detected.add("intel-core-ultra-igpu")
    missing = {rule.target for rule in TARGET_RULES} - detected - set(constructed)
    assert not missing, f"no test tree detects {sorted(missing)}"
