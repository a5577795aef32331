"""Every model source in the registry loads a real model and builds a bundle with parity checked."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from edgekit.errors import SourceError
from edgekit.pipeline import build
from edgekit.sources import SOURCES
from tests.conftest import TINY_RECIPE
from tests.fixtures.tiny_models import TinyNet

FACTORY_LINES = "kind: factory\n  factory: tests.fixtures.tiny_models:tiny_net"


def _recipe_for(tiny_recipe, model_lines: str) -> Path:
    return tiny_recipe(text=TINY_RECIPE.format(factory="tiny_net").replace(FACTORY_LINES, model_lines))


def _torchscript(tmp_path: Path) -> str:
    torch.jit.save(torch.jit.script(TinyNet().eval()), str(tmp_path / "tiny.pt"))
    return "kind: torchscript\n  path: tiny.pt"


def _exported_program(tmp_path: Path) -> str:
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(TinyNet().eval(), (torch.rand(4, 1, 4, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "tiny.pt2"))
    return "kind: exported_program\n  path: tiny.pt2"


def _onnx_file(tmp_path: Path) -> str:
    torch.onnx.export(TinyNet().eval(), (torch.rand(4, 1, 4, 4),), str(tmp_path / "tiny.onnx"), dynamo=False,
                      input_names=["image"], output_names=["logits"], dynamic_axes={"image": {0: "batch"}})
    return "kind: onnx\n  path: tiny.onnx"


def _factory(tmp_path: Path) -> str:
    return FACTORY_LINES


FILE_SOURCES = {"factory": _factory, "torchscript": _torchscript, "exported_program": _exported_program, "onnx": _onnx_file}


@pytest.mark.parametrize("kind", sorted(FILE_SOURCES))
def test_source_builds_a_bundle(kind, tiny_recipe, tmp_path):
    lines = FILE_SOURCES[kind](tmp_path)
    result = build(_recipe_for(tiny_recipe, lines), "x86-64-cpu", out=tmp_path / "bundle")
    manifest = result.manifest
    assert manifest["model"]["source"]["kind"] == kind
    if kind == "onnx":
        assert manifest["export"]["exporter"] == "none"
        assert manifest["export"]["parity"]["passed"] is None
        assert manifest["accuracy"]["reference_source"] == "onnxruntime-fp32"
    else:
        assert manifest["export"]["parity"]["passed"] is True
        assert manifest["accuracy"]["reference_source"] == "pytorch-fp32"
    assert manifest["accuracy"]["value"] == manifest["accuracy"]["reference"]


def test_every_registered_source_is_tested():
    assert set(SOURCES) == set(FILE_SOURCES) | {"huggingface"}


def test_torchscript_file_that_is_not_torchscript(tiny_recipe, tmp_path):
    (tmp_path / "tiny.pt").write_bytes(b"garbage")
    with pytest.raises(SourceError, match=r"tiny\.pt is not a loadable TorchScript file"):
        build(_recipe_for(tiny_recipe, "kind: torchscript\n  path: tiny.pt"), "x86-64-cpu", out=tmp_path / "b")


def test_missing_model_file(tiny_recipe, tmp_path):
    with pytest.raises(SourceError, match=r"model\.path: file not found: .*missing\.pt2(?s:.*)relative to the recipe"):
        build(_recipe_for(tiny_recipe, "kind: exported_program\n  path: missing.pt2"), "x86-64-cpu", out=tmp_path / "b")


HF_RECIPE = """\
name: tiny-bert
model:
  kind: huggingface
  path: bert
  task: feature-extraction
inputs:
  - {name: input_ids, dtype: int64, shape: [batch, seq], low: 0, high: 100}
  - {name: attention_mask, dtype: int64, shape: [batch, seq], low: 1, high: 2}
  - {name: token_type_ids, dtype: int64, shape: [batch, seq], low: 0, high: 1}
outputs: [last_hidden_state]
dims:
  batch: {min: 1, opt: 2, max: 4}
  seq: {min: 4, opt: 8, max: 16}
data:
  samples: {callable: "tests.sources.test_sources:bert_batches"}
evaluation:
  metric: cosine
  budget: {min_value: 0.999}
export:
  parity: {atol: 0.0001}
build:
  benchmark: {warmup: 1, iterations: 3}
"""


def bert_batches() -> list:
    import numpy as np

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, size=(2, 8)).astype(np.int64)
    return [{"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}]


def test_huggingface_directory_through_optimum(tiny_recipe, tmp_path):
    pytest.importorskip("optimum.exporters.onnx", reason="the hf extra (optimum-onnx) is not installed")
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    BertModel(config).eval().save_pretrained(tmp_path / "bert")
    recipe = tiny_recipe(text=HF_RECIPE, name="bert.yaml")
    result = build(recipe, "x86-64-cpu", out=tmp_path / "bundle")
    manifest = result.manifest
    assert manifest["export"]["exporter"] == "optimum"
    assert manifest["export"]["parity"]["passed"] is True
    assert manifest["model"]["source"]["kind"] == "huggingface"
    assert manifest["io"]["outputs"][0]["name"] == "last_hidden_state"
    # Optimum's own dim names (batch_size, sequence_length) renamed to the recipe's, so io.outputs names dims io.dims
    # has (before: ['batch_size', 'sequence_length', 32]); the opset recorded is the one the graph has
    assert manifest["io"]["outputs"][0]["shape"] == ["batch", "seq", 32]
    assert manifest["export"]["opset"] == manifest["model"]["opset"]
    from edgekit.target import get_target

    assert manifest["model"]["opset"] == get_target("x86-64-cpu").build.opset  # the target's (before: Optimum's default)


def test_huggingface_directory_without_config(tiny_recipe, tmp_path):
    (tmp_path / "bert").mkdir()
    with pytest.raises(SourceError, match=r"has no config\.json: not a Hugging Face model directory"):
        build(tiny_recipe(text=HF_RECIPE, name="bert.yaml"), "x86-64-cpu", out=tmp_path / "b")


class _TouchOnLoad:
    """Unpickling this creates a file: what a hostile pickle inside a model file could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (str(self.marker), "w"))


def _with_a_pickled_weight(path: Path, marker: Path) -> None:
    """Rewrite the .pt2 at ``path``: its first weight marked ``use_pickle`` and replaced by a pickle."""
    import json
    import pickle
    import zipfile

    entries = {}
    with zipfile.ZipFile(path) as archive:
        for name in archive.namelist():
            entries[name] = archive.read(name)
    config_name = next(name for name in entries if name.endswith("model_weights_config.json"))
    config = json.loads(entries[config_name])
    first = next(iter(config["config"].values()))
    first["use_pickle"] = True
    entries[config_name] = json.dumps(config).encode()
    entries[next(name for name in entries if name.endswith("/weights/" + first["path_name"]))] = pickle.dumps(_TouchOnLoad(marker))
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


def test_an_exported_program_that_would_unpickle_is_refused_unless_trusted(tiny_recipe, tmp_path):
    """torch.export.load unpickles (weights_only=False) weights marked use_pickle: loading such a .pt2 ran its code
    before edgekit said anything (a model file is no code to its user). Now it is refused before loading."""
    lines = _exported_program(tmp_path)
    marker = tmp_path / "ran"
    _with_a_pickled_weight(tmp_path / "tiny.pt2", marker)
    recipe = _recipe_for(tiny_recipe, lines)
    with pytest.raises(SourceError, match=r"tiny\.pt2 holds parts torch\.export\.load unpickles or loads as native code, either of which can run any code: "
                                          r".*model_weights_config\.json: conv\.weight(?s:.*)--trust-code"):  # fmt: skip
        build(recipe, "x86-64-cpu", out=tmp_path / "bundle")
    assert not marker.exists()
    with pytest.raises(SourceError):  # trusted: loaded (the pickle ran), then refused as no torch.export program
        build(recipe, "x86-64-cpu", out=tmp_path / "bundle", trust_code=True)
    assert marker.exists()


def test_an_archive_of_the_older_layout_that_would_unpickle_is_refused_too(tiny_recipe, tmp_path):
    """torch.export.load still reads torch 2.7's layout (serialized_state_dict.pt, ...), and loads a member that
    weights_only refuses again with weights_only=False: every .pt member is checked, not only the newer layout's."""
    import io
    import zipfile

    from torch._export.serde.schema import SCHEMA_VERSION
    from torch._export.serde.serialize import serialize

    lines = _exported_program(tmp_path)
    marker = tmp_path / "ran"
    serialized = serialize(torch.export.load(str(tmp_path / "tiny.pt2")))
    state = io.BytesIO()
    torch.save({"weight": _TouchOnLoad(marker)}, state)
    with zipfile.ZipFile(tmp_path / "tiny.pt2", "w") as archive:
        archive.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
        archive.writestr("serialized_exported_program.json", serialized.exported_program)
        archive.writestr("serialized_state_dict.pt", state.getvalue())
        archive.writestr("serialized_constants.pt", serialized.constants)
        archive.writestr("serialized_example_inputs.pt", serialized.example_inputs)
    with pytest.raises(SourceError, match=r"holds parts torch\.export\.load unpickles.*serialized_state_dict\.pt \(not plain tensors\)"):
        build(_recipe_for(tiny_recipe, lines), "x86-64-cpu", out=tmp_path / "bundle")
    assert not marker.exists()


def _rewritten(path: Path, change: Callable[[dict[str, bytes], str], None]) -> None:
    """Rewrite the .pt2 at ``path`` with ``change(entries, top_folder)`` applied to its members."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    top = next(name for name in entries if name.endswith("/models/model.json")).split("/")[0]
    change(entries, top)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


def test_a_second_program_aotinductor_code_or_a_stray_member_in_a_pt2_is_refused(tiny_recipe, tmp_path):
    """torch.export.load loads every program of an archive (with its own weights config, which the scan read only for
    the program named 'model'), and dlopens every AOTInductor library in it: both ran code with no --trust-code."""
    import json
    import pickle

    lines = _exported_program(tmp_path)
    marker = tmp_path / "ran"
    recipe = _recipe_for(tiny_recipe, lines)

    def second_program(entries: dict[str, bytes], top: str) -> None:
        config = json.loads(entries[f"{top}/data/weights/model_weights_config.json"])
        for entry in config["config"].values():
            entry["use_pickle"], entry["path_name"] = True, "evil_weight_0"
        entries[f"{top}/models/evil.json"] = entries[f"{top}/models/model.json"]
        entries[f"{top}/data/weights/evil_weights_config.json"] = json.dumps(config).encode()
        entries[f"{top}/data/weights/evil_weight_0"] = pickle.dumps(_TouchOnLoad(marker))

    _rewritten(tmp_path / "tiny.pt2", second_program)
    with pytest.raises(SourceError, match=r"evil_weights_config\.json: conv\.weight(?s:.*)--trust-code"):
        build(recipe, "x86-64-cpu", out=tmp_path / "bundle")
    assert not marker.exists()

    _exported_program(tmp_path)
    _rewritten(tmp_path / "tiny.pt2", lambda entries, top: entries.update({f"{top}/data/aotinductor/model/model.so": b"\x7fELF"}))
    with pytest.raises(SourceError, match=r"data/aotinductor/model/model\.so \(native code, loaded and run by torch\.export\.load\)"):
        build(recipe, "x86-64-cpu", out=tmp_path / "bundle")

    _exported_program(tmp_path)
    _rewritten(tmp_path / "tiny.pt2", lambda entries, top: entries.update({f"{top}/custom/loader.py": b"import os"}))
    with pytest.raises(SourceError, match=r"custom/loader\.py \(not a part torch\.export\.save writes\)"):
        build(recipe, "x86-64-cpu", out=tmp_path / "bundle")


def test_a_pt2_member_that_decompresses_to_gigabytes_is_refused_without_reading_it(tmp_path):
    """The scan read every .pt member whole into memory: a 1.6 MB archive made it allocate 1.5 GB."""
    import zipfile

    from edgekit.sources.pt2_pickles import BOMB_BYTES, unpickled_parts

    path = tmp_path / "bomb.pt2"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive, archive.open("a/data/sample_inputs/model.pt", "w") as member:
        chunk = bytes(8 * 2**20)
        for _ in range(BOMB_BYTES // len(chunk) + 1):
            member.write(chunk)
    assert path.stat().st_size < BOMB_BYTES // 100
    (found,) = unpickled_parts(path)
    assert found.startswith("a/data/sample_inputs/model.pt (decompresses") and "not a part torch.export.save writes" in found


def test_a_pt2_that_is_no_zip_says_so_without_a_traceback(tiny_recipe, tmp_path):
    (tmp_path / "tiny.pt2").write_bytes(b"not a zip at all")
    with pytest.raises(SourceError, match=r"tiny\.pt2 is not a torch\.export program"):
        build(_recipe_for(tiny_recipe, "kind: exported_program\n  path: tiny.pt2"), "x86-64-cpu", out=tmp_path / "b")
