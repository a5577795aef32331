"""Models whose outputs are not a flat tuple in the recipe's order, and dims of one size, through the real
pipeline (torch exporters, ONNX Runtime, parity): a dict in another key order than the recipe names its outputs
(before: exported under swapped names, failing parity as if the model were wrong), a dict without a name the
recipe gives (before: KeyError), nested tuples (before: AttributeError), and a dim with min == max under the
dynamo exporter (before: torch.export refused Dim(min=2, max=2))."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

from edgekit.errors import SourceError
from edgekit.pipeline import build

MODELS = '''
import numpy as np
import torch
from torch import nn


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 2)

    def forward(self, x):
        return {"a": self.a(x), "b": self.b(x)}


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = nn.Linear(4, 3)

    def forward(self, x):
        y = self.l1(x)
        return (y, y * 2), y + 1


class MaskInf(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1 = nn.Linear(4, 3)

    def forward(self, x):  # a masked logit: -inf in PyTorch and ONNX Runtime alike
        return self.l1(x).masked_fill(torch.arange(3) == 2, float("-inf"))


def dict_out():
    return DictOut()


def mask_inf():
    return MaskInf()


def nested():
    return Nested()


def samples():
    return [{"x": np.random.default_rng(0).random((2, 4)).astype("float32")}]
'''


def _recipe(tmp_path: Path, factory: str, outputs: list[str], dims: str = "{min: 1, opt: 2, max: 8}", exporter: str = "auto") -> Path:
    module = f"outs_models_{uuid.uuid4().hex[:12]}"  # one per recipe: a module name is imported once per process
    (tmp_path / f"{module}.py").write_text(MODELS)
    path = tmp_path / f"{module}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: outs
        model: {{kind: factory, factory: "{module}:{factory}"}}
        inputs:
          - {{name: x, dtype: float32, shape: [batch, 4]}}
        outputs: {json.dumps(outputs)}
        dims:
          batch: {dims}
        data:
          samples: {{callable: "{module}:samples"}}
        build:
          benchmark: {{warmup: 1, iterations: 2}}
        export: {{exporter: {exporter}}}
        """))
    return path


def test_dict_outputs_are_exported_under_the_names_the_recipe_gives_them(tmp_path: Path) -> None:
    result = build(_recipe(tmp_path, "dict_out", ["b", "a"]), "x86-64-cpu", out=tmp_path / "bundle")
    outputs = result.manifest["io"]["outputs"]
    assert [(o["name"], o["shape"][-1]) for o in outputs] == [("b", 2), ("a", 3)]  # b has 2 features, a has 3
    assert result.manifest["export"]["parity"]["passed"] is True
    assert (result.manifest["export"]["exporter"], result.manifest["export"]["fallback_reason"]) == ("dynamo", None)


def test_a_dict_without_a_name_the_recipe_gives_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"outputs: the model returns a dict with keys \['a', 'b'\], which has no 'p'"):
        build(_recipe(tmp_path, "dict_out", ["p", "q"]), "x86-64-cpu", out=tmp_path / "bundle")


def test_nested_tuples_are_flattened_in_order(tmp_path: Path) -> None:
    result = build(_recipe(tmp_path, "nested", ["y", "y2", "y1"]), "x86-64-cpu", out=tmp_path / "bundle")
    assert result.manifest["export"]["parity"]["passed"] is True
    with pytest.raises(SourceError, match=r"the model returns 3 output tensors \(nested ones counted\), the recipe names 2"):
        build(_recipe(tmp_path, "nested", ["y", "y2"]), "x86-64-cpu", out=tmp_path / "other")


def test_a_dim_of_one_size_exports_with_dynamo(tmp_path: Path) -> None:
    result = build(_recipe(tmp_path, "dict_out", ["a", "b"], dims="{min: 2, opt: 2, max: 2}", exporter="dynamo"),
                   "x86-64-cpu", out=tmp_path / "bundle")  # fmt: skip
    assert result.manifest["export"]["exporter"] == "dynamo" and result.manifest["export"]["fallback_reason"] is None
    assert result.manifest["io"]["dims"]["batch"] == {"min": 2, "opt": 2, "max": 2}
    assert np.isclose(result.manifest["export"]["parity"]["cosine_min"], 1.0)


def test_a_masked_logit_of_minus_infinity_in_both_models_passes_parity_and_the_self_check(tmp_path: Path) -> None:
    """Before: parity crashed (a NaN cosine: max() of nothing), then the golden check took -inf - -inf for an error."""
    from edgekit_runtime.golden import compare_output

    result = build(_recipe(tmp_path, "mask_inf", ["y"]), "x86-64-cpu", out=tmp_path / "bundle")
    assert result.manifest["export"]["parity"]["passed"] is True
    assert np.isclose(result.manifest["export"]["parity"]["cosine_min"], 1.0)
    same = np.array([[0.5, -np.inf], [1.0, -np.inf]])
    assert compare_output("y", same, same.copy(), atol=1e-6, rtol=0.0, min_cosine=0.99).passed
    assert not compare_output("y", same, np.array([[0.5, 3.0], [1.0, -np.inf]]), atol=1e-6, rtol=0.0, min_cosine=0.99).passed
    assert not compare_output("y", same, np.array([[0.5, np.inf], [1.0, -np.inf]]), atol=1e-6, rtol=0.0, min_cosine=0.99).passed


def test_golden_tolerances_are_fitted_on_the_finite_values_of_a_masked_output() -> None:
    """A masked logit's -inf in the reference and the build alike: the tolerance comes from the finite values
    (before: nan_to_num took -inf for 1.8e308, and a device-applied tolerance became about 1.8e306, accepting any)."""
    from edgekit.bundle.golden import derive_tolerances
    from edgekit.recipe import ParitySpec

    expected = np.array([[1.0, -np.inf, 2.0], [0.5, -np.inf, 3.0]], np.float32)
    built = expected + np.array([[1e-3, 0, -1e-3], [2e-3, 0, 0]], np.float32)
    tolerances, measured = derive_tolerances([{"logits": expected}], [{"logits": built}], ParitySpec(), device_applied=(0.01, 0.99))
    assert measured["logits"]["max_abs_reference"] == 3.0 and tolerances.outputs["logits"].atol < 0.1


def test_a_dict_output_holding_a_tuple_is_a_clear_error() -> None:
    import torch

    from edgekit.export.flat_outputs import flat_outputs
    from edgekit.recipe import Recipe

    recipe = Recipe.model_validate({"name": "d", "model": {"kind": "factory", "factory": "m:f"},
                                    "inputs": [{"name": "x", "dtype": "float32", "shape": [2, 4]}], "outputs": ["a", "b"],
                                    "data": {"samples": {"callable": "m:s"}}})  # fmt: skip
    with pytest.raises(SourceError, match="the model returns a tuple among its outputs; every output must be a tensor"):
        flat_outputs({"a": torch.zeros(1), "b": (torch.zeros(1), torch.zeros(1))}, recipe)  # before: AttributeError later
