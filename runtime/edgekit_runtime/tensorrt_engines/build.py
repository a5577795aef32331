"""Building a serialized TensorRT engine from an ONNX model and a :class:`TensorRTBuildPlan`.

The same function runs on the host (``edgekit build --backend tensorrt`` when the host GPU matches the
target) and on the device (first load of a bundle with no matching engine). Every call into TensorRT is
type-checked against ``tensorrt-stubs`` (the TensorRT 10 API); where TensorRT 11 differs, the code is
guarded by the installed major and says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, cast

from edgekit_runtime.tensorrt_engines.errors import EngineBuildError
from edgekit_runtime.tensorrt_engines.materialise import BuildOutput
from edgekit_runtime.tensorrt_engines.plan import DlaPolicy, NetworkTyping, TensorRTBuildPlan, TimingCachePolicy
from edgekit_runtime.tensorrt_engines.version import TensorRTVersion, detect_tensorrt

if TYPE_CHECKING:
    import tensorrt as trt

log = logging.getLogger(__name__)

PARSER_HINT = (
    "see the TensorRT ONNX operator support matrix for this TensorRT version; export at an opset it supports "
    "(target build.opset or recipe export.opset), or keep the node out of quantization "
    "(quantization.exclude_nodes) when the error is about its Q/DQ"
)


@dataclass(frozen=True)
class ParserIssue:
    """One error of TensorRT's ONNX parser."""

    node_index: int  # -1 when the error is not about a node
    node_name: str
    operator: str
    description: str
    code: str = ""

    def describe(self) -> str:
        if self.node_name:
            where = f"node '{self.node_name}'"
        elif self.node_index >= 0:
            where = f"node #{self.node_index}"
        else:
            where = "the model"
        operator = f" ({self.operator})" if self.operator else ""
        code = f" [{self.code}]" if self.code else ""
        return f"{where}{operator}: {self.description}{code}"


def onnx_parse_error(onnx_path: Path, issues: Sequence[ParserIssue]) -> EngineBuildError:
    listed = "\n  - ".join(issue.describe() for issue in issues) or "(the parser reported no details)"
    return EngineBuildError(f"TensorRT's ONNX parser rejected '{onnx_path}' ({len(issues)} error(s)):\n  - {listed}", hint=PARSER_HINT)


def dla_layers_message(layers: Sequence[tuple[str, str]], dla: DlaPolicy) -> str:
    listed = ", ".join(f"'{name}' ({kind})" for name, kind in layers)
    policy = "they run on the GPU (gpu_fallback: true)" if dla.gpu_fallback else "gpu_fallback is false"
    return f"{len(layers)} layer(s) cannot run on DLA core {dla.core}: {listed}; {policy}"


def dla_unsupported_error(layers: Sequence[tuple[str, str]], dla: DlaPolicy) -> EngineBuildError:
    return EngineBuildError(
        dla_layers_message(layers, dla),
        hint="allow GPU fallback (recipe build.tensorrt.gpu_fallback: true), or build without DLA (leave build.tensorrt.dla_core out)",
    )


def check_plan_for_version(plan: TensorRTBuildPlan, version: TensorRTVersion) -> list[str]:
    """Refuse a plan the installed TensorRT cannot express; returns notes for expressible differences."""
    notes: list[str] = []
    # TensorRT 11 removed weak typing (BuilderFlag.FP16/BF16/INT8/FP8/INT4/FP4) and DLA is not offered with it.
    if version.major >= 11 and plan.network_typing is NetworkTyping.WEAK and plan.builder_flags:
        raise EngineBuildError(
            f"the plan for target '{plan.target}' expresses {plan.precision} with TensorRT 10 builder flags "
            f"({', '.join(plan.builder_flags)}), which TensorRT {version} removed (strong typing only)",
            hint="rebuild the bundle with the target's software.tensorrt_major set to 11: edgekit then casts the ONNX "
            "to FP16 on the host, and quantized precisions come from the quantize stage's Q/DQ nodes",
        )
    if version.major >= 11 and plan.dla is not None:
        raise EngineBuildError(
            f"the plan for target '{plan.target}' runs on DLA core {plan.dla.core}, which edgekit supports with TensorRT 10 "
            f"only; this device has TensorRT {version}",
            hint="build without DLA (leave build.tensorrt.dla_core out), or use TensorRT 10 (JetPack 6)",
        )
    if version.major != plan.tensorrt_major:
        notes.append(f"the plan was made for TensorRT {plan.tensorrt_major}; building with TensorRT {version}")
    return notes


def _network_flags(plan: TensorRTBuildPlan, version: TensorRTVersion) -> int:
    import tensorrt as trt

    if version.major >= 11:
        # TensorRT 11: every network is strongly typed; the flag may be gone, so set it only if it still exists.
        if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
            return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        return 0
    # TensorRT 10: explicit batch is the only mode (EXPLICIT_BATCH is deprecated and ignored); typing is chosen.
    if plan.network_typing is NetworkTyping.STRONG:
        return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return 0


def _precision_flag(name: str) -> trt.BuilderFlag:
    import tensorrt as trt

    # TensorRT 10 only: these weak-typing flags do not exist in TensorRT 11 (check_plan_for_version refuses them).
    flags = {
        "FP16": trt.BuilderFlag.FP16,
        "BF16": trt.BuilderFlag.BF16,
        "INT8": trt.BuilderFlag.INT8,
        "FP8": trt.BuilderFlag.FP8,
        "INT4": trt.BuilderFlag.INT4,
        "FP4": trt.BuilderFlag.FP4,
    }
    return flags[name]


def _make_logger(collected: list[str]) -> trt.ILogger:
    import tensorrt as trt

    class Recorder(trt.ILogger):
        """Forwards TensorRT's messages to logging and keeps the errors for the error text."""

        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
            if severity in (trt.ILogger.INTERNAL_ERROR, trt.ILogger.ERROR):
                collected.append(msg)
                log.error("TensorRT: %s", msg)
            elif severity == trt.ILogger.WARNING:
                log.warning("TensorRT: %s", msg)
            else:
                log.debug("TensorRT: %s", msg)

    return Recorder()


def _parse(network: trt.INetworkDefinition, onnx_path: Path, trt_logger: trt.ILogger) -> trt.OnnxParser:
    import tensorrt as trt

    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse_from_file(str(onnx_path)):
        issues = []
        for index in range(parser.num_errors):
            error: Any = parser.get_error(index)
            issues.append(ParserIssue(int(error.node()), str(error.node_name()), str(error.node_operator()), str(error.desc()), str(error.code())))
        raise onnx_parse_error(onnx_path, issues)
    return parser


def _add_profiles(builder: trt.Builder, network: trt.INetworkDefinition, config: trt.IBuilderConfig, plan: TensorRTBuildPlan) -> None:
    import tensorrt as trt

    network_inputs = [network.get_input(i).name for i in range(network.num_inputs)]
    if sorted(network_inputs) != sorted(plan.input_names):
        raise EngineBuildError(
            f"the plan's optimisation profiles name inputs {list(plan.input_names)}, the ONNX model has {network_inputs}",
            hint="the bundle's model and tensorrt/plan.json disagree: rebuild the bundle",
        )
    for profile in plan.profiles:
        trt_profile = builder.create_optimization_profile()
        for shape in profile.shapes:
            trt_profile.set_shape(shape.name, trt.Dims(list(shape.min)), trt.Dims(list(shape.opt)), trt.Dims(list(shape.max)))
        if config.add_optimization_profile(trt_profile) < 0:
            raise EngineBuildError(f"TensorRT rejected optimisation profile '{profile.name}' ({profile.to_dict()})",
                                   hint="check the recipe's dims min/opt/max against the model's input shapes")


def _apply_dla(builder: trt.Builder, network: trt.INetworkDefinition, config: trt.IBuilderConfig, dla: DlaPolicy) -> tuple[str, ...]:
    import tensorrt as trt

    if dla.core >= builder.num_DLA_cores:
        raise EngineBuildError(f"the plan asks for DLA core {dla.core}; this device has {builder.num_DLA_cores} DLA core(s)",
                               hint="choose a DLA core below that number, or build without DLA")
    config.default_device_type = trt.DeviceType.DLA
    config.DLA_core = dla.core
    if dla.gpu_fallback:
        config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    unsupported = [(layer.name, str(layer.type)) for layer in layers if not config.can_run_on_DLA(layer)]
    if unsupported and not dla.gpu_fallback:
        raise dla_unsupported_error(unsupported, dla)
    if unsupported:
        log.warning("%s", dla_layers_message(unsupported, dla))
    return tuple(name for name, _ in unsupported)


def build_serialized_engine(onnx_path: Path, plan: TensorRTBuildPlan, *, timing_cache: bytes | None = None) -> BuildOutput:
    """Parse ``onnx_path`` and build it under ``plan``; returns the engine bytes and the timing cache."""
    version = detect_tensorrt()
    notes = check_plan_for_version(plan, version)
    import tensorrt as trt

    errors: list[str] = []
    trt_logger = _make_logger(errors)
    builder = trt.Builder(trt_logger)
    network = builder.create_network(_network_flags(plan, version))
    _parser = _parse(network, Path(onnx_path), trt_logger)  # the parser must outlive the build
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, plan.workspace_bytes)
    config.builder_optimization_level = plan.builder_optimization_level
    if plan.network_typing is NetworkTyping.WEAK:
        for name in plan.builder_flags:
            config.set_flag(_precision_flag(name))
    if plan.sparse_weights:
        # TensorRT 10 has SPARSE_WEIGHTS; TensorRT 11 is not documented to keep it, so it is set only if present.
        if version.major < 11 or hasattr(trt.BuilderFlag, "SPARSE_WEIGHTS"):
            config.set_flag(trt.BuilderFlag.SPARSE_WEIGHTS)
        else:
            notes.append(f"TensorRT {version} has no SPARSE_WEIGHTS flag; the 2:4 weights build as dense")
    _add_profiles(builder, network, config, plan)
    dla_fallback = _apply_dla(builder, network, config, plan.dla) if plan.dla is not None else ()
    if plan.timing_cache is not TimingCachePolicy.OFF:
        cache = config.create_timing_cache(timing_cache or b"")
        config.set_timing_cache(cache, False)  # ignore_mismatch=False: a cache from another device is not used
    started = time.perf_counter()
    # TensorRT returns None when the build fails; the stubs declare IHostMemory, hence the cast.
    serialized = cast(Optional["trt.IHostMemory"], builder.build_serialized_network(network, config))
    seconds = time.perf_counter() - started
    if serialized is None:
        detail = "; ".join(errors[-5:]) or "no error message from TensorRT"
        raise EngineBuildError(
            f"TensorRT {version} failed to build an engine from '{onnx_path}' for target '{plan.target}' ({plan.precision}): {detail}",
            hint="a larger workspace (target build.workspace_mb) helps when the error is about memory; run with "
            "logging at DEBUG to see TensorRT's full log",
        )
    timing_out = None
    if plan.timing_cache is TimingCachePolicy.SHARED:
        timing_out = bytes(config.get_timing_cache().serialize())
    for note in notes:
        log.info("%s", note)
    return BuildOutput(
        engine=bytes(serialized),
        timing_cache=timing_out,
        seconds=seconds,
        dla_fallback_layers=dla_fallback,
        details={"tensorrt_version": str(version), "api": str(version.api), "notes": notes},
    )
