"""A NaN or inf weight is an error naming the tensor and the index, not a silently corrupted channel: FP8 shares one
scale per output channel (amax / 448), so one inf made the scale inf and the whole channel NaN."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.errors import QuantizationError
from edgekit.precision import Precision
from edgekit.quantize.float_writers import encode_weight


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_fp8_weight_with_a_non_finite_value_names_tensor_and_index(bad):
    weight = np.array([[1e-3, 2e-3], [3e-3, 0.5], [0.25, 0.125]], np.float32)  # (K=3, N=2), out_axis 1
    weight[1, 1] = bad
    with pytest.raises(QuantizationError) as info:
        encode_weight("W", weight, Precision.FP8, 0, 1)
    message = str(info.value)
    assert f"fp8: weight 'W' holds {float(bad)!r} at index (1, 1)" in message
    assert "output channel" in message
    assert "find where the NaN/inf comes from" in message


@pytest.mark.parametrize("precision", [Precision.MXFP8, Precision.MXFP4], ids=lambda p: p.value)
def test_block_format_weight_with_inf_names_tensor_and_index(precision):
    weight = np.ones((32, 2), np.float32)
    weight[3, 0] = np.inf
    weight[5, 1] = np.nan
    with pytest.raises(QuantizationError, match=rf"{precision.value}: weight 'W' holds inf at index \(3, 0\) \(and 1 more\)"):
        encode_weight("W", weight, precision, 0, 1)


def test_finite_fp8_weight_still_encodes():
    weight = np.array([[1e-3, 2e-3], [3e-3, 0.5], [0.25, 0.125]], np.float32)
    inits, nodes, nbytes = encode_weight("W", weight, Precision.FP8, 0, 1)
    assert [i.name for i in inits] == ["W_e4m3", "W_scale"] and nodes[0].op_type == "DequantizeLinear" and nbytes == 6 + 8
