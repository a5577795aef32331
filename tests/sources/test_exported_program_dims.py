"""A .pt2 saved with static shapes, used with a recipe whose dim takes several sizes: a SourceError naming the
fixed axis and the recipe's range before export (before: torch's generic constraint error at export)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgekit import pipeline
from edgekit.errors import SourceError

MODULE = "tests.sources.test_exported_program_dims"


def batches() -> list[dict[str, np.ndarray]]:
    return [{"x": np.ones((2, 4), np.float32)}]


def _recipe(tmp_path, dynamic: bool):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).eval()
    shapes = {"input": {0: torch.export.Dim("batch", min=1, max=8)}} if dynamic else None
    torch.export.save(torch.export.export(model, (torch.ones(2, 4),), dynamic_shapes=shapes), str(tmp_path / "m.pt2"))
    path = tmp_path / "recipe.yaml"
    path.write_text("name: pt2\nmodel: {kind: exported_program, path: m.pt2}\ninputs:\n  - {name: x, dtype: float32, shape: [batch, 4]}\n"
                    f"outputs: [y]\ndims: {{batch: {{min: 1, opt: 2, max: 8}}}}\ndata:\n  samples: {{callable: \"{MODULE}:batches\"}}\n")
    return pipeline.stage_load(path, "x86-64-cpu", "fp32", tmp_path / "out", True, None, True, True)


def test_a_static_program_with_a_dynamic_recipe_dim_is_named(tmp_path):
    state = _recipe(tmp_path, dynamic=False)
    state.workdir = tmp_path
    pipeline.stage_source(state)
    with pytest.raises(SourceError, match=r"was exported with input 'x' axis 0 fixed at 2, but the recipe's dim 'batch' ranges 1\.\.8") as info:
        pipeline.stage_export(state)
    assert "dynamic_shapes" in info.value.hint and "dims.batch at 2" in info.value.hint


def test_a_dynamic_program_exports(tmp_path):
    state = _recipe(tmp_path, dynamic=True)
    state.workdir = tmp_path
    pipeline.stage_source(state)
    pipeline.stage_export(state)
    assert state.signature_dict["outputs"][0]["shape"] == ["batch", 3]
