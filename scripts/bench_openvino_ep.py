"""ONNX Runtime's OpenVINO execution provider against the OpenVINO runtime directly, on the same ONNX files,
interleaved in one process (every round runs every engine once, in a rotated order), with ONNX Runtime's
CPU provider as the 1.00 reference. Outputs are compared to ONNX Runtime FP32 by cosine.

    python scripts/bench_openvino_ep.py [--ep-site /tmp/ovep/site] \
        --model digits=/tmp/ovwork/digits-fp32/model.onnx:64x1x8x8 --model ppocr-det=/tmp/det.onnx:1x3x320x320

``--ep-site`` is a folder holding the ``onnxruntime-ep-openvino`` plugin (``pip install --no-deps --target DIR
onnxruntime-ep-openvino``); or run it with the Python of a venv holding ``onnxruntime-openvino`` (which replaces
``onnxruntime``). Without either, only the OpenVINO runtime and ONNX Runtime's CPU provider are timed.
The result of the run this docs/openvino.md quotes is in that file, with the host's CPU flags and load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

Run = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def ort_cpu(path: str, threads: int) -> Run:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return lambda feeds: session.run(None, feeds)


def ort_openvino_ep(path: str, threads: int, precision: str | None) -> Run:
    """The OpenVINO EP on device CPU: the plugin's EP device when one is registered (the plugin offers none on a
    non-Intel CPU), else the provider built into an ``onnxruntime-openvino`` wheel."""
    import onnxruntime as ort

    ep_options = {"device_type": "CPU", "num_of_threads": str(threads)}
    if precision:
        ep_options["precision"] = precision
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "OpenVINOExecutionProvider" and d.ep_metadata.get("ov_device") == "CPU"]
    if devices:
        del ep_options["device_type"]
        options.add_provider_for_devices(devices[:1], ep_options)
        session = ort.InferenceSession(path, options)
    else:
        session = ort.InferenceSession(path, options, providers=[("OpenVINOExecutionProvider", ep_options)])
    return lambda feeds: session.run(None, feeds)


def ep_available() -> bool:
    import onnxruntime as ort

    plugin = any(d.ep_name == "OpenVINOExecutionProvider" for d in ort.get_ep_devices())
    return plugin or "OpenVINOExecutionProvider" in ort.get_available_providers()


def openvino_direct(path: str, threads: int, precision: str | None) -> Run:
    import openvino as ov

    config: dict[str, str] = {"INFERENCE_NUM_THREADS": str(threads), "PERFORMANCE_HINT": "LATENCY"}
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = ov.Core().compile_model(path, "CPU", config)
    request = compiled.create_infer_request()
    outputs = compiled.outputs

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        request.infer(feeds)
        return [request.get_tensor(o).data.copy() for o in outputs]

    return run


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def engines(path: str, threads: int, with_ep: bool) -> dict[str, Run]:
    made = {"ORT CPU": ort_cpu(path, threads)}
    if with_ep:
        made["ORT+OV EP default"] = ort_openvino_ep(path, threads, None)
        made["ORT+OV EP FP32"] = ort_openvino_ep(path, threads, "FP32")
    made["OpenVINO default"] = openvino_direct(path, threads, None)
    made["OpenVINO f32"] = openvino_direct(path, threads, "f32")
    return made


def measure(name: str, path: str, shape: tuple[int, ...], threads: int, rounds: int, seconds: float, with_ep: bool) -> None:
    import onnx

    input_name = onnx.load(path, load_external_data=False).graph.input[0].name
    feeds = {input_name: np.random.default_rng(0).random(shape, dtype=np.float32)}
    made = engines(path, threads, with_ep)
    reference = made["ORT CPU"](feeds)[0]
    samples: dict[str, list[float]] = {key: [] for key in made}
    iterations = max(1, int(seconds / _time_once(made["ORT CPU"], feeds)))
    keys = list(made)
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[: r % len(keys)]:
            start = time.perf_counter()
            for _ in range(iterations):
                made[key](feeds)
            samples[key].append((time.perf_counter() - start) / iterations * 1e3)
    base = statistics.median(samples["ORT CPU"])
    print(f"\n{name} {shape} ({iterations} calls x {rounds} rounds)")
    for key in keys:
        ms = statistics.median(samples[key])
        print(f"  {key:20s} {ms:8.3f} ms  ratio {ms / base:5.2f}  cos {cosine(made[key](feeds)[0], reference):.5f}")


def _time_once(run: Run, feeds: dict[str, np.ndarray]) -> float:
    run(feeds)
    start = time.perf_counter()
    for _ in range(3):
        run(feeds)
    return (time.perf_counter() - start) / 3


def register_plugin(site: str) -> None:
    sys.path.insert(0, site)
    import onnxruntime as ort
    import onnxruntime_ep_openvino as plugin

    ort.register_execution_provider_library("openvino_ep", plugin.get_library_path())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="NAME=PATH:SHAPE, SHAPE like 1x3x320x320")
    parser.add_argument("--ep-site", help="folder holding onnxruntime_ep_openvino")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=0.5, help="per engine per round")
    args = parser.parse_args()
    import onnxruntime as ort
    import openvino as ov

    if args.ep_site:
        register_plugin(args.ep_site)
    with_ep = ep_available()
    print(f"onnxruntime {ort.__version__}, openvino {ov.__version__}, threads {args.threads}, load {os.getloadavg()}")
    for spec in args.model:
        name, rest = spec.split("=", 1)
        path, shape = rest.rsplit(":", 1)
        measure(name, path, tuple(int(d) for d in shape.split("x")), args.threads, args.rounds, args.seconds, with_ep)
    print(f"load after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
