"""TensorRT version detection, the API path it picks, and the text of every TensorRT error path."""

from __future__ import annotations

import importlib
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgekit.engines.tensorrt.plan import TensorRTOptions, plan_tensorrt_build
from edgekit.precision import Precision
from edgekit.recipe import Recipe
from edgekit.target import TargetProfile
from edgekit_runtime.tensorrt_engines.build import (
    ParserIssue,
    check_plan_for_version,
    dla_layers_message,
    dla_unsupported_error,
    onnx_parse_error,
)
from edgekit_runtime.tensorrt_engines.errors import CudaUnavailableError, EngineBuildError, TensorRTUnavailableError
from edgekit_runtime.tensorrt_engines.plan import DlaPolicy
from edgekit_runtime.tensorrt_engines.version import (
    TensorRTApi,
    TensorRTVersion,
    api_for_major,
    detect_tensorrt,
    import_pycuda_driver,
    no_cuda_device,
    on_jetson,
)
from tests.engines.conftest import with_tensorrt_major


@pytest.fixture
def jetson_root(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "nv_tegra_release").write_text("# R36 (release), REVISION: 4.3\n")
    return tmp_path


@pytest.mark.parametrize(("text", "parsed", "api"), [
    ("10.3.0.30", TensorRTVersion(10, 3, 0, 30), TensorRTApi.WEAKLY_TYPED_10),
    ("10.13.0.35", TensorRTVersion(10, 13, 0, 35), TensorRTApi.WEAKLY_TYPED_10),
    ("11.4.0.106", TensorRTVersion(11, 4, 0, 106), TensorRTApi.STRONGLY_TYPED_11),
    ("11.0", TensorRTVersion(11, 0, 0, None), TensorRTApi.STRONGLY_TYPED_11),
    ("10.8.0.43+cuda12.8", TensorRTVersion(10, 8, 0, 43), TensorRTApi.WEAKLY_TYPED_10),
    ("12.1.0", TensorRTVersion(12, 1, 0, None), TensorRTApi.STRONGLY_TYPED_11),
])
def test_version_strings(text: str, parsed: TensorRTVersion, api: TensorRTApi) -> None:
    version = TensorRTVersion.parse(text)
    assert version == parsed and version.api is api
    assert version.short == f"{parsed.major}.{parsed.minor}.{parsed.patch}"


def test_versions_order_and_print() -> None:
    assert TensorRTVersion.parse("10.3.0.30") < TensorRTVersion.parse("10.13.0.35") < TensorRTVersion.parse("11.0.0")
    assert str(TensorRTVersion.parse("10.3.0.30")) == "10.3.0.30" and str(TensorRTVersion.parse("11.1")) == "11.1.0"


@pytest.mark.parametrize("text", ["", "ten", "10", "v10.3", None, 10.3])
def test_unreadable_version_strings(text: object) -> None:
    with pytest.raises(TensorRTUnavailableError) as caught:
        TensorRTVersion.parse(text)
    assert f"cannot read the TensorRT version {text!r} (expected MAJOR.MINOR.PATCH[.BUILD], e.g. '10.13.0.35')" in str(caught.value)
    assert "tensorrt.__file__" in str(caught.value)


def test_tensorrt8_is_refused() -> None:
    with pytest.raises(TensorRTUnavailableError, match=r"TensorRT 8.x is not supported: edgekit drives the TensorRT 10 and 11 Python APIs[\s\S]*JetPack 6"):
        api_for_major(8)


def test_detection_with_fake_version_strings() -> None:
    def importer(version: str) -> object:
        return lambda name: SimpleNamespace(__version__=version, Builder=object)

    assert detect_tensorrt(importer("10.3.0.30")) == TensorRTVersion(10, 3, 0, 30)
    assert detect_tensorrt(importer("11.4.0.106")).api is TensorRTApi.STRONGLY_TYPED_11
    with pytest.raises(TensorRTUnavailableError, match="TensorRT 9.x is not supported"):
        detect_tensorrt(importer("9.3.0.1"))


def test_this_machine_has_no_tensorrt() -> None:
    """Real detection here: tensorrt-stubs installs a 'tensorrt' namespace package with only .pyi files
    (or, without the stubs, `import tensorrt` fails); both read as not installed, with the x86 hint."""
    with pytest.raises(TensorRTUnavailableError) as caught:
        detect_tensorrt()
    message = str(caught.value)
    assert message.startswith("TensorRT is not installed: ")
    assert "only type stubs" in message or "`import tensorrt` failed" in message
    assert "on x86-64, `pip install tensorrt`" in message


def test_missing_tensorrt_on_a_jetson_points_at_jetpack(jetson_root: Path) -> None:
    def missing(name: str) -> object:
        raise ModuleNotFoundError(f"No module named '{name}'")

    assert on_jetson(jetson_root) and not on_jetson(jetson_root / "etc")
    with pytest.raises(TensorRTUnavailableError) as caught:
        detect_tensorrt(missing, root=jetson_root)
    assert "TensorRT is not installed: `import tensorrt` failed (No module named 'tensorrt')" in str(caught.value)
    assert "TensorRT comes with JetPack: `sudo apt install nvidia-jetpack`" in str(caught.value)
    assert "python3-libnvinfer" in str(caught.value) and "--system-site-packages" in str(caught.value)


def test_tensorrt_whose_libraries_do_not_load(jetson_root: Path) -> None:
    def broken(name: str) -> object:
        raise OSError("libnvinfer.so.10: cannot open shared object file")

    with pytest.raises(TensorRTUnavailableError, match="could not load its libraries .libnvinfer.so.10: cannot open shared object file"):
        detect_tensorrt(broken, root=jetson_root)


def test_missing_pycuda(jetson_root: Path, tmp_path: Path) -> None:
    if importlib.util.find_spec("pycuda") is not None:
        pytest.skip("pycuda is installed here; the missing-pycuda text is checked where it is not")
    with pytest.raises(CudaUnavailableError) as caught:
        import_pycuda_driver(root=jetson_root)
    assert "pycuda is not installed: `import pycuda.driver` failed" in str(caught.value)
    assert "build pycuda against JetPack's CUDA" in str(caught.value)
    with pytest.raises(CudaUnavailableError, match=r"install the CUDA toolkit \(nvcc on PATH\), then `pip install pycuda`"):
        import_pycuda_driver(root=tmp_path / "x86")


def test_no_cuda_device_text() -> None:
    message = str(no_cuda_device("0 CUDA device(s) visible", device_id=1))
    assert "no CUDA device 1 can be opened: 0 CUDA device(s) visible" in message
    assert "nvidia-smi" in message and "CUDA_VISIBLE_DEVICES" in message and "--gpus all" in message


def test_parser_errors_name_the_nodes() -> None:
    issues = [
        ParserIssue(3, "/encoder/layer.0/attention/Softmax", "Softmax", "Unsupported axis", "UNSUPPORTED_NODE"),
        ParserIssue(7, "", "MatMulNBits", "No importer registered for op: MatMulNBits", "UNSUPPORTED_NODE"),
        ParserIssue(-1, "", "", "Model has no graph", ""),
    ]
    message = str(onnx_parse_error(Path("bundle/model.onnx"), issues))
    assert "TensorRT's ONNX parser rejected 'bundle/model.onnx' (3 error(s)):" in message
    assert "  - node '/encoder/layer.0/attention/Softmax' (Softmax): Unsupported axis [UNSUPPORTED_NODE]" in message
    assert "  - node #7 (MatMulNBits): No importer registered for op: MatMulNBits [UNSUPPORTED_NODE]" in message
    assert "  - the model: Model has no graph" in message
    assert "quantization.exclude_nodes" in message and "opset" in message


def test_dla_layers_are_listed_with_the_policy() -> None:
    layers = [("/head/Softmax", "LayerType.SOFTMAX"), ("/pool/TopK", "LayerType.TOPK")]
    assert dla_layers_message(layers, DlaPolicy(0, True)) == (
        "2 layer(s) cannot run on DLA core 0: '/head/Softmax' (LayerType.SOFTMAX), '/pool/TopK' (LayerType.TOPK); "
        "they run on the GPU (gpu_fallback: true)"
    )
    error = str(dla_unsupported_error(layers, DlaPolicy(1, False)))
    assert "cannot run on DLA core 1" in error and "gpu_fallback is false" in error
    assert "build.tensorrt.gpu_fallback: true" in error


def test_tensorrt11_refuses_weak_typing_and_dla(image_recipe: Recipe, agx_orin: TargetProfile) -> None:
    fp16 = plan_tensorrt_build(image_recipe, agx_orin, Precision.FP16)
    with pytest.raises(EngineBuildError) as caught:
        check_plan_for_version(fp16, TensorRTVersion.parse("11.4.0.106"))
    assert "expresses fp16 with TensorRT 10 builder flags (FP16), which TensorRT 11.4.0.106 removed (strong typing only)" in str(caught.value)
    assert "software.tensorrt_major set to 11" in str(caught.value)
    dla = plan_tensorrt_build(image_recipe, agx_orin, Precision.INT8, options=TensorRTOptions(dla_core=0))
    with pytest.raises(EngineBuildError, match="runs on DLA core 0, which edgekit supports with TensorRT 10 only"):
        check_plan_for_version(replace(dla, builder_flags=(), network_typing=dla.network_typing.STRONG), TensorRTVersion.parse("11.0.0"))
    assert check_plan_for_version(fp16, TensorRTVersion.parse("10.3.0")) == []


def test_a_strongly_typed_plan_builds_on_either_major(image_recipe: Recipe, h100: TargetProfile) -> None:
    plan = plan_tensorrt_build(image_recipe, with_tensorrt_major(h100, 11), Precision.FP16)
    assert check_plan_for_version(plan, TensorRTVersion.parse("11.4.0")) == []
    assert check_plan_for_version(plan, TensorRTVersion.parse("10.13.0")) == ["the plan was made for TensorRT 11; building with TensorRT 10.13.0"]
