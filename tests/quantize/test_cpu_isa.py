"""int8 weight range by CPU: 7-bit weights where ONNX Runtime's x86 u8s8 kernels would saturate (AVX2 without VNNI).

The saturation itself runs on real ONNX Runtime in ``test_sensitivity.py`` (the simulation-vs-written test).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import numpy_helper

from edgekit.errors import TargetError
from edgekit.precision import Backend, Precision
from edgekit.quantize.ort.dynamic import write_dynamic
from edgekit.quantize.ort.static_qdq import write_static_qdq
from edgekit.quantize.cpu_isa import read_host_isa, reduce_range_for, target_isa
from edgekit.quantize.plan import make_plan
from edgekit.quantize.sensitivity import fake_quantize_weight
from edgekit.recipe import QuantizationSpec
from edgekit.target import TARGETS_DIR, TargetProfile, get_target, load_target_file

# Trimmed from real /proc/cpuinfo files: the flags line is what counts.
INTEL_VNNI = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
flags\t\t: fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx f16c avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni
"""
AMD_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu vme de pse tsc msr sse sse2 ssse3 sse4_1 sse4_2 avx f16c avx2 fma bmi2
"""
ALDER_LAKE = "flags\t\t: sse4_2 avx avx2 avx_vnni\n"
ARM_DOTPROD = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text, encoding="utf-8")
    return path


def x86_target(tmp_path: Path, isa: object, *, first_provider: str | None = None) -> TargetProfile:
    data = yaml.safe_load((TARGETS_DIR / "x86-64-cpu.yaml").read_text(encoding="utf-8"))
    if isa is None:
        data["cpu"].pop("isa", None)
    else:
        data["cpu"]["isa"] = isa
    if first_provider is not None:
        data["backends"][0]["execution_providers"].insert(0, {"name": first_provider, "options": {}})
    path = tmp_path / "x86-64-cpu.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return load_target_file(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (INTEL_VNNI, ("avx2", "avx512f", "avx512bw", "avx512_vnni")),
        (AMD_AVX2, ("avx2",)),
        (ALDER_LAKE, ("avx2", "avx_vnni")),
        (ARM_DOTPROD, ("asimddp",)),
        ("processor\t: 0\n", ()),
    ],
)
def test_host_flags_are_read_from_cpuinfo(tmp_path: Path, text: str, expected: tuple[str, ...]) -> None:
    assert read_host_isa(write(tmp_path, text)) == expected


def test_a_missing_cpuinfo_reads_as_no_flags(tmp_path: Path) -> None:
    assert read_host_isa(tmp_path / "absent") == ()


@pytest.mark.parametrize(
    ("isa", "reduce", "words"),
    [
        (["avx2"], True, ["7-bit", "avx2", "no VNNI", "saturate"]),
        (["avx2", "avx512_vnni"], False, ["8-bit", "avx512_vnni"]),
        (["avx2", "avx_vnni"], False, ["8-bit", "avx_vnni"]),
        (["avx2", "amx_int8"], False, ["8-bit", "amx_int8"]),
        (None, True, ["7-bit", "does not set cpu.isa", "[avx2, avx512_vnni]"]),
    ],
)
def test_x86_cpu_targets_reduce_the_weight_range_without_a_dot_product(tmp_path: Path, isa: object, reduce: bool, words: list[str]) -> None:
    target = x86_target(tmp_path, isa)
    got, why = reduce_range_for(target, Backend.ONNXRUNTIME)
    assert got is reduce
    assert why is not None and all(word in why for word in words), why


@pytest.mark.parametrize(("text", "reduce"), [(AMD_AVX2, True), (INTEL_VNNI, False)])
def test_a_host_profile_reads_the_build_machine(tmp_path: Path, text: str, reduce: bool) -> None:
    target = x86_target(tmp_path, "host")
    cpuinfo = write(tmp_path, text)
    assert target_isa(target, cpuinfo)[1] == f"read from this host's {cpuinfo}"
    got, why = reduce_range_for(target, Backend.ONNXRUNTIME, cpuinfo)
    assert got is reduce and str(cpuinfo) in (why or "")


def test_the_shipped_dev_host_profile_reads_this_machine() -> None:
    assert get_target("x86-64-cpu").cpu.isa == "host"


def test_the_question_does_not_arise_off_the_x86_cpu_provider(tmp_path: Path) -> None:
    assert reduce_range_for(get_target("raspberry-pi-5"), Backend.ONNXRUNTIME) == (False, None)  # ARM widens, no saturation
    assert reduce_range_for(get_target("nvidia-h100"), Backend.TENSORRT) == (False, None)
    assert reduce_range_for(get_target("nvidia-h100"), Backend.ONNXRUNTIME) == (False, None)  # TensorRT EP first
    assert reduce_range_for(x86_target(tmp_path, ["avx2"], first_provider="OpenVINOExecutionProvider"), Backend.ONNXRUNTIME) == (False, None)


def test_plans_carry_the_range_and_say_why(tmp_path: Path) -> None:
    target = x86_target(tmp_path, ["avx2"])
    static = make_plan(QuantizationSpec(), target, Backend.ONNXRUNTIME, Precision.INT8)
    dynamic = make_plan(QuantizationSpec(), target, Backend.ONNXRUNTIME, Precision.INT8_DYNAMIC)
    assert static.reduce_range and dynamic.reduce_range
    assert any("7-bit" in note for note in static.notes) and any("7-bit" in note for note in dynamic.notes)
    assert static.to_manifest()["reduce_range"] is True
    # int8 activations are s8s8, not the saturating u8s8 path
    signed = make_plan(QuantizationSpec(activation_type="int8"), target, Backend.ONNXRUNTIME, Precision.INT8)
    assert not signed.reduce_range and not any("7-bit" in note for note in signed.notes)
    vnni = make_plan(QuantizationSpec(), x86_target(tmp_path, ["avx2", "avx512_vnni"]), Backend.ONNXRUNTIME, Precision.INT8)
    assert not vnni.reduce_range and any("8-bit" in note for note in vnni.notes)


def test_a_malformed_isa_entry_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(TargetError) as info:
        x86_target(tmp_path, ["AVX2"])
    assert "cpu.isa" in str(info.value)


def tiny_matmul(path: Path) -> Path:
    from onnx import TensorProto, helper

    weight = np.random.default_rng(5).normal(0, 1, (16, 8)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return path


@pytest.mark.parametrize("precision", [Precision.INT8, Precision.INT8_DYNAMIC])
@pytest.mark.parametrize(("isa", "limit"), [(["avx2"], 64), (["avx2", "avx512_vnni"], 127)])
def test_written_weights_stay_inside_the_range(tmp_path: Path, precision: Precision, isa: list[str], limit: int) -> None:
    from edgekit.quantize.calibration.ranges import TensorRange

    fp32 = tiny_matmul(tmp_path / "fp32.onnx")
    plan = make_plan(QuantizationSpec(), x86_target(tmp_path, isa), Backend.ONNXRUNTIME, precision)
    out = tmp_path / "int8.onnx"
    if precision is Precision.INT8:
        write_static_qdq(fp32, out, plan, {name: TensorRange(-3.0, 3.0, "minmax", False) for name in ("x", "y")})
    else:
        write_dynamic(fp32, out, plan)
    weights = [numpy_helper.to_array(init) for init in onnx.load(str(out)).graph.initializer if init.data_type == onnx.TensorProto.INT8]
    assert weights, "no int8 weight was written"
    peak = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert peak == limit  # per-channel symmetric: each channel's largest weight lands on the top level


def test_the_simulated_weight_levels_follow_the_range() -> None:
    weight = np.linspace(-1, 1, 33, dtype=np.float32).reshape(1, 33)
    assert len(np.unique(fake_quantize_weight(weight, 0))) == 33
    reduced = fake_quantize_weight(weight, 0, reduce_range=True)
    assert np.allclose(reduced * 64, np.round(reduced * 64), atol=1e-5) and np.abs(reduced).max() == pytest.approx(1.0)
