"""Target profiles: every shipped YAML loads, carries its sources, and states the hardware facts right;
bad profiles fail with errors that name the file, the line, the field and the fix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import pydantic
import pytest
import yaml

from edgekit.errors import TargetError
from edgekit.precision import Backend, Precision
from edgekit.target import (
    TARGETS_DIR,
    TENSORRT_MIN_COMPUTE_CAPABILITY,
    TargetProfile,
    TargetRegistry,
    default_registry,
    get_target,
    load_target_file,
    target_json_schema,
)

SHIPPED = default_registry().names()
ORIN = ["jetson-agx-orin-64gb", "jetson-orin-nx-16gb", "jetson-orin-nano-8gb", "jetson-orin-nano-super"]
CPU_ONLY = ["x86-64-cpu", "arm64-cpu", "raspberry-pi-5"]
NPU = ["qualcomm-qcs6490", "intel-core-ultra-npu"]
FP8_AND_FINER = {Precision.FP8, Precision.NVFP4, Precision.MXFP8, Precision.MXFP4}
SCHEMA_LINE = "# yaml-language-server: $schema=../edgekit/schemas/target.schema.json"


def all_precisions(profile: TargetProfile) -> set[Precision]:
    return {p for backend in profile.backends for p in backend.precisions}


# ---------------------------------------------------------------- every shipped profile


def test_the_expected_targets_ship():
    expected = {
        "jetson-agx-thor", "jetson-agx-orin-64gb", "jetson-orin-nx-16gb", "jetson-orin-nano-8gb",
        "jetson-orin-nano-super", "raspberry-pi-5", "arm64-cpu", "x86-64-cpu", "nvidia-h100", "nvidia-h200",
        "qualcomm-qcs6490", "intel-core-ultra-npu",
    }  # fmt: skip
    assert expected <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_target_loads(name: str):
    profile = get_target(name)
    assert profile.name == name
    assert profile.default_backend is profile.backends[0].name
    assert profile.precisions(), f"{name}: its default backend runs no precision"
    assert profile.to_json()["name"] == name


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_target_points_editors_at_the_schema(name: str):
    first_line = (TARGETS_DIR / f"{name}.yaml").read_text().splitlines()[0]
    assert first_line == SCHEMA_LINE
    assert (TARGETS_DIR / SCHEMA_LINE.split("=", 1)[1]).resolve().is_file()


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_target_validates_against_the_published_schema(name: str):
    schema = target_json_schema()
    data = yaml.safe_load((TARGETS_DIR / f"{name}.yaml").read_text())
    problems = [error.message for error in jsonschema.Draft202012Validator(schema).iter_errors(data)]
    assert problems == []


# ---------------------------------------------------------------- every number has a source

#: Keys whose numbers are file-format versions, not facts about a device.
NOT_FACTS = {"schema_version"}
NUMBER_TEXT = re.compile(r"[0-9]+(\.[0-9]+)*")


def lines_with_numbers(text: str) -> set[int]:
    """1-based lines holding a numeric value (YAML int/float, or a string that is a number or a version)."""
    found: set[int] = set()

    def walk(node: yaml.Node) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value not in NOT_FACTS:
                    walk(value)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item)
        elif isinstance(node, yaml.ScalarNode):
            numeric_tag = node.tag.endswith((":int", ":float"))
            if numeric_tag or (node.tag.endswith(":str") and NUMBER_TEXT.fullmatch(node.value)):
                found.add(node.start_mark.line + 1)

    root = yaml.compose(text)
    if root is not None:
        walk(root)
    return found


def unsourced_lines(text: str) -> list[str]:
    raw = text.splitlines()
    missing = [n for n in sorted(lines_with_numbers(text)) if "# source:" not in raw[n - 1]]
    return [f"line {n}: {raw[n - 1].strip()}" for n in missing]


def test_source_check_catches_an_unsourced_number():
    text = (
        "name: jetson-orin-nx-16gb\n"
        "schema_version: 1\n"
        "cpu:\n"
        "  cores: 8   # source: a datasheet\n"
        "  model: 8-core Arm Cortex-A78AE\n"
        "memory: {gb: 16}\n"
        "software: {cuda: \"12.6\"}\n"
        "peak_throughput:\n"
        "  - {precision: int8, value: 100}\n"
    )
    assert unsourced_lines(text) == [
        "line 6: memory: {gb: 16}",
        'line 7: software: {cuda: "12.6"}',
        "line 9: - {precision: int8, value: 100}",
    ]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_number_in_a_shipped_target_names_its_source(name: str):
    text = (TARGETS_DIR / f"{name}.yaml").read_text()
    assert lines_with_numbers(text), f"{name}.yaml holds no numbers at all?"
    assert unsourced_lines(text) == [], f"{name}.yaml: numbers without a '# source:' comment"


# ---------------------------------------------------------------- the hardware facts


@pytest.mark.parametrize("name", ORIN)
def test_orin_is_ampere_87_without_fp8(name: str):
    profile = get_target(name)
    assert profile.gpu is not None
    assert profile.gpu.architecture == "ampere"
    assert profile.gpu.compute_capability == "8.7"
    assert profile.default_backend is Backend.TENSORRT
    assert all_precisions(profile).isdisjoint(FP8_AND_FINER), f"{name} lists a precision Ampere cannot run"
    assert {Precision.FP32, Precision.FP16, Precision.INT8, Precision.INT4} <= set(profile.precisions())
    assert all(peak.precision not in FP8_AND_FINER for peak in profile.peak_throughput)
    assert profile.software.jetpack is not None and profile.software.jetpack.startswith("6.")
    assert profile.software.tensorrt_major == 10
    assert profile.software.cuda == "12.6"


@pytest.mark.parametrize(
    ("name", "dla_cores"),
    [("jetson-agx-orin-64gb", 2), ("jetson-orin-nx-16gb", 2), ("jetson-orin-nano-8gb", 0),
     ("jetson-orin-nano-super", 0), ("jetson-agx-thor", 0), ("nvidia-h100", 0), ("nvidia-h200", 0)],
)  # fmt: skip
def test_dla_cores(name: str, dla_cores: int):
    assert get_target(name).dla_cores == dla_cores


def test_thor_is_blackwell_with_fp8_and_fp4_and_no_dla():
    thor = get_target("jetson-agx-thor")
    assert thor.gpu is not None
    assert thor.gpu.architecture == "blackwell"
    assert thor.gpu.compute_capability == "11.0"  # CUDA 13 numbering (10.1 under CUDA 12.8/12.9)
    assert thor.software.cuda == "13.0" and thor.software.jetpack == "7.0"
    assert FP8_AND_FINER | {Precision.BF16} <= set(thor.precisions(Backend.TENSORRT))
    assert thor.dla_cores == 0
    assert thor.memory.gb == 128 and thor.memory.shared_with_gpu


def test_h100_is_hopper_90_with_fp8_but_no_fp4():
    h100 = get_target("nvidia-h100")
    assert h100.gpu is not None
    assert (h100.gpu.architecture, h100.gpu.compute_capability) == ("hopper", "9.0")
    tensorrt = set(h100.precisions(Backend.TENSORRT))
    assert Precision.FP8 in tensorrt and Precision.BF16 in tensorrt
    assert tensorrt.isdisjoint({Precision.NVFP4, Precision.MXFP4, Precision.MXFP8})
    assert h100.gpu.memory_gb == 80 and not h100.memory.shared_with_gpu


def test_h200_is_the_h100_chip_with_more_and_faster_memory():
    h100, h200 = get_target("nvidia-h100"), get_target("nvidia-h200")
    assert h200.gpu is not None and h100.gpu is not None
    assert (h200.gpu.architecture, h200.gpu.compute_capability, h200.gpu.cuda_cores) == ("hopper", "9.0", h100.gpu.cuda_cores)
    assert h200.peak_throughput == h100.peak_throughput  # same tensor / CUDA-core peaks (datasheets)
    assert (h200.gpu.memory_gb, h200.gpu.memory_bandwidth_gbps) == (141, 4800)
    assert h200.precisions(Backend.TENSORRT) == h100.precisions(Backend.TENSORRT)
    assert h200.power_modes == h100.power_modes == {"MAX_TDP": 700}


def test_orin_nano_super_is_the_nano_in_maxn_super():
    nano, sup = get_target("jetson-orin-nano-8gb"), get_target("jetson-orin-nano-super")
    assert nano.gpu == sup.gpu.model_copy(update={"name": nano.gpu.name, "max_clock_mhz": nano.gpu.max_clock_mhz})  # same silicon
    assert (nano.gpu.max_clock_mhz, sup.gpu.max_clock_mhz) == (625, 1020)  # faster clocks
    assert sup.power_modes["MAXN_SUPER"] == 25
    assert sup.software.jetpack == "6.2"
    assert sup.memory.bandwidth_gbps == 102 and nano.memory.bandwidth_gbps == 68
    (peak,) = [p for p in sup.peak_throughput if p.power_mode == "MAXN_SUPER"]
    assert (peak.precision, peak.value, peak.unit, peak.sparse) == (Precision.INT8, 67, "TOPS", True)
    assert "MAXN_SUPER" not in nano.power_modes


@pytest.mark.parametrize("name", CPU_ONLY)
def test_cpu_targets_run_every_cpu_precision_on_the_cpu_provider(name: str):
    profile = get_target(name)
    assert profile.gpu is None and profile.npu is None and profile.dla_cores == 0
    backend = profile.backends[0]
    assert backend.name is Backend.ONNXRUNTIME
    # x86-64-cpu also offers OpenVINO's CPU plugin (tests/engines/test_openvino_build.py), never before ONNX Runtime
    assert [b.name for b in profile.backends[1:]] == ([Backend.OPENVINO] if profile.cpu.arch == "x86_64" else [])
    assert [ep.name for ep in backend.execution_providers] == ["CPUExecutionProvider"]
    assert set(backend.precisions) == {
        Precision.FP32, Precision.FP16, Precision.INT8, Precision.INT8_DYNAMIC, Precision.INT4,
    }  # fmt: skip


@pytest.mark.parametrize("name", NPU)
def test_npu_targets_reach_the_npu_through_an_execution_provider(name: str):
    profile = get_target(name)
    assert profile.npu is not None and profile.gpu is None
    backend = profile.backend(Backend.ONNXRUNTIME)
    providers = [ep.name for ep in backend.execution_providers]
    assert providers[0] == profile.npu.execution_provider  # the NPU first, the CPU as fallback
    assert providers[-1] == "CPUExecutionProvider"
    assert set(backend.precisions) <= {Precision.FP16, Precision.INT8}


def test_qcs6490_runs_int8_qdq_on_htp_v68():
    qcs = get_target("qualcomm-qcs6490")
    assert qcs.precisions() == (Precision.INT8,)  # HTP v68 has no FP16
    qnn = qcs.backend("onnxruntime").execution_providers[0]
    assert qnn.name == "QNNExecutionProvider"
    assert qnn.options["backend_path"] == "libQnnHtp.so"
    assert qnn.options["htp_arch"] == "68"


def test_intel_npu_uses_openvino_with_device_type_npu():
    intel = get_target("intel-core-ultra-npu")
    assert intel.default_backend is Backend.OPENVINO and intel.backend(Backend.OPENVINO).device == "NPU"
    openvino = intel.backend("onnxruntime").execution_providers[0]
    assert openvino.name == "OpenVINOExecutionProvider"
    assert openvino.options["device_type"] == "NPU"
    assert set(intel.precisions()) == {Precision.FP16, Precision.INT8}


@pytest.mark.parametrize("name", [n for n in SHIPPED if (gpu := get_target(n).gpu) is not None and gpu.is_cuda])
def test_jetson_and_gpu_targets_offer_tensorrt_then_onnxruntime(name: str):
    profile = get_target(name)
    assert [b.name for b in profile.backends] == [Backend.TENSORRT, Backend.ONNXRUNTIME]
    providers = [ep.name for ep in profile.backend("onnxruntime").execution_providers]
    assert providers == ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    trt_options = profile.backend("onnxruntime").execution_providers[0].options
    assert trt_options["trt_fp16_enable"] is False  # FP16 only when the recipe asks for it


def test_backend_lookup_names_the_backends_a_target_has():
    with pytest.raises(TargetError) as info:
        get_target("raspberry-pi-5").backend("tensorrt")
    assert "target 'raspberry-pi-5' has no tensorrt backend" in info.value.message
    assert info.value.hint == "its backends: onnxruntime"


# ---------------------------------------------------------------- lookup errors


def test_unknown_target_suggests_the_close_names():
    with pytest.raises(TargetError) as info:
        get_target("jetson-orin-nano")
    message = info.value.message
    assert message.startswith("unknown target 'jetson-orin-nano'")
    assert "did you mean" in message
    assert "'jetson-orin-nano-8gb'" in message and "'jetson-orin-nano-super'" in message
    assert "edgekit targets" in (info.value.hint or "")


def test_a_yaml_path_loads_as_a_target(tmp_path: Path):
    copy = tmp_path / "jetson-orin-nx-16gb.yaml"
    copy.write_text((TARGETS_DIR / "jetson-orin-nx-16gb.yaml").read_text())
    assert get_target(str(copy)) == get_target("jetson-orin-nx-16gb")


def test_registry_over_a_directory(tmp_path: Path):
    for name in ("arm64-cpu", "raspberry-pi-5"):
        (tmp_path / f"{name}.yaml").write_text((TARGETS_DIR / f"{name}.yaml").read_text())
    registry = TargetRegistry(tmp_path)
    assert registry.names() == ["arm64-cpu", "raspberry-pi-5"]
    assert [p.name for p in registry.all()] == ["arm64-cpu", "raspberry-pi-5"]


# ---------------------------------------------------------------- bad profiles in tmp_path


def copy_with(tmp_path: Path, name: str, old: str, new: str, *, file_name: str | None = None) -> tuple[Path, int]:
    """A copy of a shipped profile with one edit; returns (path, 1-based line of the edit)."""
    text = (TARGETS_DIR / f"{name}.yaml").read_text()
    assert text.count(old) == 1, f"{old!r} should occur once in {name}.yaml"
    line = text[: text.index(old)].count("\n") + 1
    path = tmp_path / (file_name or f"{name}.yaml")
    path.write_text(text.replace(old, new))
    return path, line


def test_mistyped_nested_key_names_file_line_field_and_fix(tmp_path: Path):
    path, line = copy_with(tmp_path, "jetson-orin-nx-16gb", "  compute_capability:", "  compute_capabilty:")
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    message = info.value.message
    assert f"{path}:{line}:3: unknown key 'compute_capabilty' in gpu (did you mean 'compute_capability'?)" in message
    assert info.value.hint == "rename 'compute_capabilty' to 'compute_capability'"


def test_mistyped_top_level_key(tmp_path: Path):
    path, line = copy_with(tmp_path, "jetson-agx-orin-64gb", "dla_cores: 2", "dla_core: 2")
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    assert f"{path}:{line}:1: unknown key 'dla_core' in (top level) (did you mean 'dla_cores'?)" in info.value.message


def test_unknown_key_without_a_close_match_lists_the_valid_keys(tmp_path: Path):
    path, _ = copy_with(tmp_path, "raspberry-pi-5", "  shared_with_gpu: true", "  colour: red")
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    assert "unknown key 'colour' in memory" in info.value.message
    assert info.value.hint == "valid keys there: bandwidth_gbps, gb, shared_with_gpu"


def test_wrong_type_names_field_and_value(tmp_path: Path):
    path, line = copy_with(tmp_path, "arm64-cpu", "  cores: 4 ", "  cores: many ")
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    assert f"{path}:{line}:3: field 'cpu.cores'" in info.value.message
    assert "(got 'many')" in info.value.message


def test_unknown_precision_is_refused(tmp_path: Path):
    path, line = copy_with(tmp_path, "arm64-cpu", "[fp32, fp16,", "[fp64, fp16,")
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    assert f"{path}:{line}:" in info.value.message
    assert "field 'backends[0].precisions[0]'" in info.value.message and "'fp64'" in info.value.message


def test_yaml_syntax_error_names_line_and_column(tmp_path: Path):
    path, line = copy_with(tmp_path, "jetson-orin-nx-16gb", "  gb: 16 ", "  gb: [16 ")
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    assert re.search(rf"{re.escape(str(path))}:{line + 1}:\d+: YAML syntax error", info.value.message)
    assert info.value.hint == "fix the YAML at that line and column"


def test_duplicate_key_is_an_error(tmp_path: Path):
    path, line = copy_with(tmp_path, "jetson-orin-nx-16gb", "dla_cores: 2", "dla_cores: 2\ndla_cores: 1")
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    assert f"{path}:{line + 1}:1: key 'dla_cores' appears twice (first on line {line})" in info.value.message


def test_file_name_must_match_the_profile_name(tmp_path: Path):
    path, _ = copy_with(tmp_path, "arm64-cpu", "name: arm64-cpu", "name: arm64-cpu", file_name="my-arm.yaml")
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    assert "name 'arm64-cpu' does not match the file name 'my-arm'" in info.value.message
    assert "rename the file to arm64-cpu.yaml" in (info.value.hint or "")


def test_fp8_on_orin_is_refused(tmp_path: Path):
    path, _ = copy_with(tmp_path, "jetson-orin-nano-8gb", "precisions: [fp32, fp16, int8, int4]\n  - name: onnx",
                        "precisions: [fp32, fp16, int8, fp8, int4]\n  - name: onnx")  # fmt: skip
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    assert "tensorrt precision 'fp8' needs compute capability 8.9 or newer; this GPU is 8.7" in info.value.message


def test_peak_figure_must_name_a_defined_power_mode(tmp_path: Path):
    path, _ = copy_with(tmp_path, "jetson-orin-nano-super", "sparse: true, power_mode: MAXN_SUPER}",
                        "sparse: true, power_mode: MAXN}")  # fmt: skip
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    assert "names power mode 'MAXN', which is not a key of power_modes (MAXN_SUPER, 25W, 15W, 7W)" in info.value.message


def test_npu_provider_must_be_in_the_backend(tmp_path: Path):
    path, _ = copy_with(tmp_path, "qualcomm-qcs6490", "execution_provider: QNNExecutionProvider",
                        "execution_provider: SNPEExecutionProvider")  # fmt: skip
    with pytest.raises(TargetError) as info:
        load_target_file(path)
    assert (
        "npu.execution_provider 'SNPEExecutionProvider' is not among the onnxruntime backend's execution_providers "
        "(CPUExecutionProvider, QNNExecutionProvider)"
    ) in info.value.message


# ---------------------------------------------------------------- the precision table


def profile_data(name: str, **changes: Any) -> dict[str, Any]:
    data = get_target(name).to_json()
    data.update(changes)
    return data


@pytest.mark.parametrize(("precision", "needed"), sorted(TENSORRT_MIN_COMPUTE_CAPABILITY.items()))
def test_each_tensorrt_precision_floor(precision: Precision, needed: tuple[int, int]):
    """Every entry of the table: one minor version below its floor fails, the floor itself passes."""
    base = profile_data("nvidia-h100")
    base["backends"][0]["precisions"] = ["fp32", precision.value]
    at_floor = dict(base, gpu=dict(base["gpu"], compute_capability=f"{needed[0]}.{needed[1]}"))
    assert precision in TargetProfile.model_validate(at_floor).precisions()
    below = (needed[0] - 1, 9) if needed[1] == 0 else (needed[0], needed[1] - 1)
    too_old = dict(base, gpu=dict(base["gpu"], compute_capability=f"{below[0]}.{below[1]}"))
    with pytest.raises(pydantic.ValidationError, match=f"'{precision.value}' needs compute capability"):
        TargetProfile.model_validate(too_old)


def test_onnxruntime_backend_needs_a_provider():
    data = profile_data("arm64-cpu")
    data["backends"][0]["execution_providers"] = []
    with pytest.raises(pydantic.ValidationError, match="needs at least one execution provider"):
        TargetProfile.model_validate(data)


def test_target_json_schema_shape():
    schema = target_json_schema()
    assert schema["title"] == "edgekit target profile"
    assert schema["$schema"].endswith("2020-12/schema")
    assert schema["additionalProperties"] is False
    assert {"name", "display_name", "cpu", "memory", "backends"} <= set(schema["required"])
    precision_enum = schema["$defs"]["Precision"]["enum"]
    assert precision_enum == [p.value for p in Precision]
