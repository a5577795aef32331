"""Fixtures for the TensorRT engine tests: real recipes, targets and tiny ONNX models in tmp_path."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from edgekit.recipe import Recipe, load_recipe
from edgekit.target import TargetProfile, get_target

#: Two inputs with two dynamic dims, like the MiniLM demo.
TEXT_RECIPE = """\
name: tiny-text
model: {kind: factory, factory: "tests.fixtures.tiny_models:tiny_net"}
inputs:
  - {name: input_ids, dtype: int64, shape: [batch, seq]}
  - {name: attention_mask, dtype: int64, shape: [batch, seq]}
outputs: [embedding]
dims:
  batch: {min: 1, opt: 8, max: 32}
  seq: {min: 16, opt: 128, max: 256}
data:
  samples: {callable: "tests.fixtures.tiny_models:tiny_batches"}
"""

STATIC_RECIPE = """\
name: tiny-static
model: {kind: factory, factory: "tests.fixtures.tiny_models:tiny_net"}
inputs:
  - {name: image, dtype: float32, shape: [1, 1, 4, 4]}
outputs: [logits]
data:
  samples: {callable: "tests.fixtures.tiny_models:tiny_batches"}
"""


@pytest.fixture
def write_recipe(tmp_path: Path) -> Callable[[str], Recipe]:
    def write(text: str, name: str = "recipe.yaml") -> Recipe:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return load_recipe(path)

    return write


@pytest.fixture
def image_recipe(tiny_recipe: Callable[..., Path]) -> Recipe:
    """The shared tiny recipe: image float32[batch, 1, 4, 4], batch 1..8 (opt 4)."""
    return load_recipe(tiny_recipe())


def with_tensorrt_major(target: TargetProfile, major: int | None) -> TargetProfile:
    """``target`` as if its software line shipped TensorRT ``major``."""
    return target.model_copy(update={"software": target.software.model_copy(update={"tensorrt_major": major})})


@pytest.fixture
def agx_orin() -> TargetProfile:
    return get_target("jetson-agx-orin-64gb")


@pytest.fixture
def orin_nano() -> TargetProfile:
    return get_target("jetson-orin-nano-8gb")


@pytest.fixture
def thor() -> TargetProfile:
    return get_target("jetson-agx-thor")


@pytest.fixture
def h100() -> TargetProfile:
    return get_target("nvidia-h100")
