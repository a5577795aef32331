"""The ``auto`` search is backend-neutral (issue 33): its modules (candidate plans, pricing, judging, the search)
load no engine and nothing of ``edgekit.quantize.ort``, so another engine plugs in its candidates, builder and
judges without editing them. Checked by importing them in a fresh interpreter and reading ``sys.modules``."""

from __future__ import annotations

import json
import subprocess
import sys

SEARCH_MODULES = ("edgekit.quantize.auto", "edgekit.quantize.candidates", "edgekit.quantize.pricing", "edgekit.quantize.judging",
                  "edgekit.quantize.runoff")
ENGINE_PACKAGES = ("onnx", "onnxruntime", "tensorrt", "openvino", "torch")
BACKEND_PREFIXES = ("edgekit.quantize.ort", "edgekit.engines")


def loaded_after_importing(modules: tuple[str, ...]) -> set[str]:
    code = "import importlib, json, sys\n" + "".join(f"importlib.import_module({name!r})\n" for name in modules) + "print(json.dumps(sorted(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(run.stdout))


def test_the_search_modules_load_no_engine_and_no_backend_package() -> None:
    loaded = loaded_after_importing(SEARCH_MODULES)
    assert set(SEARCH_MODULES) <= loaded
    engines = sorted(name for name in loaded if name.split(".")[0] in ENGINE_PACKAGES)
    backends = sorted(name for name in loaded if name.startswith(BACKEND_PREFIXES))
    assert engines == [], f"the auto search loads engine modules: {engines[:10]}"
    assert backends == [], f"the auto search loads backend modules: {backends}"


def test_the_onnxruntime_planner_is_what_loads_the_backend() -> None:
    """The check above can fail: importing the ONNX Runtime planner does load the backend package."""
    loaded = loaded_after_importing(("edgekit.quantize.ort.planner",))
    assert {"edgekit.quantize.ort.builder", "edgekit.quantize.ort.candidates", "edgekit.quantize.auto"} <= loaded
