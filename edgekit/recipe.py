"""Recipes: a validated description of a model, its inputs, its data and how to build it.

A recipe is YAML (see ``recipes/*.yaml``); it loads into a frozen :class:`Recipe`. Relative paths
in a recipe are resolved against the recipe file's directory. ``edgekit schema recipe`` prints the
JSON Schema for editors.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, StrictInt, field_validator, model_validator

from edgekit.code_trust import CodeTrust
from edgekit.config import FieldError, StrictModel, load_model, read_config_bytes, read_yaml
from edgekit.errors import RecipeError
from edgekit.precision import Backend, Precision
from edgekit.recipe_model import (  # noqa: F401 (re-exported: the recipe's public names stay importable from here)
    CALLABLE_PATTERN,
    CONSTANT_ARGS_HELP,
    DTYPES,
    DTYPE_BYTES,
    DTYPE_RANGES,
    MAX_BATCH_BYTES,
    MAX_DIM,
    SAFE_NAME_PATTERN,
    TENSOR_NAME_PATTERN,
    SizeOrName,
    CallableData,
    ConstantArg,
    DataSource,
    DataSpec,
    DynamicDim,
    ExportedProgramSource,
    FactorySource,
    HuggingFaceSource,
    ModelSource,
    NpzData,
    OnnxSource,
    TensorSpec,
    TorchScriptSource,
)


# ---------------------------------------------------------------- evaluation


class AccuracyBudget(StrictModel):
    """Limits on the metric. ``max_drop`` is relative to the FP32 PyTorch reference, in metric units."""

    max_drop: float | None = Field(default=None, ge=0)
    min_value: float | None = None
    max_value: float | None = None

    @model_validator(mode="after")
    def _something(self) -> "AccuracyBudget":
        if self.max_drop is None and self.min_value is None and self.max_value is None:
            raise ValueError("set at least one of max_drop, min_value, max_value")
        return self


class OutputSlice(StrictModel):
    """Part of one output: ``channels`` [start, stop) along ``channel_axis``; the other non-batch axes are items."""

    output: str
    channels: tuple[int, int] | None = Field(default=None, description="[start, stop) along channel_axis (default: all)")
    channel_axis: int = Field(default=-1, description="the axis holding box coordinates / class scores (-1: last; 1 for [batch, 84, anchors])")

    @model_validator(mode="after")
    def _ordered(self) -> "OutputSlice":
        if self.channels is not None and not 0 <= self.channels[0] < self.channels[1]:
            raise ValueError(f"output '{self.output}': channels must be [start, stop) with 0 <= start < stop, got {list(self.channels)}")
        if self.channel_axis == 0:
            raise ValueError(f"output '{self.output}': channel_axis 0 is the batch axis; use 1, 2, ... or -1")
        return self


class DetectionOptions(StrictModel):
    """``metric: detection``: mAP of the candidate's detections, with the FP32 model's detections as ground truth."""

    boxes: OutputSlice = Field(description="where the 4 box coordinates are")
    scores: OutputSlice = Field(description="where the class scores are (one channel, or a [batch, candidates] output: a single class)")
    format: Literal["xyxy", "cxcywh"] = "xyxy"
    score_threshold: float = Field(default=0.25, ge=0, description="detections scoring below this are dropped")
    nms_iou: float = Field(default=0.45, gt=0, le=1, description="per-class non-maximum suppression IoU")
    match_iou: float = Field(default=0.5, gt=0, le=1, description="IoU at which a detection matches a reference box (mAP@0.5)")
    max_detections: int = Field(default=300, ge=1, description="per image, after NMS")


class SegmentationOptions(StrictModel):
    """``metric: segmentation``: mean IoU of the candidate's masks against the FP32 model's masks."""

    class_axis: int = Field(default=1, description="the axis of class logits (argmax); ignored with threshold")
    threshold: float | None = Field(default=None, description="binary masks: output > threshold (instead of argmax)")
    ignore_classes: tuple[int, ...] = Field(default=(), description="classes left out of the mean (e.g. background 0)")


class CtcTextOptions(StrictModel):
    """``metric: ctc_text``: greedy CTC decoding of candidate and FP32 outputs, compared line by line."""

    blank: int = Field(default=0, ge=0, description="index of the CTC blank class")
    time_axis: int = Field(default=1, description="the axis of time steps ([batch, T, classes]: 1; [T, batch, classes]: 0)")
    class_axis: int = Field(default=-1)
    report: Literal["cer", "line_agreement"] = Field(
        default="cer", description="the number the budget reads: character error rate (lower is better) or exact line agreement"
    )


class BinaryDecisionOptions(StrictModel):
    """``metric: binary_decision``: each element's decision (output > threshold) against FP32's; the budget reads the
    agreement of all decisions, or the F1 or IoU of the positive decisions (for dense maps where positives are rare)."""

    threshold: float = 0.5
    report: Literal["agreement", "f1", "iou"] = Field(
        default="agreement",
        description="the number the budget reads: agreement of all decisions, or F1 / IoU of the positives (FP32's positives as "
                    "ground truth); agreement hides lost positives where they are rare (a heatmap at 2 % positives scores 0.98 with none)",
    )


#: metrics the recipe can name; "callable" is ``package.module:function``.
METRIC_NAMES = ("top1", "cosine", "mse", "detection", "segmentation", "ctc_text", "binary_decision", "callable")


class EvaluationSpec(StrictModel):
    metric: Literal[METRIC_NAMES]  # type: ignore[valid-type]
    output: str | None = Field(default=None, description="which output the metric reads (default: the first)")
    labels: str = Field(default="labels", description="key of the labels array in evaluation batches (top1)")
    callable: str | None = Field(default=None, pattern=CALLABLE_PATTERN)
    higher_is_better: bool | None = None
    detection: DetectionOptions | None = None
    segmentation: SegmentationOptions | None = None
    ctc_text: CtcTextOptions | None = None
    binary_decision: BinaryDecisionOptions | None = None
    budget: AccuracyBudget

    @model_validator(mode="after")
    def _callable_named(self) -> "EvaluationSpec":
        if self.metric == "callable" and self.callable is None:
            raise ValueError("metric 'callable' needs 'callable: package.module:function'")
        if self.metric != "callable" and self.callable is not None:
            raise ValueError(f"'callable' is only used with metric 'callable', not '{self.metric}'")
        for name in ("detection", "segmentation", "ctc_text", "binary_decision"):
            if getattr(self, name) is not None and self.metric != name:
                raise ValueError(f"options '{name}' are only used with metric '{name}', not '{self.metric}'")
        if self.metric == "detection" and self.detection is None:
            raise ValueError("metric 'detection' needs options: detection: {boxes: {output: ..., channels: [0, 4]}, scores: {output: ..., channels: [4, 84]}}")
        return self

    @property
    def options(self) -> StrictModel | None:
        """The options of the chosen metric, defaults filled in (None for top1/cosine/mse/callable)."""
        defaults = {"segmentation": SegmentationOptions, "ctc_text": CtcTextOptions, "binary_decision": BinaryDecisionOptions}
        given = getattr(self, self.metric, None) if self.metric in defaults or self.metric == "detection" else None
        if given is None and self.metric in defaults:
            return defaults[self.metric]()
        return given

    @property
    def better_is_higher(self) -> bool:
        if self.higher_is_better is not None:
            return self.higher_is_better
        if self.metric == "ctc_text":
            options = self.options
            return isinstance(options, CtcTextOptions) and options.report == "line_agreement"
        return bool(self.metric != "mse")


# ---------------------------------------------------------------- state


class StateSpec(StrictModel):
    """A recurrent state: the output that one call returns is the input of the next call of a sequence."""

    input: str = Field(description="the state input (listed under inputs)")
    output: str = Field(description="the output that feeds it on the next call (listed under outputs)")
    zeros: tuple[SizeOrName, ...] | None = Field(
        default=None, description="shape of the initial zeros (default: the input's shape, dims sized from the call's other inputs)"
    )


# ---------------------------------------------------------------- export and build


class ParitySpec(StrictModel):
    atol: float = Field(default=1e-4, gt=0)
    rtol: float = Field(default=1e-3, ge=0)
    min_cosine: float = Field(default=0.9999, gt=0, le=1)
    random_inputs: int = Field(default=1, ge=0, le=1000, description="random batches per shape on top of the samples")
    seed: int = Field(default=0, ge=0, lt=2**64)


class ExportSpec(StrictModel):
    exporter: Literal["auto", "dynamo", "legacy"] = Field(
        default="auto", description="auto: dynamo first, the legacy TorchScript exporter if dynamo fails"
    )
    opset: int | None = Field(default=None, ge=13, le=23, description="default: the target's build.opset")
    parity: ParitySpec = ParitySpec()
    external_data_mb: int = Field(default=512, gt=0, description="store weights outside model.onnx above this size")


class BenchmarkSpec(StrictModel):
    warmup: int = Field(default=10, ge=0, le=1_000_000)
    iterations: int = Field(default=50, ge=1, le=1_000_000)
    dims: dict[str, StrictInt] = Field(default_factory=dict, description="dynamic dim values to time at (default: opt)")
    threads: int | None = Field(default=None, ge=1, le=1024, description="intra-op threads (default: the target's cores)")


class Int4Spec(StrictModel):
    method: Literal["rtn", "hqq"] = Field(default="rtn", description="round-to-nearest, or HQQ (half-quadratic) optimised scales")
    block_size: int = Field(default=32, ge=16, le=256, description="weights per scale along the reduction axis (power of two)")
    symmetric: bool = True
    include_embeddings: bool = Field(default=False, description="also quantize Gather embedding tables (GatherBlockQuantized)")
    embedding_block_size: int | None = Field(default=None, ge=16, le=256, description="block size for embedding tables (default: block_size)")

    @field_validator("block_size", "embedding_block_size")
    @classmethod
    def _power_of_two(cls, value: int | None) -> int | None:
        if value is not None and value & (value - 1):
            raise ValueError(f"block_size must be a power of two, got {value}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _hqq_is_asymmetric(cls, data: Any) -> Any:
        """HQQ optimises a scale and a zero point per block (ONNX Runtime's HQQ has no symmetric mode): ``symmetric: true``
        with ``method: hqq`` is refused, and an hqq spec without ``symmetric`` records ``symmetric: false``, as written."""
        if not isinstance(data, dict) or data.get("method") != "hqq":
            return data
        if data.get("symmetric") is True:
            raise ValueError("int4.method hqq is always asymmetric (a zero point per block), so symmetric: true cannot hold; "
                             "remove int4.symmetric (or set it to false) to use hqq, or use int4.method: rtn for symmetric int4")
        return {**data, "symmetric": data.get("symmetric", False)}


class QuantizationSpec(StrictModel):
    """How static and weight-only quantization run; every field is recorded in the manifest as resolved."""

    calibrator: Literal["minmax", "entropy", "percentile"] = "percentile"
    percentile: float = Field(default=99.99, gt=50, le=100)
    calibration_batches: int | None = Field(default=None, ge=1, description="use at most this many calibration batches")
    per_channel: bool = True
    activation_type: Literal["auto", "uint8", "int8"] = Field(
        default="auto", description="auto: uint8 asymmetric on ONNX Runtime CPU (fused on x86), int8 symmetric for TensorRT/NPUs"
    )
    exclude_nodes: tuple[str, ...] = Field(default=(), description="node names kept in higher precision")
    exclude_op_types: tuple[str, ...] = ()
    auto_max_excluded: int = Field(default=12, ge=0, description="--precision auto: most node groups kept in higher precision")
    auto_time_budget_s: float | None = Field(
        default=None, gt=0, description="--precision auto: seconds after which candidates not yet tried are skipped (listed in the plan); FP32 is always available"
    )
    int4: Int4Spec = Int4Spec()
    quantizer: Literal["edgekit", "nncf"] = Field(
        default="edgekit", description="int8 on the openvino backend: edgekit's own QDQ graph, or NNCF's post-training "
        "quantization (pip install 'edgekit[openvino]'; edgekit/engines/openvino_nncf.py)",
    )


class FineTuneSpec(StrictModel):
    callable: str = Field(pattern=CALLABLE_PATTERN, description="fn(module, **kwargs) -> module, run after pruning")
    kwargs: dict[str, Any] = Field(default_factory=dict)


class PruneSpec(StrictModel):
    """Pruning on the PyTorch model before export; accuracy is then measured against the unpruned model."""

    method: Literal["magnitude", "channel", "2:4"]
    sparsity: float | None = Field(default=None, gt=0, lt=1, description="magnitude: fraction of weights zeroed; channel: fraction of channels removed; 2:4: always 0.5")
    norm: Literal["l1", "l2"] | None = Field(default=None, description="channel only: how filters are ranked (default l1)")
    round_to: int | None = Field(default=None, ge=1, description="channel only: keep a multiple of this many channels")
    fine_tune: FineTuneSpec | None = None

    @field_validator("sparsity", mode="before")
    @classmethod
    def _sparsity_is_a_number(cls, value: Any) -> Any:
        if isinstance(value, (bool, str)):  # YAML 'false' or '0.5' (quoted) would pass as 0.0 / 0.5
            raise ValueError(f"sparsity must be a number such as 0.5 (above 0, below 1), not a {type(value).__name__}; "
                             "write it unquoted, or remove build.prune to build without pruning")
        if isinstance(value, (int, float)) and value == 0:
            raise ValueError("sparsity 0 prunes nothing; set a fraction above 0 (e.g. 0.5), or remove build.prune to build without pruning")
        return value

    @model_validator(mode="after")
    def _options_fit_method(self) -> "PruneSpec":
        if self.method in ("magnitude", "channel") and self.sparsity is None:
            raise ValueError(f"prune method '{self.method}' needs sparsity (e.g. 0.5)")
        if self.method == "2:4" and self.sparsity not in (None, 0.5):
            raise ValueError("2:4 sparsity is always 0.5; leave sparsity out")
        if self.method != "channel" and (self.norm is not None or self.round_to is not None):
            raise ValueError("norm and round_to apply only to method 'channel'")
        return self

    def options(self) -> dict[str, Any]:
        return {k: v for k, v in (("norm", self.norm), ("round_to", self.round_to)) if v is not None}


class TensorRTSpec(StrictModel):
    """TensorRT build choices (``--backend tensorrt``); the plan in the bundle records them as resolved."""

    dla_core: int | None = Field(default=None, ge=0, description="run on this DLA core (AGX Orin, Orin NX); DLA runs only fp16/int8")
    gpu_fallback: bool = Field(default=True, description="layers DLA cannot run fall back to the GPU (else the build fails, naming them)")
    builder_optimization_level: int = Field(default=3, ge=0, le=5)
    timing_cache: Literal["shared", "read-only", "off"] = "shared"
    min_shape_profile: bool = Field(default=True, description="add a profile pinned at the min shape so batch-1 calls get batch-1 kernels")


class BuildSpec(StrictModel):
    backend: Backend | None = Field(default=None, description="default: the target's preferred backend")
    precision: Precision | Literal["auto"] = Field(default=Precision.FP32, description="auto: the fastest plan inside the accuracy budget")
    precision_fallback: tuple[Precision, ...] = Field(
        default=(), description="if the target cannot run the precision, use the first of these it can (recorded in the manifest)"
    )
    quantization: QuantizationSpec = QuantizationSpec()
    prune: PruneSpec | None = None
    tensorrt: TensorRTSpec = TensorRTSpec()
    graph_optimization: Literal["disable", "basic", "extended", "all"] = "all"
    benchmark: BenchmarkSpec = BenchmarkSpec()
    golden_batches: int = Field(default=2, ge=1, le=16)


class BuildOverride(StrictModel):
    """Per-target changes to ``build`` and ``export``; fields left out keep the recipe's values."""

    build: dict[str, Any] = Field(default_factory=dict)
    export: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------- the recipe


class Recipe(StrictModel):
    schema_version: Literal[1] = 1
    name: str = Field(pattern=SAFE_NAME_PATTERN, max_length=100, description="names the bundle and its folder: lowercase letters, digits, '.', '_', '-'")
    description: str | None = None
    model: ModelSource
    inputs: tuple[TensorSpec, ...] = Field(min_length=1)
    outputs: tuple[Annotated[str, Field(pattern=TENSOR_NAME_PATTERN, max_length=256)], ...] = Field(min_length=1)
    dims: dict[str, DynamicDim] = Field(default_factory=dict, description="min/opt/max of each named dynamic dim")
    data: DataSpec
    evaluation: EvaluationSpec | None = None
    export: ExportSpec = ExportSpec()
    build: BuildSpec = BuildSpec()
    overrides: dict[str, BuildOverride] = Field(default_factory=dict, description="target name -> changes")
    state: tuple[StateSpec, ...] = Field(
        default=(), description="recurrent state: data are sequences of consecutive chunks, each call's state outputs feed the next call's state inputs"
    )

    # Set by the loader, not by the YAML.
    path: Path | None = Field(default=None, exclude=True)
    sha256: str | None = Field(default=None, exclude=True)
    #: The code-trust decision load_recipe made (None for a Recipe built in Python: its caller's code).
    _code_trust: CodeTrust | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _loader_fields_not_in_yaml(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("path", "sha256"):
                if key in data:
                    raise ValueError(f"'{key}' is not a recipe key: edgekit sets it from the file it loads "
                                     "(remove it; the model's file goes under model.path)")
        return data

    @model_validator(mode="after")
    def _dims_declared(self) -> "Recipe":
        used = {d for spec in self.inputs for d in spec.shape if isinstance(d, str)}
        missing = sorted(used - set(self.dims))
        if missing:
            raise ValueError(f"dynamic dims {missing} are used in inputs but have no entry under 'dims' (min/opt/max)")
        unused = sorted(set(self.dims) - used)
        if unused:
            raise ValueError(f"dims {unused} are declared but no input uses them")
        names = [s.name for s in self.inputs]
        if len(set(names)) != len(names):
            raise ValueError(f"input names must be unique, got {names}")
        if len(set(self.outputs)) != len(self.outputs):
            repeated = next(name for index, name in enumerate(self.outputs) if name in self.outputs[:index])
            raise ValueError(f"outputs lists '{repeated}' more than once: name each output once")
        if self.evaluation and self.evaluation.output and self.evaluation.output not in self.outputs:
            raise ValueError(f"evaluation.output '{self.evaluation.output}' is not one of outputs {list(self.outputs)}")
        return self

    @model_validator(mode="after")
    def _batches_fit_budget(self) -> "Recipe":
        """A batch of inputs at the max shape fits MAX_BATCH_BYTES; benchmark dims are declared and in range."""
        total, largest = 0, (0, "", ())
        for spec in self.inputs:
            shape = tuple(d if isinstance(d, int) else self.dims[d].max for d in spec.shape if isinstance(d, int) or d in self.dims)
            size = DTYPE_BYTES[spec.dtype]
            for dim in shape:
                size *= dim
            total += size
            largest = max(largest, (size, spec.name, shape))
        if total > MAX_BATCH_BYTES:
            size, name, shape = largest
            spec = next(s for s in self.inputs if s.name == name)
            dynamic = [f"dims.{d}.max ({self.dims[d].max})" for d in spec.shape if isinstance(d, str) and d in self.dims]
            index = self.inputs.index(spec)
            biggest = max((d for d in spec.shape if isinstance(d, str) and d in self.dims), key=lambda d: self.dims[d].max, default=None)
            raise FieldError(
                ("dims", biggest, "max") if biggest else ("inputs", index, "shape"),
                f"one batch of inputs at the max shape takes {total / 2**30:.1f} GiB (input '{name}' {list(shape)} {spec.dtype}: "
                f"{size / 2**30:.1f} GiB); the limit is {MAX_BATCH_BYTES / 2**30:.0f} GiB: "
                + (f"lower {' or '.join(dynamic)}" if dynamic else f"check the shape of input '{name}'"),
            )
        for dim, value in self.build.benchmark.dims.items():
            if dim not in self.dims:
                raise FieldError(("build", "benchmark", "dims", dim), f"'{dim}' is not a dynamic dim (dims: {sorted(self.dims) or 'none'})")
            low, high = self.dims[dim].min, self.dims[dim].max
            if not low <= value <= high:
                raise FieldError(("build", "benchmark", "dims", dim), f"{value} is outside dims.{dim} ({low} .. {high})")
        return self

    @model_validator(mode="after")
    def _state_and_metric_outputs(self) -> "Recipe":
        inputs = {spec.name: spec for spec in self.inputs}
        model = self.model
        for name in getattr(model, "constant_args", {}):
            if name in inputs:
                raise ValueError(f"model.constant_args.{name}: '{name}' is also listed under inputs; a forward() argument is either a tensor input or a constant")
        seen: set[str] = set()
        for index, state in enumerate(self.state):
            where = f"state[{index}]"
            if state.input not in inputs:
                raise ValueError(f"{where}.input '{state.input}' is not one of inputs {list(inputs)}")
            if state.output not in self.outputs:
                raise ValueError(f"{where}.output '{state.output}' is not one of outputs {list(self.outputs)}")
            if state.input in seen:
                raise ValueError(f"{where}.input '{state.input}' is listed twice under state")
            seen.add(state.input)
            spec = inputs[state.input]
            if state.zeros is not None:
                if len(state.zeros) != len(spec.shape):
                    raise ValueError(f"{where}.zeros {list(state.zeros)} has rank {len(state.zeros)}; input '{spec.name}' has shape {list(spec.shape)}")
                self._check_zeros(index, spec)
        if self.evaluation is not None and self.evaluation.detection is not None:
            for field in ("boxes", "scores"):
                output = getattr(self.evaluation.detection, field).output
                if output not in self.outputs:
                    raise ValueError(f"evaluation.detection.{field}.output '{output}' is not one of outputs {list(self.outputs)}")
        return self

    def _check_zeros(self, index: int, spec: TensorSpec) -> None:
        """state[index].zeros: each size a whole number >= 1 within the input's dim (its fixed size, or its dims range)."""
        state = self.state[index]
        assert state.zeros is not None
        where = f"input '{spec.name}' {list(spec.shape)}"
        for axis, (dim, size) in enumerate(zip(spec.shape, state.zeros)):
            loc = ("state", index, "zeros", axis)
            if isinstance(size, str):
                if size not in self.dims:
                    raise FieldError(loc, f"axis {axis} names dim '{size}', which is not under dims {sorted(self.dims)}")
                continue
            if size < 1:
                raise FieldError(loc, f"axis {axis} is {size}: sizes of the initial zeros are whole numbers >= 1 or dim names ({where})")
            if isinstance(dim, int) and size != dim:
                raise FieldError(loc, f"axis {axis} is {size}; {where} fixes it at {dim}")
            if isinstance(dim, str) and not self.dims[dim].min <= size <= self.dims[dim].max:
                low, high = self.dims[dim].min, self.dims[dim].max
                raise FieldError(loc, f"axis {axis} is {size}, outside dims.{dim} ({low} .. {high}) of {where}: "
                                      f"use a size in that range, or the dim's name '{dim}'")

    @property
    def state_inputs(self) -> dict[str, StateSpec]:
        """State input name -> its state entry (empty for a stateless model)."""
        return {state.input: state for state in self.state}

    @property
    def batch_dim(self) -> str | None:
        """The batch dim: the named dim at axis 0 of the first input that has one (the rule of the golden outputs'
        batch axes, edgekit.bundle.golden.output_batch_axes); None when no input starts with a named dim."""
        return next((spec.shape[0] for spec in self.inputs if spec.shape and isinstance(spec.shape[0], str)), None)

    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    def resolve(self, path: Path) -> Path:
        """A recipe-relative path made absolute."""
        path = Path(path).expanduser()
        return path if path.is_absolute() else (self.base_dir / path).resolve()

    def for_target(self, target_name: str) -> "Recipe":
        """This recipe with the target's override merged in (its key is the target's name or a profile path of that stem;
        edgekit.recipe_overrides); the callables the merged recipe names are checked against the code trust."""
        from edgekit.recipe_overrides import merged, override_key

        key = override_key(self, target_name)
        if key is None:
            return self
        result: Recipe = merged(self, key)
        if self._code_trust is not None:  # an override may name a callable too (prune.fine_tune)
            self._code_trust.check(result, self.base_dir, f"{self.path} (overrides.{key})")
            result._code_trust = self._code_trust
        return result

    def shape_at(self, spec: TensorSpec, point: Literal["min", "opt", "max"] | dict[str, int]) -> tuple[int, ...]:
        """The concrete shape of ``spec`` with dynamic dims at min/opt/max or given values."""
        out = []
        for dim in spec.shape:
            if isinstance(dim, int):
                out.append(dim)
            elif isinstance(point, dict):
                out.append(point.get(dim, self.dims[dim].opt))
            else:
                out.append(getattr(self.dims[dim], point))
        return tuple(out)


def load_recipe(path: Path | str, trust_code: bool = False) -> Recipe:
    """Load and validate a recipe file.

    The callables it names must live in the recipe's folder or edgekit's demos (or a folder in
    ``EDGEKIT_TRUSTED_CODE_DIRS``) unless ``trust_code`` is set: see :mod:`edgekit.code_trust`.
    """
    path = Path(path)
    raw = read_config_bytes(path, RecipeError, "recipe")  # read once: the hash is of the bytes validated
    recipe = load_model(path, Recipe, RecipeError, "recipe", raw=raw)
    digest = hashlib.sha256(raw).hexdigest()
    recipe = recipe.model_copy(update={"path": path.resolve(), "sha256": digest})
    if recipe.overrides:  # every target's override, whichever target this build is for (edgekit.recipe_overrides)
        from edgekit.recipe_overrides import check_overrides
        from edgekit.target import default_registry

        check_overrides(recipe, read_yaml(path, RecipeError, "recipe", raw)[1], default_registry().names())
    trust = CodeTrust.for_recipe(recipe.base_dir, trust_code)
    trust.check(recipe, recipe.base_dir, str(recipe.path))
    recipe._code_trust = trust
    return recipe


def recipe_json_schema() -> dict[str, Any]:
    schema = Recipe.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "edgekit recipe"
    schema.get("properties", {}).pop("path", None)
    schema.get("properties", {}).pop("sha256", None)
    return schema


def dump_schema(path: Path) -> None:
    path.write_text(json.dumps(recipe_json_schema(), indent=2) + "\n")
