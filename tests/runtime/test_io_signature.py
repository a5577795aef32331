"""IOSignature parsing and validate_feeds: every rejected feed names the tensor and the expected signature."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest

from edgekit_runtime import signature as signature_module
from edgekit_runtime.errors import BundleError, InputSignatureError
from edgekit_runtime.signature import (
    FeedValidator,
    IOSignature,
    TensorSignature,
    compile_feed_counter,
    compile_feed_validator,
    validate_feeds,
)

IMAGE_SIGNATURE = "float32[batch, 1, 8, 8] (batch in 1..128)"


@pytest.fixture
def signature() -> IOSignature:
    return IOSignature.from_manifest(
        {
            "inputs": [
                {"name": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8]},
                {"name": "mask", "dtype": "int64", "shape": ["batch", "seq"]},
            ],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
            "dims": {"batch": {"min": 1, "opt": 4, "max": 128}, "seq": {"min": 2, "opt": 8, "max": 16}},
        }
    )


def feeds(batch: int = 4, seq: int = 8) -> dict[str, np.ndarray]:
    return {
        "image": np.zeros((batch, 1, 8, 8), dtype=np.float32),
        "mask": np.ones((batch, seq), dtype=np.int64),
    }


def test_parsed_signature_describes_itself(signature: IOSignature) -> None:
    assert signature.input_names == ("image", "mask")
    assert signature.output_names == ("logits",)
    assert signature.input("mask") == TensorSignature("mask", "int64", ("batch", "seq"))
    assert signature.describe_tensor(signature.input("image")) == IMAGE_SIGNATURE
    assert signature.describe_tensor(signature.input("mask")) == "int64[batch, seq] (batch in 1..128, seq in 2..16)"
    assert signature.dims["seq"].opt == 8
    assert IOSignature.from_manifest(signature.to_dict()) == signature


def test_valid_feeds_return_the_bound_dims(signature: IOSignature) -> None:
    assert validate_feeds(signature, feeds(batch=3, seq=5)) == {"batch": 3, "seq": 5}
    assert validate_feeds(signature, feeds(batch=128, seq=16)) == {"batch": 128, "seq": 16}


def test_wrong_dtype_names_expected_and_got(signature: IOSignature) -> None:
    bad = feeds() | {"image": np.zeros((4, 1, 8, 8), dtype=np.float64)}
    with pytest.raises(InputSignatureError) as caught:
        validate_feeds(signature, bad)
    message = str(caught.value)
    assert f"input 'image': expected {IMAGE_SIGNATURE}, got float64[4, 1, 8, 8]" in message
    assert "dtype float64, expected float32" in message
    assert ".astype(numpy.float32)" in message


def test_int32_for_int64_is_rejected_not_cast(signature: IOSignature) -> None:
    bad = feeds() | {"mask": np.ones((4, 8), dtype=np.int32)}
    with pytest.raises(InputSignatureError, match=r"input 'mask': expected int64\[batch, seq\].*got int32\[4, 8\]"):
        validate_feeds(signature, bad)


def test_missing_input_is_named(signature: IOSignature) -> None:
    with pytest.raises(InputSignatureError) as caught:
        validate_feeds(signature, {"image": feeds()["image"]})
    assert "missing input 'mask': expected int64[batch, seq] (batch in 1..128, seq in 2..16)" in str(caught.value)


def test_unexpected_input_suggests_the_close_name(signature: IOSignature) -> None:
    bad = {"imgae": feeds()["image"], "mask": feeds()["mask"]}
    with pytest.raises(InputSignatureError) as caught:
        validate_feeds(signature, bad)
    message = str(caught.value)
    assert "unexpected input 'imgae'" in message
    assert f"'image' {IMAGE_SIGNATURE}" in message
    assert "did you mean 'image'?" in message


def test_feeds_must_be_a_mapping_of_arrays(signature: IOSignature) -> None:
    with pytest.raises(InputSignatureError, match="feeds must map input names to numpy arrays, got list"):
        validate_feeds(signature, [feeds()["image"]])  # type: ignore[arg-type]
    with pytest.raises(InputSignatureError, match=r"input 'image': expected float32\[batch, 1, 8, 8\].*got list"):
        validate_feeds(signature, feeds() | {"image": [[0.0]]})


def test_wrong_rank(signature: IOSignature) -> None:
    bad = feeds() | {"image": np.zeros((4, 8, 8), dtype=np.float32)}
    with pytest.raises(InputSignatureError) as caught:
        validate_feeds(signature, bad)
    assert f"input 'image': expected {IMAGE_SIGNATURE}, got float32[4, 8, 8] (rank 3, expected rank 4)" in str(
        caught.value
    )


def test_wrong_fixed_dim(signature: IOSignature) -> None:
    bad = feeds() | {"image": np.zeros((4, 3, 8, 8), dtype=np.float32)}
    with pytest.raises(InputSignatureError) as caught:
        validate_feeds(signature, bad)
    assert "got float32[4, 3, 8, 8] (dimension 1 is 3, expected 1)" in str(caught.value)


@pytest.mark.parametrize(("batch", "seq", "text"), [
    (200, 8, "dimension 0 'batch' is 200, outside 1..128"),
    (4, 1, "dimension 1 'seq' is 1, outside 2..16"),
])  # fmt: skip
def test_dynamic_dim_outside_its_range(signature: IOSignature, batch: int, seq: int, text: str) -> None:
    with pytest.raises(InputSignatureError) as caught:
        validate_feeds(signature, feeds(batch=batch, seq=seq))
    assert text in str(caught.value)
    assert "expected " in str(caught.value)


def test_too_large_batch_hints_at_splitting(signature: IOSignature) -> None:
    with pytest.raises(InputSignatureError, match="split the call into pieces with batch at most 128"):
        validate_feeds(signature, feeds(batch=129))


def test_one_dim_bound_to_two_sizes_across_inputs(signature: IOSignature) -> None:
    bad = feeds(batch=4) | {"mask": np.ones((2, 8), dtype=np.int64)}
    with pytest.raises(InputSignatureError) as caught:
        validate_feeds(signature, bad)
    message = str(caught.value)
    assert "input 'mask': expected int64[batch, seq]" in message
    assert "dimension 0 'batch' is 2, but batch = 4 by input 'image'" in message


def test_one_dim_bound_to_two_sizes_within_an_input() -> None:
    square = IOSignature.from_manifest(
        {"inputs": [{"name": "adjacency", "dtype": "float32", "shape": ["n", "n"]}],
         "outputs": [{"name": "y", "dtype": "float32", "shape": ["n"]}], "dims": {}}
    )  # fmt: skip
    assert validate_feeds(square, {"adjacency": np.zeros((3, 3), np.float32)}) == {"n": 3}
    with pytest.raises(InputSignatureError, match="dimension 1 'n' is 4, but n = 3 earlier in this input"):
        validate_feeds(square, {"adjacency": np.zeros((3, 4), np.float32)})


def test_unnamed_dims_take_any_size_and_never_bind() -> None:
    loose = IOSignature.from_manifest(
        {"inputs": [{"name": "x", "dtype": "bool", "shape": ["?", "?"]}],
         "outputs": [{"name": "y", "dtype": "bool", "shape": ["?"]}]}
    )  # fmt: skip
    assert validate_feeds(loose, {"x": np.zeros((2, 7), dtype=bool)}) == {}
    assert loose.describe_tensor(loose.inputs[0]) == "bool[?, ?]"


@pytest.mark.parametrize(("io", "text"), [
    ({"inputs": [], "outputs": [{"name": "y", "dtype": "float32", "shape": []}]}, "io.inputs must be a non-empty list"),
    ({"inputs": [{"name": "x", "dtype": "float", "shape": [1]}], "outputs": [{"name": "y", "dtype": "float32", "shape": []}]},
     "dtype 'float' is not a canonical numpy dtype name; did you mean 'float64'?"),
    ({"inputs": [{"name": "x", "dtype": "float32", "shape": [-1]}], "outputs": [{"name": "y", "dtype": "float32", "shape": []}]},
     "entry -1 is neither a size (int >= 0) nor a dim name"),
    ({"inputs": [{"name": "x", "dtype": "float32", "shape": [1]}, {"name": "x", "dtype": "float32", "shape": [1]}],
      "outputs": [{"name": "y", "dtype": "float32", "shape": []}]}, "io.inputs lists x more than once"),
    ({"inputs": [{"name": "x", "dtype": "float32", "shape": ["b"]}], "outputs": [{"name": "y", "dtype": "float32", "shape": []}],
      "dims": {"b": {"min": 8, "opt": 4, "max": 16}}}, "io.dims.b: needs min <= opt <= max, got min=8, opt=4, max=16"),
    ({"inputs": [{"name": "x", "dtype": "float32", "shape": ["b"]}], "outputs": [{"name": "y", "dtype": "float32", "shape": []}],
      "dims": {"b": {"min": 1}}}, "io.dims.b.max: expected an int >= 0, got None"),
])  # fmt: skip
def test_malformed_io_section_is_a_bundle_error(io: dict, text: str) -> None:
    with pytest.raises(BundleError) as caught:
        IOSignature.from_manifest(io, where="bundle/manifest.json")
    assert text in str(caught.value)
    assert "bundle/manifest.json" in str(caught.value)


def test_extension_dtypes_match_by_name() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    signature = IOSignature.from_manifest(
        {"inputs": [{"name": "x", "dtype": "bfloat16", "shape": [2]}],
         "outputs": [{"name": "y", "dtype": "bfloat16", "shape": [2]}]}
    )  # fmt: skip
    assert validate_feeds(signature, {"x": np.zeros(2, dtype=ml_dtypes.bfloat16)}) == {}
    with pytest.raises(InputSignatureError, match=r"expected bfloat16\[2\], got float16\[2\]"):
        validate_feeds(signature, {"x": np.zeros(2, dtype=np.float16)})


# -- the compiled validator (IOSignature.feed_validator) against the full check ---------------------


def _verdict(check: Callable[[IOSignature, object], dict[str, int]], signature: IOSignature, feeds: object) -> object:
    """What ``check`` makes of ``feeds``: the bound dims, or the error's type, message and hint."""
    try:
        return check(signature, feeds)
    except InputSignatureError as err:
        return (type(err), str(err), err.hint)


class _Spy:
    """Stands in for the full check while a validator is compiled, and counts the calls handed to it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, signature: IOSignature, feeds: Mapping[str, Any]) -> dict[str, int]:
        self.calls += 1
        return signature_module._check_feeds_in_detail(signature, feeds)


@pytest.fixture
def spied(monkeypatch: pytest.MonkeyPatch) -> Callable[[IOSignature], tuple[FeedValidator, _Spy]]:
    def compile_with_spy(signature: IOSignature) -> tuple[FeedValidator, _Spy]:
        spy = _Spy()
        with monkeypatch.context() as patch:
            patch.setattr(signature_module, "_check_feeds_in_detail", spy)
            return compile_feed_validator(signature), spy

    return compile_with_spy


def test_compiled_validator_accepts_good_feeds_without_the_full_check(signature: IOSignature, spied: Callable) -> None:
    validate, spy = spied(signature)
    assert validate(feeds(batch=3, seq=5)) == {"batch": 3, "seq": 5}
    assert validate(feeds(batch=1, seq=2)) == {"batch": 1, "seq": 2}
    assert validate(feeds(batch=128, seq=16)) == {"batch": 128, "seq": 16}
    assert spy.calls == 0
    assert signature.feed_validator is signature.feed_validator  # compiled once, on first use
    assert validate_feeds(signature, feeds()) == signature.feed_validator(feeds()) == {"batch": 4, "seq": 8}
    copied = pickle.loads(pickle.dumps(signature))  # the compiled function stays behind, and is made again
    assert copied == signature and copied.feed_validator(feeds(batch=2)) == {"batch": 2, "seq": 8}


@pytest.mark.parametrize(("bad", "text"), [
    ({"imgae": np.zeros((4, 1, 8, 8), np.float32), "mask": np.ones((4, 8), np.int64)}, "unexpected input 'imgae'"),
    ({"image": np.zeros((4, 1, 8, 8), np.float32)}, "missing input 'mask'"),
    (feeds() | {"extra": np.zeros(1)}, "unexpected input 'extra'"),
    (feeds() | {"image": np.zeros((4, 1, 8, 8), np.float64)}, "(dtype float64, expected float32)"),
    (feeds() | {"mask": np.ones((4, 8), np.int32)}, "(dtype int32, expected int64)"),
    (feeds() | {"image": np.zeros((4, 8, 8), np.float32)}, "(rank 3, expected rank 4)"),
    (feeds() | {"image": np.zeros((4, 3, 8, 8), np.float32)}, "(dimension 1 is 3, expected 1)"),
    (feeds() | {"image": np.zeros((4, 1, 8, 9), np.float32)}, "(dimension 3 is 9, expected 8)"),
    (feeds(batch=129), "(dimension 0 'batch' is 129, outside 1..128)"),
    (feeds(batch=0), "(dimension 0 'batch' is 0, outside 1..128)"),
    (feeds(seq=17), "(dimension 1 'seq' is 17, outside 2..16)"),
    (feeds(batch=4) | {"mask": np.ones((2, 8), np.int64)}, "(dimension 0 'batch' is 2, but batch = 4 by input 'image')"),
    (feeds() | {"image": [[0.0]]}, "input 'image': expected float32[batch, 1, 8, 8] (batch in 1..128), got list"),
    ([np.zeros((4, 1, 8, 8), np.float32)], "feeds must map input names to numpy arrays, got list"),
])  # fmt: skip
def test_compiled_validator_rejects_what_the_full_check_rejects_with_its_message(
    signature: IOSignature, spied: Callable, bad: object, text: str
) -> None:
    validate, spy = spied(signature)
    with pytest.raises(InputSignatureError) as caught:
        validate(bad)
    assert text in str(caught.value)
    assert spy.calls == 1  # the message comes from the full check itself
    assert (type(caught.value), str(caught.value), caught.value.hint) == _verdict(
        signature_module._check_feeds_in_detail, signature, bad
    )


def test_compiled_validator_leaves_doubtful_but_valid_feeds_to_the_full_check(signature: IOSignature, spied: Callable) -> None:
    validate, spy = spied(signature)
    swapped = feeds() | {"image": np.zeros((4, 1, 8, 8), np.dtype(">f4"))}  # named float32, not equal to it
    assert validate(swapped) == {"batch": 4, "seq": 8}
    assert validate(MappingProxyType(feeds())) == {"batch": 4, "seq": 8}  # a Mapping, not a dict
    assert validate(feeds() | {"mask": np.ones((4, 8), np.int64).view(np.matrix)}) == {"batch": 4, "seq": 8}
    assert spy.calls == 3
    pickled = pickle.loads(pickle.dumps(feeds()))  # equal dtypes, other instances: still the quick path
    assert validate(pickled) == {"batch": 4, "seq": 8} and spy.calls == 3


SIGNATURES = {
    "shared_dims": {
        "inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8]},
                   {"name": "mask", "dtype": "int64", "shape": ["batch", "seq"]}],
        "dims": {"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 6}}},
    "square_and_unbounded": {
        "inputs": [{"name": "adjacency", "dtype": "float32", "shape": ["n", "?", "n"]},
                   {"name": "labels", "dtype": "int32", "shape": ["k", "n"]}],
        "dims": {"n": {"min": 1, "max": 4}}},
    "scalar_and_bool": {
        "inputs": [{"name": "scale", "dtype": "float64", "shape": []}, {"name": "flags", "dtype": "bool", "shape": ["?", 3]}]},
    "odd_names": {
        "inputs": [{"name": "x') or print('injected", "dtype": "uint8", "shape": ['b"}', 2]}],
        "dims": {'b"}': {"min": 1, "max": 3}}},
}  # fmt: skip


def _random_feeds(rng: np.random.Generator, signature: IOSignature) -> object:
    """Feeds near ``signature``: mostly valid, with a random fault now and then."""
    sizes = {name: int(rng.integers(0, 10)) for name in ("batch", "seq", "n", "k", 'b"}', "?")}
    dtypes = ["float32", "float64", "int64", "int32", "uint8", "bool"]
    out: dict[str, object] = {}
    for tensor in signature.inputs:
        shape = [dim if isinstance(dim, int) else sizes[dim] if dim != "?" else int(rng.integers(0, 4)) for dim in tensor.shape]
        if rng.random() < 0.1:
            shape = shape[:-1] if shape and rng.random() < 0.5 else [*shape, 1]
        if shape and rng.random() < 0.15:
            shape[int(rng.integers(0, len(shape)))] = int(rng.integers(0, 10))
        dtype = tensor.dtype if rng.random() < 0.85 else str(rng.choice(dtypes))
        out[tensor.name if rng.random() < 0.95 else tensor.name + "_"] = np.zeros(shape, dtype)
    if rng.random() < 0.05:
        out.pop(next(iter(out)))
    if rng.random() < 0.05:
        out["extra"] = np.zeros(1)
    return out


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_compiled_validator_agrees_with_the_full_check_on_random_feeds(name: str, spied: Callable) -> None:
    signature = IOSignature.from_manifest({**SIGNATURES[name], "outputs": [{"name": "y", "dtype": "float32", "shape": []}]})
    validate, spy = spied(signature)
    rng = np.random.default_rng(sum(map(ord, name)))
    accepted = quick = 0
    for _ in range(3000):
        sample = _random_feeds(rng, signature)
        before = spy.calls
        got = _verdict(lambda _, fed: validate(fed), signature, sample)
        assert got == _verdict(signature_module._check_feeds_in_detail, signature, sample), sample
        accepted += isinstance(got, dict)
        quick += spy.calls == before
    assert accepted > 300 and quick == accepted  # every valid sample took the quick path


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_compiled_counter_agrees_with_the_full_check_on_random_feeds(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The serving path's counter: the size of one dim (1 for a dim no input has), or the full check's error."""
    signature = IOSignature.from_manifest({**SIGNATURES[name], "outputs": [{"name": "y", "dtype": "float32", "shape": []}]})
    dims = dict.fromkeys([dim for tensor in signature.inputs for dim in tensor.shape if isinstance(dim, str)] + ["absent"])
    spy = _Spy()
    with monkeypatch.context() as patch:
        patch.setattr(signature_module, "_check_feeds_in_detail", spy)
        counters = {dim: compile_feed_counter(signature, dim) for dim in dims}
    rng = np.random.default_rng(sum(map(ord, name)))
    accepted = quick = 0
    for _ in range(3000):
        sample = _random_feeds(rng, signature)
        full = _verdict(signature_module._check_feeds_in_detail, signature, sample)
        for dim, count in counters.items():
            before = spy.calls
            got = _verdict(lambda _, fed, count=count: count(fed), signature, sample)
            assert got == (full.get(dim, 1) if isinstance(full, dict) else full), (dim, sample)
            if isinstance(full, dict):
                accepted += 1
                quick += spy.calls == before
    assert accepted > 300 and quick == accepted  # every valid sample took the quick path


def test_compiled_validator_of_an_extension_dtype() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    signature = IOSignature.from_manifest(
        {"inputs": [{"name": "x", "dtype": "bfloat16", "shape": ["b"]}],
         "outputs": [{"name": "y", "dtype": "bfloat16", "shape": ["b"]}], "dims": {"b": {"min": 1, "max": 4}}}
    )  # fmt: skip
    validate = compile_feed_validator(signature)
    assert validate({"x": np.zeros(3, dtype=ml_dtypes.bfloat16)}) == {"b": 3}
    assert compile_feed_counter(signature, "b")({"x": np.zeros(3, dtype=ml_dtypes.bfloat16)}) == 3
    with pytest.raises(InputSignatureError, match=r"expected bfloat16\[b\] \(b in 1..4\), got float16\[3\]"):
        validate({"x": np.zeros(3, dtype=np.float16)})
