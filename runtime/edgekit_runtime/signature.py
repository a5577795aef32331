"""The input/output signature of a bundled model and the checks run on every inference call.

A signature comes from the manifest's ``io`` section (see ``docs/bundle-format.md``)::

    {"inputs":  [{"name": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8]}],
     "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
     "dims":    {"batch": {"min": 1, "opt": 8, "max": 128}}}

Shapes mix fixed sizes (ints) and dim names (strings). A dim name bound by ``dims`` must stay in
``min..max``; the same name must have the same size in every input of one call. ``"?"`` marks an
unnamed dimension of any size. ``dtype`` is a
canonical numpy dtype name (``float32``, not ``float``); feeds must match it exactly, because a silent
cast would hide a preprocessing bug on the device.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

import numpy as np

from edgekit_runtime.errors import BundleError, InputSignatureError

Dim = int | str

#: A dimension the exporter could not name (the host writes ``"?"``): any size, never bound.
ANONYMOUS_DIM = "?"

# Dtypes numpy itself does not know; arrays of them come from ml_dtypes and carry these names.
EXTENSION_DTYPE_NAMES = frozenset(
    {
        "bfloat16",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float4_e2m1fn",
        "int4",
        "uint4",
    }
)


#: A string tensor (ONNX ``tensor(string)``, the Open Inference Protocol's BYTES): fed and returned as numpy
#: arrays of ``str`` (``dtype=object``, as ONNX Runtime answers; unicode arrays ``<U..`` are accepted as feeds).
STRING_DTYPE = "string"


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype arrays of signature dtype ``name`` have (``object`` for ``string``)."""
    return np.dtype(object) if name == STRING_DTYPE else np.dtype(name)


def is_string_array(value: np.ndarray) -> bool:
    return value.dtype.kind in "OU"


def canonical_dtype_name(dtype: object, *, where: str) -> str:
    """Return ``dtype`` if it is a canonical numpy (or ml_dtypes) dtype name, else raise BundleError."""
    if not isinstance(dtype, str) or not dtype:
        raise BundleError(f"{where}: dtype must be a numpy dtype name such as 'float32', got {dtype!r}")
    if dtype in EXTENSION_DTYPE_NAMES or dtype == STRING_DTYPE:
        return dtype
    try:
        resolved = np.dtype(dtype).name
    except TypeError:
        resolved = None
    if resolved != dtype:
        suggestion = f"; did you mean '{resolved}'?" if resolved else ""
        raise BundleError(
            f"{where}: dtype {dtype!r} is not a canonical numpy dtype name{suggestion}",
            hint="write dtypes as numpy names: float32, float16, int64, int32, uint8, bool, bfloat16",
        )
    return dtype


@dataclass(frozen=True)
class DimRange:
    """The sizes a named dynamic dimension may take (inclusive)."""

    name: str
    min: int
    max: int
    opt: int | None = None

    def contains(self, size: int) -> bool:
        return self.min <= size <= self.max

    def describe(self) -> str:
        return f"{self.name} in {self.min}..{self.max}"

    def to_dict(self) -> dict[str, int | None]:
        return {"min": self.min, "opt": self.opt, "max": self.max}


@dataclass(frozen=True)
class TensorSignature:
    """One named tensor: numpy dtype name and a shape of fixed sizes and dim names (``()`` for a scalar).

    ``value`` is the one value the recipe pins for an input (a sample rate): synthetic feeds use it."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]
    value: float | int | bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(dim for dim in self.shape if isinstance(dim, str) and dim != ANONYMOUS_DIM)

    def describe(self) -> str:
        """``float32[batch, 1, 8, 8]``."""
        return f"{self.dtype}[{', '.join(str(dim) for dim in self.shape)}]"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.value is not None:
            data["value"] = self.value
        return data

    @classmethod
    def from_dict(cls, data: object, *, where: str) -> TensorSignature:
        if not isinstance(data, Mapping):
            raise BundleError(f"{where}: expected {{name, dtype, shape}}, got {data!r}")
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise BundleError(f"{where}.name: expected a non-empty tensor name, got {name!r}")
        where = f"{where} ('{name}')"
        dtype = canonical_dtype_name(data.get("dtype"), where=f"{where}.dtype")
        shape = data.get("shape")
        if not isinstance(shape, Sequence) or isinstance(shape, str):
            raise BundleError(f"{where}.shape: expected a list of sizes and dim names, got {shape!r}")
        for dim in shape:
            is_size = isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0
            is_name = isinstance(dim, str) and bool(dim)
            if not (is_size or is_name):
                raise BundleError(
                    f"{where}.shape: entry {dim!r} is neither a size (int >= 0) nor a dim name",
                    hint="name every dynamic dimension (e.g. 'batch') and bound it in io.dims",
                )
        value = data.get("value")
        if value is not None and not isinstance(value, (int, float, bool)):
            raise BundleError(f"{where}.value: expected a number or a boolean, got {value!r}")
        return cls(name=name, dtype=dtype, shape=tuple(shape), value=value)


def _size_field(data: Mapping[str, Any], key: str, *, where: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BundleError(f"{where}.{key}: expected an int >= 0, got {value!r}")
    return value


def _parse_dim_range(name: str, data: object, *, where: str) -> DimRange:
    if not isinstance(data, Mapping):
        raise BundleError(f"{where}: expected {{min, opt, max}}, got {data!r}")
    low = _size_field(data, "min", where=where)
    high = _size_field(data, "max", where=where)
    opt = None if data.get("opt") is None else _size_field(data, "opt", where=where)
    if low > high or (opt is not None and not low <= opt <= high):
        raise BundleError(f"{where}: needs min <= opt <= max, got min={low}, opt={opt}, max={high}")
    return DimRange(name=name, min=low, max=high, opt=opt)


@dataclass(frozen=True)
class IOSignature:
    """Inputs, outputs and dynamic-dimension bounds of a model."""

    inputs: tuple[TensorSignature, ...]
    outputs: tuple[TensorSignature, ...]
    dims: Mapping[str, DimRange] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(tensor.name for tensor in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(tensor.name for tensor in self.outputs)

    @cached_property
    def feed_validator(self) -> FeedValidator:
        """:func:`validate_feeds` for this signature, compiled on first use (see :func:`compile_feed_validator`)."""
        return compile_feed_validator(self)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the fields only: the compiled :attr:`feed_validator` cannot be pickled, and is made again."""
        state = dict(self.__dict__)
        state.pop("feed_validator", None)
        return state

    def input(self, name: str) -> TensorSignature:
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor
        raise KeyError(name)

    def describe_tensor(self, tensor: TensorSignature) -> str:
        """``float32[batch, 1, 8, 8] (batch in 1..128)``: the shape plus the bounds of its dims."""
        seen: list[str] = []
        for dim in tensor.dim_names:
            if dim in self.dims and dim not in seen:
                seen.append(dim)
        bounds = ", ".join(self.dims[dim].describe() for dim in seen)
        return tensor.describe() + (f" ({bounds})" if bounds else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": [tensor.to_dict() for tensor in self.inputs],
            "outputs": [tensor.to_dict() for tensor in self.outputs],
            "dims": {name: bounds.to_dict() for name, bounds in self.dims.items()},
        }

    @classmethod
    def from_manifest(cls, io: object, *, where: str = "manifest.json") -> IOSignature:
        """Parse the manifest's ``io`` section; a malformed one raises BundleError naming the field."""
        if not isinstance(io, Mapping):
            raise BundleError(f"{where}: 'io' must be an object with inputs, outputs and dims")
        sections: dict[str, tuple[TensorSignature, ...]] = {}
        for key in ("inputs", "outputs"):
            entries = io.get(key)
            if not isinstance(entries, Sequence) or isinstance(entries, str) or not entries:
                raise BundleError(f"{where}: io.{key} must be a non-empty list, got {entries!r}")
            tensors = tuple(
                TensorSignature.from_dict(entry, where=f"{where}: io.{key}[{index}]")
                for index, entry in enumerate(entries)
            )
            names = [tensor.name for tensor in tensors]
            duplicates = sorted({name for name in names if names.count(name) > 1})
            if duplicates:
                raise BundleError(f"{where}: io.{key} lists {', '.join(duplicates)} more than once")
            sections[key] = tensors
        raw_dims = io.get("dims", {})
        if raw_dims is None:
            raw_dims = {}
        if not isinstance(raw_dims, Mapping):
            raise BundleError(f"{where}: io.dims must map dim names to {{min, opt, max}}")
        dims = {
            str(name): _parse_dim_range(str(name), bounds, where=f"{where}: io.dims.{name}")
            for name, bounds in raw_dims.items()
        }
        return cls(inputs=sections["inputs"], outputs=sections["outputs"], dims=dims)


def describe_array(array: np.ndarray) -> str:
    """``float64[4, 1, 8, 8]``: an actual array in the notation of :meth:`TensorSignature.describe`."""
    return f"{array.dtype.name}[{', '.join(str(size) for size in array.shape)}]"


def _list_inputs(signature: IOSignature) -> str:
    return ", ".join(f"'{t.name}' {signature.describe_tensor(t)}" for t in signature.inputs)


def validate_feeds(signature: IOSignature, feeds: Mapping[str, Any]) -> dict[str, int]:
    """Check ``feeds`` against ``signature``; return the size bound to each dim name.

    Raises :class:`InputSignatureError` for a missing or unexpected input name, a value that is not a
    numpy array, a dtype that is not exactly the expected one, a wrong rank, a fixed dimension of the
    wrong size, a dynamic dimension outside its ``min..max``, or one dim name bound to two sizes.
    Runs on every inference, through the signature's compiled :attr:`IOSignature.feed_validator`.
    """
    return signature.feed_validator(feeds)


#: What :attr:`IOSignature.feed_validator` holds: :func:`validate_feeds` bound to one signature.
FeedValidator = Callable[[Mapping[str, Any]], dict[str, int]]


def _resolve_dtype(name: str) -> np.dtype[Any] | None:
    """The numpy dtype called ``name`` (ml_dtypes' for its extension names), ``None`` if unavailable."""
    if name == STRING_DTYPE:
        return np.dtype(object)
    try:
        if name in EXTENSION_DTYPE_NAMES:
            resolved = np.dtype(getattr(importlib.import_module("ml_dtypes"), name))
        else:
            resolved = np.dtype(name)
    except (ImportError, AttributeError, TypeError):
        return None
    return resolved if resolved.name == name else None


#: What :func:`compile_feed_counter` makes: the same checks, returning the size of one dim.
FeedCounter = Callable[[Mapping[str, Any]], int]


def compile_feed_counter(signature: IOSignature, dim: str) -> FeedCounter:
    """:func:`compile_feed_validator`'s checks and errors, returning only the size bound to ``dim`` (1 when no
    input has that dim): what the serving path counts as a request's items, without a dict and a lookup."""
    return _compile_checks(signature, count_dim=dim)


def compile_feed_validator(signature: IOSignature) -> FeedValidator:
    """:func:`validate_feeds` for ``signature``, as straight-line code with the signature's constants.

    The full check reads every rule from the signature and costs microseconds a call (``dtype.name``
    alone costs one); this runs on every inference. So the checks are written out once per
    signature, the way :mod:`dataclasses` writes ``__init__``. For ``image: float32[batch, 1, 8, 8]``
    with ``batch in 1..128`` the function reads::

        def validate_feeds_quickly(feeds):
            if type(feeds) is not dict or len(feeds) != 1:
                return full_check(signature, feeds)
            value = feeds.get(name_0)
            if type(value) is not ndarray:
                return full_check(signature, feeds)
            dtype = value.dtype
            if dtype is not dtype_0 and dtype != dtype_0:
                return full_check(signature, feeds)
            shape = value.shape
            if len(shape) != 4 or shape[1] != 1 or shape[2] != 8 or shape[3] != 8:
                return full_check(signature, feeds)
            size_0 = shape[0]
            if not 1 <= size_0 <= 128:
                return full_check(signature, feeds)
            return {dim_0: size_0}

    Feeds that certainly pass get their bound dims back in a few tenths of a microsecond; at any
    doubt (any mismatch, a feeds type other than ``dict``, an array subclass, a byte-swapped dtype)
    the full check decides, which accepts what the quick one cannot vouch for and raises the
    messages. Verdicts and messages are therefore exactly the full check's. Names, dims and dtypes
    reach the code as constants of its namespace, never as source text; sizes as ``int``.
    """
    return _compile_checks(signature, count_dim=None)


def _compile_checks(signature: IOSignature, *, count_dim: str | None) -> Callable[[Mapping[str, Any]], Any]:
    """The code generator behind :func:`compile_feed_validator` and, with ``count_dim``, :func:`compile_feed_counter`."""
    full_check: Callable[[IOSignature, Mapping[str, Any]], Any] = _check_feeds_in_detail
    if count_dim is not None:
        full_check = partial(_count_after, full_check, count_dim)
    namespace: dict[str, Any] = {"ndarray": np.ndarray, "full_check": full_check, "signature": signature}
    fail = "        return full_check(signature, feeds)"
    lines = [
        "def validate_feeds_quickly(feeds):",
        f"    if type(feeds) is not dict or len(feeds) != {len(signature.inputs)}:",
        fail,
    ]
    size_of: dict[str, str] = {}  # dim name -> the local holding its size, in the order the full check binds
    for index, tensor in enumerate(signature.inputs):
        dtype = _resolve_dtype(tensor.dtype)
        if dtype is None:  # the quick check cannot tell this dtype: every call goes to the full check
            return partial(full_check, signature)
        namespace[f"name_{index}"], namespace[f"dtype_{index}"] = tensor.name, dtype
        # A missing name gets None, not an array; with as many keys as inputs and all of them present,
        # no key is unexpected either.
        lines += [f"    value = feeds.get(name_{index})", "    if type(value) is not ndarray:", fail]
        # Identity first: arrays usually carry numpy's one instance of each builtin dtype. Equal dtypes
        # have equal names; an unequal one with the same name (byte-swapped) is left to the full check.
        lines += ["    dtype = value.dtype", f"    if dtype is not dtype_{index} and dtype != dtype_{index}:", fail]
        lines.append("    shape = value.shape")
        shape_checks = [f"len(shape) != {len(tensor.shape)}"]
        shape_checks += [f"shape[{axis}] != {int(dim)}" for axis, dim in enumerate(tensor.shape) if isinstance(dim, int)]
        shape_checks += [f"shape[{axis}] != {size_of[dim]}" for axis, dim in enumerate(tensor.shape) if dim in size_of]
        lines += [f"    if {' or '.join(shape_checks)}:", fail]
        for axis, dim in enumerate(tensor.shape):
            if isinstance(dim, int) or dim == ANONYMOUS_DIM or dim in size_of:
                continue
            number = len(size_of)
            local = size_of[dim] = f"size_{number}"
            namespace[f"dim_{number}"] = dim
            lines.append(f"    {local} = shape[{axis}]")
            bounds = signature.dims.get(dim)
            if bounds is not None:
                lines += [f"    if not {int(bounds.min)} <= {local} <= {int(bounds.max)}:", fail]
            # later axes of this input with the same dim must have the same size
            later = [other for other in range(axis + 1, len(tensor.shape)) if tensor.shape[other] == dim]
            if later:
                lines += [f"    if {' or '.join(f'shape[{other}] != {local}' for other in later)}:", fail]
    if count_dim is not None:
        lines.append(f"    return {size_of.get(count_dim, 1)}")
    else:
        bound = ", ".join(f"dim_{number}: size_{number}" for number in range(len(size_of)))
        lines.append(f"    return {{{bound}}}")
    exec("\n".join(lines), namespace)  # noqa: S102 - generated above from constants and ints only
    function: Callable[[Mapping[str, Any]], Any] = namespace["validate_feeds_quickly"]
    return function


def _count_after(check: Callable[[IOSignature, Mapping[str, Any]], dict[str, int]], count_dim: str,
                 signature: IOSignature, feeds: Mapping[str, Any]) -> int:  # fmt: skip
    return check(signature, feeds).get(count_dim, 1)


def _check_feeds_in_detail(signature: IOSignature, feeds: Mapping[str, Any]) -> dict[str, int]:
    """The full check behind :func:`validate_feeds`: every rule in turn, each with its own message."""
    if not isinstance(feeds, Mapping):
        raise InputSignatureError(
            f"feeds must map input names to numpy arrays, got {type(feeds).__name__}",
            hint=f"pass a dict; the model's inputs: {_list_inputs(signature)}",
        )
    expected_names = signature.input_names
    for name in feeds:
        if name not in expected_names:
            close = difflib.get_close_matches(str(name), expected_names, n=1)
            raise InputSignatureError(
                f"unexpected input {name!r}; the model's inputs: {_list_inputs(signature)}",
                hint=f"did you mean '{close[0]}'?" if close else "remove it from the feeds",
            )
    for tensor in signature.inputs:
        if tensor.name not in feeds:
            raise InputSignatureError(
                f"missing input '{tensor.name}': expected {signature.describe_tensor(tensor)}",
                hint=f"the model's inputs: {_list_inputs(signature)}",
            )

    bound: dict[str, tuple[int, str]] = {}  # dim name -> (size, input that bound it)
    for tensor in signature.inputs:
        value = feeds[tensor.name]
        if not isinstance(value, np.ndarray):
            raise InputSignatureError(
                f"input '{tensor.name}': expected {signature.describe_tensor(tensor)}, got {type(value).__name__}",
                hint=f"pass numpy.asarray(value, dtype=numpy.{tensor.dtype})",
            )
        # The message text is built only when a check fails: this runs on every inference.
        def prefix(tensor: TensorSignature = tensor, value: np.ndarray = value) -> str:
            return f"input '{tensor.name}': expected {signature.describe_tensor(tensor)}, got {describe_array(value)}"

        if tensor.dtype == STRING_DTYPE and is_string_array(value):
            pass
        elif value.dtype.name != tensor.dtype:
            if tensor.dtype == STRING_DTYPE:
                raise InputSignatureError(f"{prefix()} (dtype {value.dtype.name}, expected strings)",
                                          hint="pass numpy.asarray(texts, dtype=object): an array of str")  # fmt: skip
            raise InputSignatureError(
                f"{prefix()} (dtype {value.dtype.name}, expected {tensor.dtype})",
                hint=f"convert it with .astype(numpy.{tensor.dtype}) in your preprocessing",
            )
        if value.ndim != tensor.rank:
            raise InputSignatureError(f"{prefix()} (rank {value.ndim}, expected rank {tensor.rank})")
        for axis, (dim, size) in enumerate(zip(tensor.shape, value.shape)):
            if isinstance(dim, int):
                if size != dim:
                    raise InputSignatureError(f"{prefix()} (dimension {axis} is {size}, expected {dim})")
                continue
            if dim == ANONYMOUS_DIM:
                continue
            bounds = signature.dims.get(dim)
            if bounds is not None and not bounds.contains(size):
                raise InputSignatureError(
                    f"{prefix()} (dimension {axis} '{dim}' is {size}, outside {bounds.min}..{bounds.max})",
                    hint=f"split the call into pieces with {dim} at most {bounds.max}"
                    if size > bounds.max
                    else None,
                )
            if dim in bound and bound[dim][0] != size:
                other_size, other_input = bound[dim]
                where = "earlier in this input" if other_input == tensor.name else f"by input '{other_input}'"
                raise InputSignatureError(
                    f"{prefix()} (dimension {axis} '{dim}' is {size}, but {dim} = {other_size} {where})",
                    hint=f"every input must use the same size for '{dim}'",
                )
            bound.setdefault(dim, (size, tensor.name))
    return {dim: size for dim, (size, _) in bound.items()}
