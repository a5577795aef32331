"""IOSignature parsing and validate_feeds: every rejected feed names the tensor and the expected signature."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit_runtime.errors import BundleError, InputSignatureError
from edgekit_runtime.signature import IOSignature, TensorSignature, validate_feeds

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
