"""A calibration file is checked field by field when it is read (review: a missing or non-numeric node_overhead_us,
``entries: null``, a negative or NaN overhead or a power_fraction of 5 crashed or skewed every estimate, the default
file in $EDGEKIT_CACHE_DIR included)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from edgekit.estimate.calibration import FILE_KIND, SCHEMA_VERSION, default_calibration_path, factors_for, load_calibration
from edgekit.estimate.estimate import estimate
from edgekit.estimate.graph_cost import EstimateError
from edgekit.target import get_target
from tests.estimate.graphs import mlp

GOOD = {"target": "raspberry-pi-5", "power_mode": None, "efficiency": {"matmul": 0.5}, "node_overhead_us": 3.0, "power_fraction": 0.6}


def _write(path: Path, entries: Any) -> Path:
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "kind": FILE_KIND, "entries": entries}, allow_nan=True))
    return path


@pytest.mark.parametrize("entries, problem", [
    (None, "entries must be a list of calibration entries, not NoneType"),
    ([{**GOOD, "node_overhead_us": None}], "entries[0].node_overhead_us must be a finite number of microseconds >= 0, not None"),
    ([GOOD, {k: v for k, v in GOOD.items() if k != "node_overhead_us"}],
     "entries[1].node_overhead_us must be a finite number of microseconds >= 0, not None"),
    ([{**GOOD, "node_overhead_us": "fast"}], "entries[0].node_overhead_us must be a finite number of microseconds >= 0, not 'fast'"),
    ([{**GOOD, "node_overhead_us": -5000}], "entries[0].node_overhead_us must be a finite number of microseconds >= 0, not -5000"),
    ([{**GOOD, "node_overhead_us": math.nan}], "entries[0].node_overhead_us must be a finite number of microseconds >= 0, not nan"),
    ([{**GOOD, "power_fraction": 5}], "entries[0].power_fraction must be a share in (0, 1], not 5"),
    ([{**GOOD, "power_fraction": 0}], "entries[0].power_fraction must be a share in (0, 1], not 0"),
    ([{**GOOD, "efficiency": {"matmul": 2}}], "entries[0].efficiency must map op classes to numbers in (0, 1]"),
    ([{**GOOD, "target": 7}], "entries[0].target must be a target name"),
    ([None], "entries[0].(the entry itself) must be an object, not NoneType"),
])  # fmt: skip
def test_a_malformed_entry_names_the_file_and_field(tmp_path: Path, entries: Any, problem: str) -> None:
    path = _write(tmp_path / "cal.json", entries)
    with pytest.raises(EstimateError) as caught:
        load_calibration(path)
    assert str(caught.value).startswith(f"{path}: {problem}")
    assert f"edgekit fleet calibrate --out {path}" in caught.value.hint and "delete it" in caught.value.hint


def test_a_well_formed_file_gives_its_factors(tmp_path: Path) -> None:
    document = load_calibration(_write(tmp_path / "cal.json", [GOOD]))
    factors = factors_for(document, "raspberry-pi-5", None)
    assert (factors.node_overhead_us, factors.power_fraction, factors.efficiency) == (3.0, 0.6, {"matmul": 0.5})


def test_a_malformed_default_file_is_an_estimate_error_naming_it() -> None:
    default = default_calibration_path()
    default.parent.mkdir(parents=True, exist_ok=True)
    _write(default, [{**GOOD, "node_overhead_us": None}])
    with pytest.raises(EstimateError, match=f"^{default}: entries\\[0\\].node_overhead_us"):
        estimate(mlp(16), get_target("raspberry-pi-5"), dims={"batch": 1})
