"""A profile's figures must belong to hardware it declares: a DLA peak needs DLA cores, an NPU peak an npu section,
a GPU peak a gpu section; a CUDA compute capability is at least 1.0, and a power mode has a name."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.errors import TargetError
from edgekit.target import load_target_file
from tests.test_target_strict_numbers import NX, edited


@pytest.mark.parametrize(("name", "old", "new", "message"), [
    (NX, "dla_cores: 2 ", "dla_cores: 0 ",
     "field 'peak_throughput[3].engine': a peak for engine 'dla' needs dla_cores above 0 in this profile"),
    ("raspberry-pi-5", "0.1536, unit: TFLOPS, engine: cpu", "0.1536, unit: TFLOPS, engine: npu",
     "field 'peak_throughput[0].engine': a peak for engine 'npu' needs an npu section in this profile"),
    ("raspberry-pi-5", "0.1536, unit: TFLOPS, engine: cpu", "0.1536, unit: TFLOPS, engine: gpu",
     "field 'peak_throughput[0].engine': a peak for engine 'gpu' needs a gpu section in this profile"),
    (NX, 'compute_capability: "8.7"', 'compute_capability: "0.0"', "field 'gpu.compute_capability'"),
    (NX, "10W: 10 ", "'': 10 ", "a power mode needs a name"),
    (NX, "10W: 10 ", "'  ': 10 ", "a power mode needs a name"),
])  # fmt: skip
def test_a_figure_for_hardware_the_profile_lacks_is_refused(tmp_path: Path, name, old, new, message):
    path, _ = edited(tmp_path, name, old, new)
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    assert message in info.value.message
    assert str(path) in info.value.message


def test_the_shipped_figures_still_load(tmp_path: Path):
    path, _ = edited(tmp_path, NX, 'compute_capability: "8.7"', 'compute_capability: "10.0"')
    assert load_target_file(path).gpu.sm == (10, 0)
