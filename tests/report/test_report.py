"""The build report: model statistics on real ONNX files, and report.html rendered from manifests."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgekit.errors import BundleError
from edgekit.report import model_size_by_op_type, op_type_counts, plots, render_report, write_report

W_SHAPE = (16, 8)  # float32: 512 bytes, read by MatMul
B_SHAPE = (8,)  # float32: 32 bytes, read by Add then by Mul (counted once, under Add)
UNUSED_SHAPE = (5,)  # int64: 40 bytes, read by nothing
SCRIPT = "<script>alert('x')</script>"

# ---------------------------------------------------------------- tiny models


def _tiny_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = numpy_helper.from_array(rng.standard_normal(W_SHAPE).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(B_SHAPE).astype(np.float32), "B")
    unused = numpy_helper.from_array(np.arange(5, dtype=np.int64), "U")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Add", ["h", "B"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["h3"]),
        helper.make_node("Mul", ["h3", "B"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        initializer=[weights, bias, unused],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return model


def _model_with_if_branch() -> onnx.ModelProto:
    """An If whose then-branch reads an outer initializer and holds its own."""
    outer = numpy_helper.from_array(np.ones((4,), dtype=np.float16), "outer_w")
    inner = numpy_helper.from_array(np.ones((2, 2), dtype=np.float32), "inner_w")
    then_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "outer_w"], ["t"]), helper.make_node("Relu", ["t"], ["then_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT16, [4])],
        initializer=[inner],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["else_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT16, [4])],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph)],
        "branchy",
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4])],
        initializer=[outer],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.fixture
def tiny_model_path(tmp_path: Path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save_model(_tiny_model(), path)
    return path


@pytest.fixture
def external_model_path(tmp_path: Path) -> Path:
    directory = tmp_path / "external"
    directory.mkdir()
    path = directory / "model.onnx"
    onnx.save_model(
        _tiny_model(), path, save_as_external_data=True, all_tensors_to_one_file=True,
        location="model.onnx.data", size_threshold=0,
    )
    return path


# ---------------------------------------------------------------- model statistics


def test_size_by_op_type_counts_exact_bytes_once_per_initializer(tiny_model_path: Path) -> None:
    sizes = model_size_by_op_type(tiny_model_path)
    assert sizes == {"MatMul": 16 * 8 * 4, "unused": 5 * 8, "Add": 8 * 4}
    assert list(sizes) == ["MatMul", "unused", "Add"], "largest first"
    assert "Mul" not in sizes, "B is shared with Mul but belongs to its first consumer, Add"


def test_size_by_op_type_reads_external_data(external_model_path: Path) -> None:
    data_file = external_model_path.parent / "model.onnx.data"
    assert data_file.stat().st_size >= 512 + 32 + 40
    assert all(t.data_location == TensorProto.EXTERNAL for t in onnx.load(external_model_path, load_external_data=False).graph.initializer)
    assert model_size_by_op_type(external_model_path) == {"MatMul": 512, "unused": 40, "Add": 32}


def test_size_and_counts_cover_subgraphs(tmp_path: Path) -> None:
    path = tmp_path / "branchy.onnx"
    onnx.save_model(_model_with_if_branch(), path)
    assert model_size_by_op_type(path) == {"unused": 16, "Mul": 8}
    assert op_type_counts(path) == {"Identity": 1, "If": 1, "Mul": 1, "Relu": 1}


def test_op_type_counts(tiny_model_path: Path) -> None:
    assert op_type_counts(tiny_model_path) == {"Add": 1, "MatMul": 1, "Mul": 1, "Relu": 1}


def test_missing_model_file_is_a_bundle_error(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"nope\.onnx: ONNX model not found"):
        model_size_by_op_type(tmp_path / "nope.onnx")


def test_corrupt_model_file_is_a_bundle_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"\xff\xfe this is not a protobuf" * 10)
    with pytest.raises(BundleError, match=r"broken\.onnx: not a readable ONNX model") as info:
        op_type_counts(path)
    assert "re-export" in str(info.value)


def test_missing_external_data_names_tensor_and_file(external_model_path: Path) -> None:
    (external_model_path.parent / "model.onnx.data").unlink()
    with pytest.raises(BundleError, match=r"initializer 'W': external data file .*model\.onnx\.data not found"):
        model_size_by_op_type(external_model_path)


def test_truncated_external_data_is_reported(external_model_path: Path) -> None:
    data_file = external_model_path.parent / "model.onnx.data"
    data_file.write_bytes(data_file.read_bytes()[:100])
    with pytest.raises(BundleError, match=r"has 100 bytes, the tensor needs bytes") as info:
        model_size_by_op_type(external_model_path)
    assert "truncated" in str(info.value)


# ---------------------------------------------------------------- manifests


def _comparison(point: str, batch: int, kind: str, max_abs_diff: float, cosine_min: float) -> dict[str, Any]:
    """One parity comparison as edgekit.export.parity writes it into ``export.parity.shapes``."""
    return {
        "output": "logits", "point": point, "dims": {"batch": batch}, "inputs": kind,
        "max_abs_diff": max_abs_diff, "cosine_min": cosine_min, "expected": 0.25, "got": 0.25 + max_abs_diff,
        "within_tolerance": True, "worst_index": [0, 3],
    }


def realistic_manifest() -> dict[str, Any]:
    """A manifest with every key of docs/bundle-format.md, as a digits CNN build would write it."""
    sha = "ab" * 32
    return {
        "schema_version": 1,
        "name": "digits-cnn-x86-64-cpu-fp32",
        "created": "2026-11-21T19:00:00Z",
        "recipe": {"path": "recipes/digits-cnn.yaml", "sha256": sha, "name": "digits-cnn"},
        "target": {
            "schema_version": 1, "name": "x86-64-cpu", "display_name": "Generic x86-64 CPU (this host)",
            "vendor": "generic", "family": "x86-64",
            "cpu": {"arch": "x86_64", "cores": 2, "model": "x86-64 with AVX-512 VNNI"},
            "gpu": None, "dla_cores": 0, "npu": None,
            "memory": {"gb": 24.0, "bandwidth_gbps": None, "shared_with_gpu": False},
            "peak_throughput": [], "power_modes": {},
            "software": {"jetpack": None, "tensorrt_major": None, "cuda": None, "os": "linux"},
            "backends": [{
                "name": "onnxruntime", "precisions": ["fp32", "fp16", "int8", "int8-dynamic", "int4"],
                "execution_providers": [{"name": "CPUExecutionProvider", "options": {}}],
            }],
            "build": {"workspace_mb": 1024, "opset": 18, "max_batch": None},
            "notes": None,
        },
        "backend": {
            "name": "onnxruntime",
            "execution_providers": [{"name": "CPUExecutionProvider", "options": {}}],
            "graph_optimization": "all",
            "intra_op_threads": 2,
            "offline_optimization": "basic", "nodes_exported": 14, "nodes_optimized": 9,
        },
        "precision": "fp32",
        "model": {
            "path": "model.onnx", "external_data": None, "opset": 18, "size_bytes": 2_412_345, "sha256": sha,
            "source": {"kind": "factory", "description": "examples.digits:make_cnn", "sha256": None},
        },
        "files": {
            "model.onnx": sha, "golden/inputs_000.npz": sha, "golden/outputs_000.npz": sha,
            "golden/inputs_001.npz": sha, "golden/outputs_001.npz": sha,
        },
        "io": {
            "inputs": [{"name": "pixels", "dtype": "float32", "shape": ["batch", 1, 8, 8]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
            "dims": {"batch": {"min": 1, "opt": 8, "max": 64}},
        },
        "toolchain": {
            "python": "3.11.9", "edgekit": "0.1.0", "edgekit_runtime": "0.1.0", "torch": "2.13.0",
            "onnx": "1.23.2", "onnxruntime": "1.31.0", "onnxscript": "0.5.0", "numpy": "2.4.6", "optimum": None,
        },
        "export": {
            "exporter": "dynamo", "opset": 18, "seconds": 3.42, "fallback_reason": None,
            "parity": {
                "max_abs_diff": 3.1e-6, "worst_output": "logits", "cosine_min": 0.99999994,
                "atol": 1e-4, "rtol": 1e-3, "min_cosine": 0.9999,
                "shapes": [_comparison(point, batch, kind, diff, cosine) for point, batch, kind, diff, cosine in [
                    ("min", 1, "sample", 1.2e-6, 0.99999997), ("opt", 8, "sample", 2.4e-6, 0.99999995),
                    ("max", 64, "sample", 3.1e-6, 0.99999994), ("opt", 8, "random", 2.2e-6, 0.99999996),
                ]],
                "passed": True,
            },
        },
        "accuracy": {
            "metric": "top1", "output": "logits", "reference": 0.9833, "value": 0.9816,
            "budget": {"max_drop": 0.01, "min_value": 0.95, "max_value": None},
            "drop": 0.0017, "passed": True, "samples": 540, "cosine_min": None, "reference_source": "pytorch-fp32",
        },
        "benchmark": {
            "host": {"machine": "x86_64", "cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "os": "Linux 6.1", "python": "3.11.9"},
            "batch": 8, "shape": {"batch": 8}, "warmup": 10, "iterations": 200,
            "p50_ms": 1.8412, "p90_ms": 2.41, "p99_ms": 2.93, "mean_ms": 1.87, "min_ms": 0.88, "max_ms": 3.4,
            "throughput_per_s": 4345.2, "peak_rss_mb": 312.8, "threads": 2, "providers": ["CPUExecutionProvider"],
        },
        "golden": {
            "batches": [
                {"inputs": "golden/inputs_000.npz", "outputs": "golden/outputs_000.npz"},
                {"inputs": "golden/inputs_001.npz", "outputs": "golden/outputs_001.npz"},
            ],
            "atol": 1e-4, "rtol": 1e-3, "min_cosine": 0.9999,
        },
        "stages": [
            {"name": "load", "seconds": 0.21}, {"name": "export", "seconds": 3.42},
            {"name": "parity", "seconds": 0.63}, {"name": "evaluate", "seconds": 1.12},
            {"name": "benchmark", "seconds": 1.95}, {"name": "bundle", "seconds": 0.08},
        ],
    }


def latency_samples_ms(count: int = 200) -> list[float]:
    rng = np.random.default_rng(7)
    return [float(v) for v in 0.8 + rng.gamma(6.0, 0.18, count)]


class _Structure(HTMLParser):
    """Collects tags and attributes and checks that every non-void element is closed in order."""

    VOID = {"meta", "br", "img", "input", "link", "hr", "col", "source", "wbr"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(page: str) -> _Structure:
    parser = _Structure()
    parser.feed(page)
    parser.close()
    assert parser.errors == []
    assert parser.stack == [], f"unclosed elements: {parser.stack}"
    return parser


def _visible_text(parser: _Structure) -> str:
    return re.sub(r"\s+", " ", " ".join(parser.text))


def _assert_self_contained(parser: _Structure) -> None:
    names = [tag for tag, _ in parser.tags]
    assert "script" not in names and "link" not in names and "iframe" not in names
    for tag, attrs in parser.tags:
        for key in ("src", "href", "xlink:href"):
            value = attrs.get(key)
            assert value is None or value.startswith(("#", "data:")), f"<{tag} {key}={value!r}> is an external asset"


# ---------------------------------------------------------------- rendering


def test_full_report_has_plots_numbers_and_no_external_assets(tiny_model_path: Path) -> None:
    page = render_report(realistic_manifest(), latency_samples_ms(), tiny_model_path)
    parser = _parse(page)
    _assert_self_contained(parser)
    text = _visible_text(parser)
    plots = [attrs.get("aria-label", "") for tag, attrs in parser.tags if tag == "svg"]
    assert len(plots) == 4
    assert any("latency" in p for p in plots) and any("pipeline stage" in p for p in plots)
    assert any("op type" in p for p in plots) and any("atol" in p for p in plots)
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "element ids must be unique across the inline plots"
    assert "1.84 ms / 2.93 ms" in text  # p50 / p99 card
    assert all(f"{name} {value} ms" in page for name, value in [("p50", 1.84), ("p90", 2.41), ("p99", 2.93)])
    assert "3.10e-06" in text and "atol 1.00e-04" in text  # parity max abs diff vs atol
    assert "0.9816" in text and "reference 0.9833" in text and "drop \u2264 0.01, value \u2265 0.95" in text
    assert "4,345 /s" in text and "328 MB" in text and "2.41 MB" in text  # peak RSS 312.8 MiB = 328 MB
    assert text.count("PASSED") == 2 + 2 + 4  # header and section badges (parity, accuracy), four comparisons
    assert "opt: batch=8" in text and "max: batch=64" in text and "random" in text
    assert "nodes optimized 9" in text and "examples.digits:make_cnn" in text
    assert "on Intel(R) Xeon(R) Processor, 2 cores" in text
    assert "Intel(R) Xeon(R) Processor (x86_64), 2 cores, Linux 6.1, Python 3.11.9" in text
    assert "1 - 6.0e-08" in text  # min cosine 0.99999994, told apart from 1
    assert "fp32 is supported by onnxruntime on this target." in text
    assert "Nodes per op type (4 in all)" in text and "MatMul" in text
    assert len(page.encode()) < 1_000_000


def test_malicious_values_are_escaped(tiny_model_path: Path) -> None:
    manifest = realistic_manifest()
    manifest["name"] = SCRIPT
    manifest["target"]["display_name"] = SCRIPT
    manifest["stages"].append({"name": SCRIPT, "seconds": 0.5})
    manifest["toolchain"]["torch"] = SCRIPT
    page = render_report(manifest, latency_samples_ms(), tiny_model_path)
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(" in page
    parser = _parse(page)
    _assert_self_contained(parser)
    assert SCRIPT in _visible_text(parser), "shown as text, not run"


def test_onnx_source_without_accuracy_renders_na(tiny_model_path: Path) -> None:
    manifest = realistic_manifest()
    manifest["export"] = {"exporter": "none", "opset": 18, "seconds": 0.0, "parity": None}
    manifest["accuracy"] = None
    page = render_report(manifest, None, tiny_model_path)
    parser = _parse(page)
    text = _visible_text(parser)
    assert "Export parity n/a" in text and "Accuracy n/a" in text
    assert "the model came as an ONNX file, so export parity was not checked" in text
    assert "The recipe has no evaluation, so accuracy was not measured." in text
    assert "No per-iteration latencies were recorded" in text
    assert "1.84 ms" in text, "benchmark numbers still shown without samples"
    assert len([t for t, _ in parser.tags if t == "svg"]) == 2  # stages and model size


def test_failed_parity_is_flagged() -> None:
    manifest = realistic_manifest()
    parity = manifest["export"]["parity"]
    parity["passed"] = False
    parity["shapes"][2].update(max_abs_diff=2.5e-3, within_tolerance=False)  # over atol
    parity["shapes"][3].update(cosine_min=0.99)  # within atol but under min_cosine 0.9999
    manifest["stages"] = []
    text = _visible_text(_parse(render_report(manifest, None, None)))
    assert "Export parity FAILED" in text and "2.50e-03" in text and "0.99 FAILED" in text
    assert text.count("FAILED") == 2 + 2  # header and section badge, two comparisons


def test_parity_entries_with_input_shapes_and_own_verdict() -> None:
    manifest = realistic_manifest()
    manifest["export"]["parity"]["shapes"] = [
        {"point": "max", "inputs": {"pixels": [64, 1, 8, 8]}, "max_abs_diff": 4e-5, "passed": False},
        {"max_abs_diff": 0.0},
    ]
    manifest["stages"] = []
    page = render_report(manifest, None, None)
    text = _visible_text(_parse(page))
    assert "max: pixels [64, 1, 8, 8]" in text and "shape 2" in text
    assert "0 (exact)" in page, "a zero difference is drawn, labelled exact"


@pytest.mark.parametrize(
    "damage",
    [
        lambda m: m.clear(),
        lambda m: m.update(benchmark="oops", stages=[1, "x", {"name": "y"}], io=None, target=[], files=None),
        lambda m: m.update(export={"parity": {"shapes": "nope", "max_abs_diff": "big"}}, accuracy={"budget": 3}),
        lambda m: m["benchmark"].update(p50_ms=float("nan"), throughput_per_s=None, peak_rss_mb=True),
        lambda m: m["target"].update(power_modes=[1], peak_throughput="x", software=3, backends="onnxruntime", gpu="big"),
        lambda m: m.update(quantization={"auto": {"candidates": None}, "plan": ["x"], "calibration": "minmax"}, precision_decision="fp16"),
        lambda m: m.update(quantization={"auto": {"candidates": [None, 3], "kept_in_higher_precision": ["fc"]},
                                         "plan": {"excluded": ["conv1"], "notes": "kept conv1"}},
                           prune={"layers": [None, {"name": "conv2", "action": "pruned"}], "notes": None}),
    ],
    ids=["empty", "wrong-types", "odd-parity", "nan-and-bool", "odd-target", "null-precision-fields", "odd-precision-rows"],
)
def test_damaged_manifests_render_without_crashing(damage: Any) -> None:
    manifest = realistic_manifest()
    damage(manifest)
    page = render_report(manifest, [], None)
    text = _visible_text(_parse(page))
    assert "n/a" in text
    assert "No model file was given to the report" in text
    if manifest.get("prune"):  # a note given as one string is one note, not one per character; node lists are names
        assert '<p class="note">kept conv1</p>' in page and '<p class="note">k</p>' not in page
        assert '<td class="mono">conv1</td><td>n/a</td>' in page and '<td class="mono">fc</td>' in page and "conv2" in text


def test_unreadable_model_file_becomes_a_note(tmp_path: Path) -> None:
    broken = tmp_path / "model.onnx"
    broken.write_bytes(b"not onnx")
    manifest = realistic_manifest()
    manifest["stages"] = manifest["export"] = None
    text = _visible_text(_parse(render_report(manifest, None, broken)))
    assert "Could not read the model for its statistics" in text and "not a readable ONNX model" in text


def test_write_report_writes_report_html(tmp_path: Path, external_model_path: Path) -> None:
    path = write_report(tmp_path, realistic_manifest(), latency_samples_ms(50), external_model_path)
    assert path == tmp_path / "report.html"
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "digits-cnn-x86-64-cpu-fp32" in page


def test_write_report_hashes_bundle_files_when_manifest_has_none(tmp_path: Path) -> None:
    (tmp_path / "golden").mkdir()
    (tmp_path / "golden" / "inputs_000.npz").write_bytes(b"abc")
    (tmp_path / "manifest.json").write_text("{}")
    manifest = realistic_manifest()
    del manifest["files"]
    page = write_report(tmp_path, manifest, np.asarray(latency_samples_ms(30)), None).read_text(encoding="utf-8")
    assert "Latency per iteration (30 iterations)" in page, "a NumPy array of samples works as well as a list"
    abc_sha256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert f'<td class="mono">golden/inputs_000.npz</td><td class="hash">{abc_sha256}</td>' in page
    assert "manifest.json</td>" not in page and "Hashed when this report was written" in page


def test_write_report_into_missing_directory_is_a_bundle_error(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"missing: bundle directory does not exist, cannot write report\.html"):
        write_report(tmp_path / "missing", realistic_manifest(), None, None)


# ---------------------------------------------------------------- plots


def test_size_plot_folds_the_tail_into_other() -> None:
    sizes = {f"Op{i}": 1000 * (20 - i) for i in range(15)}
    svg = plots.size_by_op_type_svg(sizes, top=5)
    assert svg is not None and svg.startswith("<svg ")
    assert "other (11 op types)" in svg and "Op3" in svg and "Op4" not in svg
    assert "total 195 KB" in svg


def test_dollar_signs_in_names_stay_literal() -> None:
    svg = plots.stage_times_svg([("cost $x$ and $y", 1.5)])
    assert svg is not None and "cost $x$ and $y" in svg


def test_plots_without_data_are_none() -> None:
    assert plots.latency_histogram_svg([float("nan")]) is None
    assert plots.stage_times_svg([]) is None
    assert plots.size_by_op_type_svg({"unused": 0}) is None
    assert plots.parity_svg([], 1e-4) is None


def test_latency_outliers_are_counted_not_drawn() -> None:
    samples = [1.0 + 0.01 * (i % 50) for i in range(500)] + [250.0, 400.0]
    svg = plots.latency_histogram_svg(samples)
    assert svg is not None
    assert "(502 iterations)" in svg and "2 slower than 2.98 ms not shown (max 400 ms)" in svg
    assert "p50 1.25 ms" in svg


def test_typed_field_tensors_are_measured_in_dense_bytes(tmp_path: Path) -> None:
    """Initializers stored in float_data/int32_data/string_data (not raw_data) count their dense size."""
    tensors = [
        helper.make_tensor("half", TensorProto.FLOAT16, [3, 4], np.ones(12, dtype=np.float16), raw=False),  # 24 B
        helper.make_tensor("nibbles", TensorProto.INT4, [5], [1, -2, 3, -4, 5], raw=False),  # 3 B packed
        helper.make_tensor("words", TensorProto.STRING, [2], [b"ab", b"cde"], raw=False),  # 5 B
    ]
    assert not any(t.HasField("raw_data") for t in tensors)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "typed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=tensors,
    )
    path = tmp_path / "typed.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)
    assert model_size_by_op_type(path) == {"unused": 24 + 3 + 5}


def test_precision_section_shows_plan_kept_nodes_candidates_and_pruning():
    from edgekit.report.html import render_report

    manifest = {
        "name": "x", "precision": "int8",
        "precision_decision": {"requested": "auto", "used": "int8", "refused_because": None, "policy": "auto: int8-static"},
        "quantization": {
            "plan": {"activation_type": "uint8", "weight_type": "int8", "per_channel": True, "calibrator": "minmax",
                     "excluded": {"layer.0/ffn.down": "sensitivity rank 1: cosine 0.95 when quantized"}, "notes": ["uint8 is fused"]},
            "calibration": {"calibrator": "minmax", "tensors": 12, "from_cache": False},
            "auto": {"candidates": [{"name": "int8-static", "status": "chosen", "latency_ratio": 0.61, "value": 0.993, "cosine_min": 0.98, "detail": ""}],
                     "kept_in_higher_precision": {}, "notes": []},
        },
        "prune": {"method": "channel", "target_sparsity": 0.5, "achieved_sparsity": 0.75, "params_before": 100, "params_after": 25,
                  "sparse_2_4": False, "fine_tune": {"callable": "f"}, "notes": ["unstructured sparsity does not speed up dense kernels"],
                  "layers": [{"name": "conv1", "action": "pruned", "weight_shape_before": [32, 1, 3, 3], "weight_shape_after": [16, 1, 3, 3], "sparsity": 0.5}]},
    }
    page = render_report(manifest, None, None)
    for text in ("Precision and pruning", "layer.0/ffn.down", "sensitivity rank 1", "int8-static", "0.61", "Pruning", "conv1", "dense kernels"):
        assert text in page, text
    assert "weights this pass zeroed" not in page  # channel pruning removes channels: no such count
    manifest["prune"].update(method="magnitude", newly_zeroed=0)
    assert '<th scope="row">weights this pass zeroed</th><td>0</td>' in render_report(manifest, None, None)


def test_the_estimate_section_shows_the_estimate_it_is_given_and_the_report_makes_none(tiny_model_path: Path) -> None:
    """The pipeline passes the estimate in as data (issue 33): a Jetson manifest without one has no section."""
    from edgekit.estimate import estimate
    from edgekit.target import get_target

    target = get_target("jetson-orin-nano-8gb")
    manifest = realistic_manifest()
    manifest["target"] = target.to_json()
    assert '<section id="estimate">' not in render_report(manifest, None, tiny_model_path)
    given = estimate(tiny_model_path, target, dims={"batch": 4}, batch=4)
    page = render_report(manifest, None, tiny_model_path, estimate=given)
    section = page[page.index('<section id="estimate">'):page.index('<section id="device">')]
    assert f"{given.p50_ms:.3f} ms" in section and f"{given.target} at {given.power_mode}" in section
    assert "Estimated time per node class" in section and "<svg" in section
