"""Values at the edges of the Open Inference Protocol's datatypes, found by review: the ``classification``
ranking of unsigned outputs, float overflow in JSON data, shapes no array can have, and NaN in a JSON output
beside a binary one. The protocol functions the HTTP and gRPC front ends share, called directly."""

from __future__ import annotations

import json
from http import HTTPStatus
from types import SimpleNamespace

import numpy as np
import pytest

from edgekit_runtime.agent.oip import BINARY_TYPE, HEADER_LENGTH, _decode_inputs, _json_array, encode_reply
from edgekit_runtime.agent.oip_classification import classify
from edgekit_runtime.agent.oip_types import OipError


@pytest.mark.parametrize("dtype", [np.uint8, np.uint64, np.int8, np.int64, np.float32])
def test_classification_ranks_every_number_type_highest_first(dtype: type) -> None:
    scores = np.array([[0, 1, 127, 100]], dtype)  # before: uint8 was ranked by -x, which wraps (255 -> 1)
    assert classify(scores, 2, batched=True, name="y").tolist() == [[b"127.000000:2", b"100.000000:3"]]
    if np.dtype(dtype).kind == "u":
        wide = np.array([[0, 1, 200, 255]], dtype)
        assert classify(wide, 2, batched=True, name="y").tolist() == [[b"255.000000:3", b"200.000000:2"]]
    if np.dtype(dtype).kind == "i":
        low = np.array([[np.iinfo(dtype).min, -1, -2]], dtype)  # -min overflows the type
        assert classify(low, 1, batched=True, name="y").tolist() == [[b"-1.000000:1"]]


@pytest.mark.parametrize(("dtype", "data", "largest"), [(np.float32, [1.0, 1e39], "3.40282e+38"), (np.float16, [70000], "65504")])
def test_a_finite_number_past_a_float_types_largest_is_refused(dtype: type, data: list[float], largest: str) -> None:
    with pytest.raises(OipError) as info:  # before: silently infinity (a 200 whose outputs said NaN)
        _json_array(data, np.dtype(dtype), [len(data)], "input 'x'")
    assert info.value.status == HTTPStatus.BAD_REQUEST
    assert f"input 'x': values overflow" in info.value.message and f"its largest, {largest}" in info.value.message
    assert _json_array([1.5, -2.0], np.dtype(dtype), [2], "input 'x'").tolist() == [1.5, -2.0]


def test_a_shape_no_array_can_have_is_a_400_even_with_no_elements() -> None:
    tensor = {"name": "x", "datatype": "FP32", "shape": [2**40, 2**40, 0, 1], "data": []}
    with pytest.raises(OipError) as info:  # before: numpy's ValueError, a 500 / gRPC UNKNOWN
        _decode_inputs([tensor], memoryview(b""))
    assert info.value.status == HTTPStatus.BAD_REQUEST and "is larger than any tensor can be" in info.value.message
    assert _decode_inputs([{**tensor, "shape": [3, 0]}], memoryview(b""))["x"].shape == (3, 0)


def test_nan_in_a_json_output_beside_a_binary_one_is_spelled_and_counted() -> None:
    slot = SimpleNamespace(name="m", ready=True, server=None)
    outputs = {"y1": np.array([1.0, 2.0], np.float32), "y2": np.array([np.nan, 1.0], np.float32)}
    wanted = {"y1": (True, None), "y2": (False, None)}
    body, content_type, headers = encode_reply({"id": "r"}, slot, outputs, wanted, False)  # before: ValueError, a 500
    header = json.loads(body[: int(headers[HEADER_LENGTH])])
    assert content_type == BINARY_TYPE and headers["X-Edgekit-Non-Finite"] == "1"
    assert header["outputs"][1]["data"] == ["NaN", 1.0] and body[int(headers[HEADER_LENGTH]):] == outputs["y1"].tobytes()
