"""Property tests: encoders against a brute-force nearest-value oracle, and decode/encode round trips."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgekit.quantize.codecs import (
    decode_e2m1,
    decode_e4m3,
    decode_e5m2,
    decode_e8m0,
    encode_e2m1,
    encode_e4m3,
    encode_e5m2,
    encode_e8m0,
)

CODECS = {
    "e4m3": (encode_e4m3, decode_e4m3, 8),
    "e5m2": (encode_e5m2, decode_e5m2, 8),
    "e2m1": (encode_e2m1, decode_e2m1, 4),
}
FAST = settings(max_examples=150, deadline=None)


def nearest_by_brute_force(x: float, name: str) -> float:
    """The finite value of the format nearest to x; on a tie the one whose code is even. Sign kept, -0.0 included."""
    _, decode, bits = CODECS[name]
    codes = np.arange(1 << (bits - 1))
    values = decode(codes).astype(np.float64)
    finite = np.isfinite(values)
    codes, values = codes[finite], values[finite]
    if abs(x) >= values.max():  # saturation (and float64 distances to huge x would round to ties)
        return float(np.copysign(values.max(), x))
    distance = np.abs(values - abs(x))  # exact: x is a float32 no larger than 57344
    best = codes[distance == distance.min()]
    chosen = best[best % 2 == 0][0] if len(best) > 1 else best[0]
    return float(np.copysign(values[codes == chosen][0], x))


@pytest.mark.parametrize("name", sorted(CODECS))
@FAST
@given(x=st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_saturating_encode_picks_the_nearest_value_ties_to_even(name: str, x: float) -> None:
    encode, decode, _ = CODECS[name]
    got = float(decode(encode(np.float32(x), saturate=True)))
    expected = nearest_by_brute_force(x, name)
    assert got == expected and np.signbit(got) == np.signbit(expected)


@pytest.mark.parametrize("name", sorted(CODECS))
@FAST
@given(a=st.floats(width=32, allow_nan=False), b=st.floats(width=32, allow_nan=False))
def test_encode_is_monotonic(name: str, a: float, b: float) -> None:
    encode, decode, _ = CODECS[name]
    low, high = sorted((a, b))
    assert decode(encode(np.float32(low))) <= decode(encode(np.float32(high)))


@pytest.mark.parametrize("name", sorted(CODECS))
@FAST
@given(data=st.data())
def test_decode_encode_decode_is_the_identity_on_codes(name: str, data: st.DataObject) -> None:
    encode, decode, bits = CODECS[name]
    code = data.draw(st.integers(0, (1 << bits) - 1))
    value = decode(np.array([code], np.uint8))
    again = decode(encode(value, saturate=False))
    assert np.array_equal(again, value, equal_nan=True) and np.signbit(again[0]) == np.signbit(value[0])
    if not np.isnan(value[0]):
        assert encode(value, saturate=False)[0] == code  # every non-NaN code is the canonical encoding of its value


@pytest.mark.parametrize("name", sorted(CODECS))
def test_every_code_round_trips(name: str) -> None:
    encode, decode, bits = CODECS[name]
    codes = np.arange(1 << bits, dtype=np.uint8)
    values = decode(codes)
    assert np.array_equal(decode(encode(values, saturate=False)), values, equal_nan=True)
    assert np.array_equal(np.signbit(decode(encode(values, saturate=False))), np.signbit(values))


@FAST
@given(code=st.integers(0, 254))
def test_e8m0_round_trips_every_finite_code(code: int) -> None:
    value = decode_e8m0(np.array([code], np.uint8))
    assert encode_e8m0(value)[0] == code


@FAST
@given(x=st.floats(min_value=2.0**-126, max_value=2.0**127, width=32))
def test_e8m0_picks_the_nearest_power_of_two(x: float) -> None:
    got = float(decode_e8m0(encode_e8m0(np.float32(x))))
    lower = 2.0 ** np.floor(np.log2(x))
    expected = lower if x - lower < 2 * lower - x else 2 * lower
    assert got == expected
