"""Export fixes through the real stages (load, source, export, parity): recipe inputs bound to forward() by name,
the legacy fallback's tracer warnings and the dynamo exporter's real failure cause, the opset the file really
has, dynamo for the constant_args and Hugging Face wrappers (``*args`` keyed by name), bfloat16 inputs, and the
ONNX Runtime fp32 build of an export whose weights sit in an external ``.data`` file."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from edgekit import pipeline
from edgekit.errors import ExportError
from edgekit.export.input_binding import from_tensor, to_tensor
from edgekit.export.onnx_export import _dynamic_shapes_for
from edgekit.recipe import Recipe

MODULE = "tests.export.test_export_binding_and_fallback"


class IdsMask(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.e = torch.nn.Embedding(50, 8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return (self.e(input_ids) * attention_mask.unsqueeze(-1).float()).sum(1)


class DataDep(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x - 1


class MaskIds(IdsMask):
    """IdsMask under other parameter names (ids, mask)."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(ids, mask)


class UnusedSr(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.l = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, extra: torch.Tensor, sr: int = 8000) -> torch.Tensor:
        return self.l(x) * (sr / 16000) + extra[:, :3]


class Big(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.l, self.o = torch.nn.Linear(4, 512), torch.nn.Linear(512, 600)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(torch.relu(self.l(x)))


def ids_mask() -> torch.nn.Module:
    return IdsMask().eval()


def datadep() -> torch.nn.Module:
    return DataDep().eval()


def mask_ids() -> torch.nn.Module:
    return MaskIds().eval()


def unused_sr() -> torch.nn.Module:
    return UnusedSr().eval()


def big() -> torch.nn.Module:
    return Big().eval()


def im_batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"input_ids": rng.integers(2, 50, (2, 5)).astype(np.int64), "attention_mask": rng.integers(0, 2, (2, 5)).astype(np.int64)}]


def mask_batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"ids": rng.integers(0, 50, (2, 5)).astype(np.int64), "mask": rng.integers(0, 2, (2, 5)).astype(bool)}]


def pos_batches() -> list[dict[str, np.ndarray]]:
    return [{"x": np.abs(np.random.default_rng(0).standard_normal((2, 4))).astype(np.float32)}]


def two_batches() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((2, 4)).astype(np.float32), "extra": rng.standard_normal((2, 4)).astype(np.float32)}]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(textwrap.dedent(text).replace("MODULE", MODULE))
    return path


def _stages(tmp_path: Path, text: str, parity: bool = True) -> tuple[pipeline.BuildState, str | None]:
    state = pipeline.stage_load(_write(tmp_path, text), "x86-64-cpu", "fp32", tmp_path / "out", True, None, True, True)
    state.workdir = tmp_path / "work"
    state.workdir.mkdir()
    try:
        pipeline.stage_source(state)
        note = pipeline.stage_export(state)
        if parity:
            pipeline.stage_parity(state)
    finally:
        for runner in state.open_runners:
            runner.close()
    return state, note


ORDER = """\
    name: order
    model: {kind: factory, factory: "MODULE:ids_mask"}
    inputs:
      - {name: attention_mask, dtype: int64, shape: [batch, seq], low: 0, high: 2}
      - {name: input_ids, dtype: int64, shape: [batch, seq], low: 0, high: 50}
    outputs: [pooled]
    dims: {batch: {min: 1, opt: 2, max: 4}, seq: {min: 2, opt: 5, max: 8}}
    data:
      samples: {callable: "MODULE:im_batches"}
"""


def test_recipe_inputs_in_another_order_than_forward_are_bound_by_name(tmp_path):
    """[attention_mask, input_ids] for forward(input_ids, attention_mask): before, both the export and the reference
    fed the mask as the ids (parity passed on a wrong model); now each tensor goes to its namesake parameter."""
    state, _ = _stages(tmp_path, ORDER)
    assert state.export["exporter"] == "dynamo" and state.export["parity"]["passed"]
    batch = im_batches()[0]
    with torch.no_grad():
        truth = ids_mask()(input_ids=torch.from_numpy(batch["input_ids"]), attention_mask=torch.from_numpy(batch["attention_mask"])).numpy()
    session = ort.InferenceSession(str(state.fp32_path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["attention_mask", "input_ids"]
    np.testing.assert_allclose(session.run(None, batch)[0], truth, atol=1e-5)
    assert state.reference is not None
    np.testing.assert_allclose(state.reference(batch)["pooled"], truth, atol=1e-6)


CONSTANT_ARGS = """\
    name: unusedsr
    model: {kind: factory, factory: "MODULE:unused_sr", constant_args: {sr: 16000}}
    inputs:
      - {name: extra, dtype: float32, shape: [batch, 4]}
      - {name: x, dtype: float32, shape: [batch, 4]}
    outputs: [y]
    dims: {batch: {min: 1, opt: 2, max: 8}}
    data:
      samples: {callable: "MODULE:two_batches"}
"""


def test_constant_args_models_export_with_dynamo_and_bind_inputs_by_name(tmp_path):
    """The constant_args wrapper's forward(*tensors): its dynamic shapes are keyed by that name (before: "args",
    which torch.export refused, so dynamo never worked and the legacy fallback dropped the 'extra' input)."""
    state, _ = _stages(tmp_path, CONSTANT_ARGS)
    assert state.export["exporter"] == "dynamo" and state.export["fallback_reason"] is None
    assert [i["name"] for i in state.signature_dict["inputs"]] == ["extra", "x"]
    batch = two_batches()[0]
    with torch.no_grad():
        truth = unused_sr()(x=torch.from_numpy(batch["x"]), extra=torch.from_numpy(batch["extra"]), sr=16000).numpy()
    session = ort.InferenceSession(str(state.fp32_path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, batch)[0], truth, atol=1e-5)


def test_the_hugging_face_wrapper_gets_its_dynamic_shapes_under_its_varargs_name(tmp_path):
    from edgekit.sources.huggingface import _wrap

    recipe = Recipe.model_validate({"name": "hf", "model": {"kind": "factory", "factory": "m:f"},
                                    "inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["batch", 4]}],
                                    "outputs": ["last_hidden_state"], "dims": {"batch": {"min": 1, "opt": 2, "max": 8}},
                                    "data": {"samples": {"callable": "m:s"}}})  # fmt: skip
    shapes = _dynamic_shapes_for(_wrap(torch.nn.Identity(), ["input_ids"], ["last_hidden_state"]), recipe)
    assert list(shapes) == ["args"] and list(shapes["args"][0]) == [0]


DATADEP = """\
    name: datadep
    model: {kind: factory, factory: "MODULE:datadep"}
    inputs:
      - {name: x, dtype: float32, shape: [batch, 4]}
    outputs: [y]
    dims: {batch: {min: 1, opt: 2, max: 8}}
    data:
      samples: {callable: "MODULE:pos_batches"}
    export: {exporter: EXPORTER}
"""


def test_the_legacy_fallback_reports_the_branch_it_froze_and_the_dynamo_cause(tmp_path):
    """Before: the tracer's warning was silenced, and fallback_reason said only "Failed to export ... step 1/3"."""
    state, note = _stages(tmp_path, DATADEP.replace("EXPORTER", "auto"))
    assert state.export["exporter"] == "legacy"
    assert "data-dependent" in state.export["fallback_reason"]
    assert "step 1/3" not in state.export["fallback_reason"]
    assert any("Converting a tensor to a Python boolean" in w for w in state.export["warnings"])
    assert note is not None and note.startswith("legacy exporter warned (1, see manifest export.warnings)")


def test_a_dynamo_failure_names_its_real_cause(tmp_path):
    with pytest.raises(ExportError) as info:
        _stages(tmp_path, DATADEP.replace("EXPORTER", "dynamo"))
    message = str(info.value)
    assert "the model branches on a tensor's value (data-dependent control flow)" in message
    assert "Could not guard on data-dependent expression" in message
    assert "torch.where" in info.value.hint


OPSET13 = """\
    name: masko13
    model: {kind: factory, factory: "MODULE:mask_ids"}
    inputs:
      - {name: ids, dtype: int64, shape: [batch, seq], low: 0, high: 50}
      - {name: mask, dtype: bool, shape: [batch, seq]}
    outputs: [pooled]
    dims: {batch: {min: 1, opt: 2, max: 8}, seq: {min: 2, opt: 5, max: 16}}
    data:
      samples: {callable: "MODULE:mask_batches"}
    export: {opset: 13, exporter: EXPORTER}
"""


def _file_opset(path: Path) -> int:
    return max(o.version for o in onnx.load(str(path), load_external_data=False).opset_import if o.domain in ("", "ai.onnx"))


def test_an_opset_the_dynamo_exporter_cannot_write_falls_back_and_the_real_opset_is_recorded(tmp_path):
    """Before: dynamo wrote opset 18 for export.opset 13 and the manifest said 13."""
    state, _ = _stages(tmp_path, OPSET13.replace("EXPORTER", "auto"))
    assert _file_opset(state.fp32_path) == 13 == state.export["opset"]
    assert state.export["exporter"] == "legacy"
    assert state.export["fallback_reason"] == "dynamo: it wrote opset 18, above the requested opset 13"


def test_an_opset_the_chosen_dynamo_exporter_cannot_write_is_an_error(tmp_path):
    with pytest.raises(ExportError, match=r"the dynamo exporter wrote opset 18, above export\.opset 13") as info:
        _stages(tmp_path, OPSET13.replace("EXPORTER", "dynamo"), parity=False)
    assert "export.exporter: legacy" in info.value.hint


def bf_batches() -> list[dict[str, np.ndarray]]:
    import ml_dtypes

    return [{"x": np.random.default_rng(0).standard_normal((2, 4)).astype(ml_dtypes.bfloat16)}]


BF16 = """\
    name: bf
    model: {kind: factory, factory: "MODULE:datadep"}
    inputs:
      - {name: x, dtype: bfloat16, shape: [batch, 4]}
    outputs: [y]
    dims: {batch: {min: 1, opt: 2, max: 8}}
    data:
      samples: {callable: "MODULE:bf_batches"}
"""


def test_bfloat16_inputs_are_refused_by_name_and_converted_for_torch(tmp_path):
    """Before: a raw TypeError from torch.from_numpy (and, past it, ONNX Runtime's "Numpy_type 256" at parity)."""
    import ml_dtypes

    with pytest.raises(ExportError, match=r"inputs\.x: dtype bfloat16 cannot be fed to the exported graph") as info:
        _stages(tmp_path, BF16, parity=False)
    assert "declare 'x' as float32" in info.value.hint
    array = np.array([[1.5, -2.0]], dtype=ml_dtypes.bfloat16)
    tensor = to_tensor(array, Recipe.model_construct(path=Path("r.yaml")), "x")  # before: a raw TypeError
    assert tensor.dtype == torch.bfloat16 and tensor.float().tolist() == [[1.5, -2.0]]
    assert from_tensor(tensor).dtype == array.dtype and from_tensor(tensor).astype(np.float32).tolist() == [[1.5, -2.0]]


BIG = """\
    name: bigext
    model: {kind: factory, factory: "MODULE:big"}
    inputs:
      - {name: x, dtype: float32, shape: [batch, 4]}
    outputs: [y]
    dims: {batch: {min: 1, opt: 2, max: 4}}
    data:
      samples: {callable: "MODULE:pos_batches"}
    export: {external_data_mb: 1}
    build:
      benchmark: {warmup: 1, iterations: 2}
"""


def test_an_fp32_onnxruntime_build_of_an_export_with_external_data_keeps_its_data_file(tmp_path):
    """Before: ONNX Runtime's optimised model.onnx pointed at the staged .data, deleted after: the build failed."""
    result = pipeline.build(_write(tmp_path, BIG), "x86-64-cpu", "fp32", tmp_path / "bundle", force=True, trust_code=True)
    bundle = result.bundle_dir
    assert (bundle / "model.onnx.data").is_file() and not list(bundle.glob("*staged*"))
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["model"]["external_data"] == "model.onnx.data"
    assert "model.onnx.data" in manifest["files"]
    model = onnx.load(str(bundle / "model.onnx"), load_external_data=False)
    locations = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"model.onnx.data"}
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    x = pos_batches()[0]["x"]
    with torch.no_grad():
        np.testing.assert_allclose(session.run(None, {"x": x})[0], big()(torch.from_numpy(x)).numpy(), atol=1e-4)
