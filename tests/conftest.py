"""Shared fixtures: tiny recipes that build in seconds, written into tmp_path."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Test recipes are written to tmp_path and name callables in tests/ (tests.fixtures...): trust that
# folder the way a user would (edgekit.code_trust), for this process and the CLIs it starts.
os.environ["EDGEKIT_TRUSTED_CODE_DIRS"] = os.pathsep.join(p for p in (os.environ.get("EDGEKIT_TRUSTED_CODE_DIRS"), str(REPO / "tests")) if p)

TINY_RECIPE = """\
name: tiny
model:
  kind: factory
  factory: tests.fixtures.tiny_models:{factory}
inputs:
  - name: image
    dtype: float32
    shape: [batch, 1, 4, 4]
outputs: [logits]
dims:
  batch: {{min: 1, opt: 4, max: 8}}
data:
  samples: {{callable: "tests.fixtures.tiny_models:tiny_batches"}}
  evaluation: {{callable: "tests.fixtures.tiny_models:tiny_batches", kwargs: {{labels: true}}}}
evaluation:
  metric: top1
  budget: {{max_drop: 0.0}}
build:
  benchmark: {{warmup: 1, iterations: 5}}
"""


@pytest.fixture
def tiny_recipe(tmp_path: Path):
    """``tiny_recipe(factory="tiny_net", text=None) -> Path`` of a recipe file in tmp_path."""

    def write(factory: str = "tiny_net", text: str | None = None, name: str = "tiny.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text) if text is not None else TINY_RECIPE.format(factory=factory))
        return path

    return write
