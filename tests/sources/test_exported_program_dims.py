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


def test_the_dims_check_finds_inputs_by_name_when_the_recipe_lists_them_in_another_order() -> None:
    """forward(x, y) with x dynamic, the recipe listing [y, x]: inputs bind by name, so x is dynamic (before: the check
    paired the recipe's x with y's fixed size 2 and refused the build)."""
    from types import SimpleNamespace

    from edgekit.sources.torch_files import check_dynamic_dims

    class TwoInputs(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x.sum(1) + y.sum()

    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(TwoInputs(), (torch.ones(4, 3), torch.ones(2, 5)), dynamic_shapes={"x": {0: batch}, "y": None})
    dims = {"batch": SimpleNamespace(min=1, max=8), "n": SimpleNamespace(min=1, max=8)}
    inputs = [SimpleNamespace(name="y", shape=[2, 5]), SimpleNamespace(name="x", shape=["batch", 3])]
    check_dynamic_dims(program, SimpleNamespace(path="r.yaml", inputs=inputs, dims=dims), "m.pt2")  # no error
    inputs = [SimpleNamespace(name="y", shape=["n", 5]), SimpleNamespace(name="x", shape=["batch", 3])]
    with pytest.raises(SourceError, match=r"input 'y' axis 0 fixed at 2, but the recipe's dim 'n' ranges 1\.\.8"):
        check_dynamic_dims(program, SimpleNamespace(path="r.yaml", inputs=inputs, dims=dims), "m.pt2")
