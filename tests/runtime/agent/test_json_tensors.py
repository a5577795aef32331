"""The size-checked JSON parse of inference requests (agent/json_tensors.py): the same values and shapes
as ``json.loads`` + ``np.asarray`` for well-formed requests, named errors for ragged or malformed arrays,
and no quadratic scan of a hostile unterminated string."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from edgekit_runtime.agent import json_tensors
from edgekit_runtime.agent.json_tensors import loads_tensor_json
from edgekit_runtime.errors import InputSignatureError


@pytest.fixture
def small_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every array of numbers takes the numpy path, however short."""
    monkeypatch.setattr(json_tensors, "MIN_NUMERIC_ARRAY_BYTES", 2)


def test_large_arrays_match_json_loads_exactly() -> None:
    rng = np.random.default_rng(0)
    image = rng.standard_normal((2, 3, 40, 40)).astype(np.float32)
    ids = rng.integers(-(2**62), 2**62, size=(4, 600), dtype=np.int64)
    request = {"id": "r-1", "inputs": {"image": {"dtype": "float32", "shape": [2, 3, 40, 40], "data": image.tolist()},
                                       "ids": {"dtype": "int64", "data": ids.tolist()}}}  # fmt: skip
    for text in (json.dumps(request), json.dumps(request, indent=2)):
        parsed = loads_tensor_json(bytearray(text.encode()))
        reference = json.loads(text)
        data = parsed["inputs"]["image"]["data"]
        assert isinstance(data, np.ndarray) and data.dtype == np.float64 and data.shape == (2, 3, 40, 40)
        assert np.array_equal(data, np.asarray(reference["inputs"]["image"]["data"])) and np.array_equal(data.astype(np.float32), image)
        assert parsed["inputs"]["ids"]["data"].dtype == np.int64 and np.array_equal(parsed["inputs"]["ids"]["data"], ids)
        assert parsed["id"] == "r-1" and parsed["inputs"]["image"]["shape"] == [2, 3, 40, 40]  # small parts stay Python


@pytest.mark.usefixtures("small_arrays")
@pytest.mark.parametrize(("body", "message"), [
    (b'{"d": [[1,2],[3]]}', "the nested data near byte 15 is not rectangular"),
    (b'{"d": [[1,2],3]}', "the nested data near byte 12 is not rectangular"),
    (b'{"d": [[1,2] 5,[3,4]]}', "the nested data near byte 12 is not rectangular"),
    (b'{"d": [[1,2],,[3,4]]}', "the nested data near byte 6 is not rectangular"),
    (b'{"d": [[1,2],[3,4],]}', "the nested data near byte 6 is not rectangular"),
    (b'{"d": [1,2,3,4,--5]}', "the array of numbers near byte 7 holds something that is not a number"),
    (b'{"d": [1,2,3,4,5,]}', "the array of numbers near byte 7 holds something that is not a number"),
    (b'{"d": [1e5e5, 1]}', "the array of numbers near byte 7 holds something that is not a number"),
    (b'{"d": [99999999999999999999, 1, 2]}', "a number near byte 7 does not fit uint64"),
    (b'{"d": "[1,2,3] and no end', "request body is not valid JSON: the string at byte 6 does not end"),
])  # fmt: skip
def test_malformed_arrays_are_named_errors(body: bytes, message: str) -> None:
    with pytest.raises(InputSignatureError) as caught:
        loads_tensor_json(bytearray(body))
    assert message in caught.value.message


@pytest.mark.usefixtures("small_arrays")
def test_what_is_not_an_array_of_numbers_is_left_to_json_loads() -> None:
    parsed = loads_tensor_json(bytearray(b'{"a": "[1,2,3,4,5]", "n": [NaN, 1], "s": [["x"]], "e": [[ ], [ ]], "deep": [[[[1]]]]}'))
    assert parsed["a"] == "[1,2,3,4,5]" and parsed["s"] == [["x"]] and np.isnan(parsed["n"][0])
    assert parsed["e"].shape == (2, 0) and parsed["deep"].shape == (1, 1, 1, 1)
    with pytest.raises(json.JSONDecodeError):
        loads_tensor_json(bytearray(b'{"d": [1,2,3'))


def test_a_hostile_body_is_scanned_in_linear_time() -> None:
    # an unterminated string full of escaped quotes and brackets: each byte is looked at a few times, not n times
    body = bytearray(b'{"x": "' + b'\\"[' * 2_000_000)
    started = time.monotonic()
    with pytest.raises(InputSignatureError, match="does not end"):
        loads_tensor_json(body)
    brackets = bytearray(b'{"x": ' + b"[" * 3_000_000 + b"1")
    with pytest.raises((json.JSONDecodeError, RecursionError)):
        loads_tensor_json(brackets)
    assert time.monotonic() - started < 10


def test_uint64_values_past_int64_parse_in_large_arrays_as_in_small_ones() -> None:
    """Small arrays go through json.loads (Python ints: any size); large ones were read as int64 only, so
    UINT64 data past 2**63 was refused once its text passed MIN_NUMERIC_ARRAY_BYTES."""
    values = [2**63 + 5] * 300
    parsed = loads_tensor_json(bytearray(json.dumps({"data": values}).encode()))
    assert parsed["data"].dtype == np.uint64 and parsed["data"].tolist() == values
    with pytest.raises(InputSignatureError, match="does not fit int64"):  # a negative number beside them: no type holds both
        loads_tensor_json(bytearray(json.dumps({"data": [-1, *values]}).encode()))


def test_a_string_that_looks_like_the_internal_placeholder_stays_a_string() -> None:
    body = {"id": "\x00edgekit-array-0", "data": [1.5] * 2000}
    parsed = loads_tensor_json(bytearray(json.dumps(body).encode()))
    assert parsed["id"] == "\x00edgekit-array-0" and parsed["data"].shape == (2000,)  # before: id became the array
