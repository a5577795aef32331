"""A peak quoted at the power mode asked for is used as quoted; only a precision with no figure at that mode is
scaled from another mode by the watts ratio (clocks, hence peaks, fall faster than watts at low modes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.estimate import hardware_for
from edgekit.target import TARGETS_DIR, get_target, load_target_file

#: The AGX Orin 64GB's sparse INT8 TOPS per power mode (NVIDIA Deep-Learning-Accelerator-SW README, the profile's source).
README_GPU = {"MODE_50W": 109, "MODE_30W": 41, "MODE_15W": 14}
README_DLA = {"MODE_50W": 92, "MODE_30W": 90, "MODE_15W": 40}
README_TOTAL = {"MODE_50W": 200, "MODE_30W": 131, "MODE_15W": 54}


@pytest.mark.parametrize("mode", sorted(README_GPU))
def test_agx_orin_uses_the_figure_quoted_at_each_power_mode(mode: str) -> None:
    hw = hardware_for(get_target("jetson-agx-orin-64gb"), mode)
    assert hw.engine == "gpu" and hw.peak_ops["int8"] == pytest.approx(README_GPU[mode] / 2 * 1e12)  # sparse counted half
    assert hw.peak_ops["fp16"] == pytest.approx(hw.peak_ops["int8"] / 2)  # the Ampere ratio, from the quoted figure
    assert f"target peak_throughput gpu int8: {README_GPU[mode]} TOPS (sparse, counted half) quoted at {mode}, used as quoted" in hw.sources
    assert not any(s.startswith("target peak_throughput gpu int8") and "scaled" in s for s in hw.sources)


def test_agx_orin_per_mode_figures_are_the_readme_table() -> None:
    target = get_target("jetson-agx-orin-64gb")
    quoted = {(p.engine, p.power_mode): p.value for p in target.peak_throughput if p.precision.value == "int8" and p.sparse}
    for mode, value in README_GPU.items():
        assert quoted[("gpu", mode)] == value
        assert quoted[("dla", mode)] == README_DLA[mode]
        assert quoted[("total", mode)] == README_TOTAL[mode]


def test_a_mode_without_its_own_figure_is_scaled_and_says_so(tmp_path: Path) -> None:
    text = (TARGETS_DIR / "jetson-agx-orin-64gb.yaml").read_text()
    text = "\n".join(line for line in text.splitlines() if "power_mode: MODE_30W" not in line) + "\n"
    path = tmp_path / "jetson-agx-orin-64gb.yaml"
    path.write_text(text)
    hw = hardware_for(load_target_file(path), "MODE_30W")
    assert hw.peak_ops["int8"] == pytest.approx(170 / 2 * 1e12 * 30 / 60)  # the largest scaled figure: MAXN's
    assert any("quoted at MAXN, scaled by the watts ratio 0.50 to MODE_30W (no figure quoted at MODE_30W)" in s for s in hw.sources)
    fp32 = hardware_for(load_target_file(path), "MODE_15W").peak_ops["fp32"]  # no FP32 figure at any lower mode
    assert fp32 == pytest.approx(5.3e12 * 15 / 60)


def test_thor_times_int8_at_its_derived_int8_figure_not_as_tf32() -> None:
    target = get_target("jetson-agx-thor")
    derived = {p.precision.value: p.derivation for p in target.peak_throughput}
    assert derived["fp8"] and "half the 2070 sparse FP4" in derived["fp8"]  # every derived figure says how
    assert derived["int8"] and "dense INT8 at the dense FP8 rate" in derived["int8"]
    hw = hardware_for(target)
    assert hw.peak_for("int8") == (pytest.approx(1035e12 / 2), "int8")  # was fp32's TF32 rate (about 129 TOPS)
    assert hw.peak_for("int4") == (pytest.approx(1035e12 / 2), "int8")
    assert any("derived: equal to the FP8 figure above" in s for s in hw.sources)
