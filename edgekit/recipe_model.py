"""The recipe's model sections: where the model comes from (one source type per ``model.kind``), its input and
output tensors with their dynamic dims, and the data it is run on; with the field patterns and limits every
section of a recipe shares. :mod:`edgekit.recipe` assembles these into a :class:`~edgekit.recipe.Recipe`
(and re-exports them); :mod:`edgekit.code_trust` reads :data:`CALLABLE_PATTERN` from here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Field, StrictInt, field_validator, model_validator

from edgekit.config import FieldError, StrictModel

CALLABLE_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool", "string")
#: The values each dtype holds ([low, high] inclusive): bounds of random inputs and constant values must fit.
DTYPE_RANGES: dict[str, tuple[float, float]] = {
    "float32": (-3.4028234663852886e38, 3.4028234663852886e38), "float16": (-65504.0, 65504.0),
    "bfloat16": (-3.3895313892515355e38, 3.3895313892515355e38), "int64": (-(2**63), 2**63 - 1),
    "int32": (-(2**31), 2**31 - 1), "int8": (-128, 127), "uint8": (0, 255), "bool": (0, 1),
    "string": (-(2**63), 2**63 - 1),
}
#: Bytes per element of the arrays edgekit makes for each dtype (bfloat16 test inputs are made as float32; a
#: string element is counted as a pointer and a short word).
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 4, "int64": 8, "int32": 4, "int8": 1, "uint8": 1, "bool": 1, "string": 64}
#: ``string`` tensors (ONNX ``tensor(string)``, the protocol's BYTES) are numpy object arrays of ``str``; random
#: test inputs of one are decimal integers drawn from low..high (default 0..1000), as text.
#: The largest dimension (TensorRT and many kernels index with int32).
MAX_DIM = 2**31 - 1
#: The most bytes one batch of inputs may take at the max shape: test, golden and benchmark batches are made
#: at these shapes, so a typo such as a batch of 10**9 fails here, not after minutes of export.
MAX_BATCH_BYTES = 4 << 30
#: Names that become file or folder names (the recipe's, hence the bundle's and its output folder's).
SAFE_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
#: Tensor names: they become keys (member names) of the golden .npz archives.
TENSOR_NAME_PATTERN = r"^[A-Za-z0-9_][\w.:/-]*$"


# ---------------------------------------------------------------- model sources


class _SourceBase(StrictModel):
    pass


#: A non-tensor forward() argument pinned for export (``sr: 16000``); recorded in the manifest.
ConstantArg = Union[bool, int, float, str, None, tuple[Union[bool, int, float], ...]]
CONSTANT_ARGS_HELP = (
    "forward() arguments that are not tensors, bound to these values before export (e.g. sr: 16000); "
    "the exported graph has no input for them and the manifest records them"
)


class FactorySource(_SourceBase):
    """A Python callable ``package.module:function`` returning a ``torch.nn.Module``."""

    kind: Literal["factory"]
    factory: str = Field(pattern=CALLABLE_PATTERN, description="package.module:function")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    constant_args: dict[str, ConstantArg] = Field(default_factory=dict, description=CONSTANT_ARGS_HELP)


class TorchScriptSource(_SourceBase):
    kind: Literal["torchscript"]
    path: Path
    constant_args: dict[str, ConstantArg] = Field(default_factory=dict, description=CONSTANT_ARGS_HELP)


class ExportedProgramSource(_SourceBase):
    """A ``torch.export`` program saved with ``torch.export.save`` (``.pt2``)."""

    kind: Literal["exported_program"]
    path: Path


class HuggingFaceSource(_SourceBase):
    """A local Hugging Face model directory, exported through Optimum's ONNX exporter."""

    kind: Literal["huggingface"]
    path: Path | None = None
    path_from: str | None = Field(default=None, pattern=CALLABLE_PATTERN, description="callable returning the directory")
    task: str = "feature-extraction"

    @model_validator(mode="after")
    def _one_path(self) -> "HuggingFaceSource":
        if (self.path is None) == (self.path_from is None):
            raise ValueError("give exactly one of 'path' (a directory) or 'path_from' (a callable returning it)")
        return self


class OnnxSource(_SourceBase):
    """An existing ``.onnx`` file: export is skipped, parity has no PyTorch reference."""

    kind: Literal["onnx"]
    path: Path


ModelSource = Annotated[
    Union[FactorySource, TorchScriptSource, ExportedProgramSource, HuggingFaceSource, OnnxSource],
    Field(discriminator="kind"),
]


# ---------------------------------------------------------------- inputs and outputs


def _size_or_name(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("a dimension is a whole number (a fixed size) or the name of a dim under dims")
    return value


#: A size or a dim name, exactly as written: YAML's ``true`` (or ``4.0``) is neither, not the size 1 (or 4).
SizeOrName = Annotated[Union[int, str], BeforeValidator(_size_or_name)]


class DynamicDim(StrictModel):
    min: StrictInt = Field(ge=1, le=MAX_DIM)
    opt: StrictInt = Field(ge=1, le=MAX_DIM)
    max: StrictInt = Field(ge=1, le=MAX_DIM)

    @model_validator(mode="after")
    def _ordered(self) -> "DynamicDim":
        if not self.min <= self.opt <= self.max:
            raise ValueError(f"need min <= opt <= max, got min={self.min} opt={self.opt} max={self.max}")
        return self


class TensorSpec(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z_][\w.:/-]*$", max_length=256)
    dtype: Literal[DTYPES]  # type: ignore[valid-type]
    shape: tuple[SizeOrName, ...] = Field(description="ints for fixed dims, names for dynamic dims; [] for a scalar (rank 0)")
    low: float | None = Field(default=None, description="lower bound for random test inputs")
    high: float | None = Field(default=None, description="upper bound (exclusive for ints) for random test inputs")
    value: float | bool | None = Field(
        default=None, description="the one value test, benchmark and probe inputs use (e.g. a sample rate of 16000): instead of low/high"
    )

    @field_validator("shape")
    @classmethod
    def _dims(cls, shape: tuple[int | str, ...]) -> tuple[int | str, ...]:
        for dim in shape:
            if isinstance(dim, int) and dim < 1:
                raise ValueError(f"fixed dimensions must be >= 1, got {dim}")
            if isinstance(dim, int) and dim > MAX_DIM:
                raise ValueError(f"fixed dimension {dim} is larger than {MAX_DIM} (2**31 - 1); is it a typo?")
            if isinstance(dim, str) and not re.match(r"^[A-Za-z_]\w*$", dim):
                raise ValueError(f"dynamic dimension names must be identifiers, got '{dim}'")
        if len(shape) > 16:
            raise ValueError(f"rank {len(shape)} is more than 16 dimensions; is the shape a typo?")
        return shape

    @model_validator(mode="after")
    def _bounds_fit_dtype(self) -> "TensorSpec":
        """low/high/value are numbers the dtype holds (whole numbers for integer dtypes)."""
        if self.dtype == "bool" and (self.low is not None or self.high is not None):
            raise FieldError(("low" if self.low is not None else "high",), f"input '{self.name}' is bool: low/high do not apply (random bools are 0 or 1); remove them")
        lowest, highest = DTYPE_RANGES[self.dtype]
        integer = self.dtype.startswith(("int", "uint")) or self.dtype == "string"
        for field, value, top in (("low", self.low, highest), ("high", self.high, highest + 1 if integer else highest),
                                  ("value", getattr(self, "value", None), highest)):
            if value is None or isinstance(value, bool):
                continue
            if integer and not float(value).is_integer():
                raise FieldError((field,), f"input '{self.name}' is {self.dtype}: {field} must be a whole number, got {value}")
            if not lowest <= value <= top:
                raise FieldError((field,), f"input '{self.name}': {field} {value:g} does not fit {self.dtype} ({lowest:g} .. {top:g})")
        if self.low is not None and self.high is not None and not self.low < self.high:
            raise FieldError(("high",), f"input '{self.name}': need low < high, got low={self.low} high={self.high}")
        return self

    @model_validator(mode="after")
    def _value_or_range(self) -> "TensorSpec":
        if self.value is not None:
            if self.low is not None or self.high is not None:
                raise ValueError(f"input '{self.name}': give either value ({self.value}) or low/high, not both")
        if self.low is not None and self.high is not None and not self.low < self.high:
            raise ValueError(f"input '{self.name}': need low < high, got low={self.low} high={self.high}")
        return self


# ---------------------------------------------------------------- data


class CallableData(StrictModel):
    """``package.module:function(**kwargs)`` returning a list of batches (dicts of NumPy arrays)."""

    callable: str = Field(pattern=CALLABLE_PATTERN)
    kwargs: dict[str, Any] = Field(default_factory=dict)


class NpzData(StrictModel):
    """A directory of ``.npz`` files, one batch each, arrays keyed by input name (plus labels)."""

    npz_dir: Path


DataSource = Union[CallableData, NpzData]


class DataSpec(StrictModel):
    samples: DataSource = Field(description="a few representative batches: parity, golden outputs")
    calibration: DataSource | None = Field(default=None, description="batches for quantization calibration")
    evaluation: DataSource | None = Field(default=None, description="held-out batches for the accuracy metric")

