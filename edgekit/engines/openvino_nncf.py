"""int8 for the openvino engine from NNCF's post-training quantization (``build.quantization.quantizer: nncf``), beside
edgekit's own QDQ graph (``quantizer: edgekit``, the default).

``nncf.quantize`` runs on the ONNX model with the recipe's calibration batches and NNCF's defaults for the target's
OpenVINO device (its MinMax ranges, fast bias correction, and the device's quantization rules), and writes a QDQ
ONNX graph: the bundle stays ONNX, as every OpenVINO bundle does (OpenVINO's low-precision transformations fold
the Q/DQ pairs into int8 kernels; ``scripts/bench_openvino_int8.py`` shows the compiled layers' precisions), so
golden outputs, hashing and signing are unchanged and ONNX Runtime can still run the graph. Quantizing the OpenVINO
model instead gives an OpenVINO IR, which a bundle does not carry; docs/openvino.md measures both.

NNCF is part of the ``openvino`` extra (``pip install 'edgekit[openvino]'``; it pulls no torch, though it imports
torch when torch is installed, which is why it loads only here, on the build host).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgekit.errors import QuantizationError
from edgekit.precision import Backend, Precision
from edgekit.recipe import QuantizationSpec
from edgekit.target import TargetProfile

#: where a recipe names the quantizer
FIELD = "build.quantization.quantizer"


def check_quantizer(spec: QuantizationSpec, backend: Backend, precision: Precision | str, where: Path | str) -> None:
    """``quantizer: nncf`` applies to precision int8 on the openvino backend only; anything else is an error that names
    the recipe field (never silently ignored)."""
    if spec.quantizer != "nncf":
        return
    value = str(getattr(precision, "value", precision))
    if backend is not Backend.OPENVINO or value != Precision.INT8.value:
        raise QuantizationError(
            f"{where}: {FIELD} is nncf, which quantizes int8 for the openvino backend; this build is {value} on {backend.value}",
            hint=f"build with --backend openvino --precision int8, or remove {FIELD} (edgekit's own QDQ quantizer)",
        )


def _import_nncf() -> Any:
    try:
        import nncf
    except ImportError:
        raise QuantizationError(f"{FIELD}: nncf needs NNCF, which is not installed",
                                hint="pip install 'edgekit[openvino]' (NNCF is in the openvino extra)") from None
    return nncf


def count_samples(model: Any, names: list[str], batches: list[dict[str, np.ndarray]]) -> int:
    """Items in the calibration batches, counted along the batch dim as :attr:`edgekit.recipe.Recipe.batch_dim` finds
    it: the named dim at axis 0 of the first input that has one (a scalar or a state input shaped ``[2, batch, 16]``
    before it does not count); one item per batch when no input starts with a named dim."""
    shapes = {value.name: [dim.dim_param for dim in value.type.tensor_type.shape.dim] for value in model.graph.input}
    first = next((name for name in names if shapes.get(name) and shapes[name][0]), None)
    if first is None:
        return len(batches)
    return int(sum(np.shape(batch[first])[0] for batch in batches))


def quantize_with_nncf(fp32_path: Path, out_path: Path, spec: QuantizationSpec, target: TargetProfile,
                       batches: list[dict[str, np.ndarray]] | None) -> dict[str, Any]:  # fmt: skip
    """Write ``out_path``, the NNCF int8 QDQ graph of ``fp32_path``; return the manifest's ``quantization.quantizer``."""
    import onnx

    if not batches:
        raise QuantizationError(f"{FIELD}: nncf needs calibration batches", hint="add data.calibration to the recipe")
    nncf = _import_nncf()
    if spec.calibration_batches:
        batches = batches[: spec.calibration_batches]
    model = onnx.load(str(fp32_path), load_external_data=True)
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    dataset = nncf.Dataset(batches, lambda batch: {name: batch[name] for name in names})
    device = target.backend(Backend.OPENVINO).device or "CPU"
    ignored = nncf.IgnoredScope(names=list(spec.exclude_nodes), types=list(spec.exclude_op_types), validate=False)
    try:
        quantized = nncf.quantize(model, dataset, target_device=getattr(nncf.TargetDevice, device), subset_size=len(batches),
                                  ignored_scope=ignored)  # fmt: skip
    except Exception as exc:  # NNCF raises its own and third-party errors: name the quantizer and the model
        raise QuantizationError(f"NNCF {nncf.__version__} could not quantize '{fp32_path}': {type(exc).__name__}: {exc}",
                                hint=f"name the failing node in build.quantization.exclude_nodes, or remove {FIELD}") from None
    large = quantized.ByteSize() > 2**31 - 2**26
    onnx.save(quantized, str(out_path), save_as_external_data=large, location=out_path.name + ".data" if large else None)
    return {"name": "nncf", "version": str(nncf.__version__), "method": "nncf.quantize (post-training, on the ONNX model)",
            "target_device": device, "batches": len(batches), "samples": count_samples(model, names, batches),
            "ignored_scope": {"names": list(spec.exclude_nodes), "types": list(spec.exclude_op_types)}}  # fmt: skip
