"""The report's description of what was built and where it will run: the model (size, I/O, weight
bytes per op type, op counts) and "what the device needs" (memory, precisions, backend, self-check).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from markupsafe import Markup

from edgekit.errors import BundleError
from edgekit.report import plots
from edgekit.report.formatting import (
    NA,
    as_dict,
    as_list,
    dig,
    fmt_bytes,
    fmt_cosine,
    fmt_host,
    fmt_mib,
    fmt_number,
    fmt_percent,
    fmt_sci,
    fmt_value,
    number,
)

logger = logging.getLogger(__name__)

#: Backend manifest keys shown in their own rows; any others (engine details) are listed after them.
_BACKEND_KEYS = ("name", "execution_providers", "graph_optimization", "intra_op_threads")


def model_section(manifest: dict[str, Any], model_path: Path | None) -> dict[str, Any]:
    model = dig(manifest, "model")
    external = dig(model, "external_data")
    size_bytes = number(dig(model, "size_bytes"))
    if size_bytes is None and model_path is not None:
        size_bytes = _size_on_disk(Path(model_path), external)
    io = dig(manifest, "io")
    external_text = "none (weights inside the .onnx file)" if isinstance(model, dict) and external is None else fmt_value(external)
    section: dict[str, Any] = {
        "size_bytes": size_bytes,
        "size": fmt_bytes(size_bytes),
        "size_note": f"weights in {external}" if external else f"opset {fmt_value(dig(model, 'opset'))}",
        "facts": [
            ("file", fmt_value(dig(model, "path"))),
            ("source", _join(dig(model, "source", "kind"), dig(model, "source", "description"))),
            ("external data", external_text),
            ("size", fmt_bytes(size_bytes)),
            ("opset", fmt_value(dig(model, "opset"))),
            ("sha256", fmt_value(dig(model, "sha256") or dig(manifest, "files", dig(model, "path") or "model.onnx"))),
        ],
        "inputs": _tensor_rows(dig(io, "inputs")),
        "outputs": _tensor_rows(dig(io, "outputs")),
        "dims": _dim_rows(dig(io, "dims")),
        "size_rows": [],
        "op_counts": [],
        "node_count": NA,
        "plot": None,
        "stats_note": "",
    }
    if model_path is None:
        section["stats_note"] = "No model file was given to the report: weight size by op type and op counts are not shown."
        return section
    from edgekit.report.model_stats import model_size_by_op_type, op_type_counts

    try:
        sizes = model_size_by_op_type(Path(model_path))
        counts = op_type_counts(Path(model_path))
    except BundleError as exc:
        logger.warning("report: %s", exc)
        section["stats_note"] = f"Could not read the model for its statistics: {exc.message}"
        return section
    weight_total = sum(sizes.values())
    section["size_rows"] = [(op, fmt_bytes(nbytes), fmt_percent(nbytes, weight_total)) for op, nbytes in sizes.items()]
    section["op_counts"] = [(op, f"{count:,}") for op, count in counts.items()]
    section["node_count"] = f"{sum(counts.values()):,}"
    svg = plots.size_by_op_type_svg(sizes)
    section["plot"] = Markup(svg) if svg else None
    if not svg:
        section["stats_note"] = "The model has no weights (initializers)."
    return section


def device_section(manifest: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    """What the target must provide: memory, a precision its backend runs, the execution providers."""
    target = dig(manifest, "target")
    backend = dig(manifest, "backend")
    chosen_backend = dig(backend, "name")
    chosen_precision = dig(manifest, "precision")
    golden = dig(manifest, "golden")
    batches = dig(golden, "batches")
    return {
        "target_facts": _target_facts(target),
        "memory": _memory_rows(manifest, model["size_bytes"], number(dig(target, "memory", "gb"))),
        "memory_check": _memory_check(manifest, model["size_bytes"], number(dig(target, "memory", "gb"))),
        "memory_total": f"{fmt_number(dig(target, 'memory', 'gb'), 3)} GB" if number(dig(target, "memory", "gb")) else NA,
        "backends": _backend_rows(dig(target, "backends"), chosen_backend, chosen_precision),
        "precision_check": _precision_check(dig(target, "backends"), chosen_backend, chosen_precision),
        "backend_facts": [
            ("backend", fmt_value(chosen_backend)),
            ("precision", fmt_value(chosen_precision)),
            ("graph optimization", fmt_value(dig(backend, "graph_optimization"))),
            ("intra-op threads", fmt_value(dig(backend, "intra_op_threads"))),
            *((key.replace("_", " "), fmt_value(value)) for key, value in as_dict(backend).items() if key not in _BACKEND_KEYS),
        ],
        "providers": [
            (fmt_value(dig(ep, "name")), fmt_value(dig(ep, "options")) if dig(ep, "options") else "defaults")
            for ep in as_list(dig(backend, "execution_providers"))
        ],
        "golden": [
            ("golden batches", str(len(batches)) if isinstance(batches, list) else NA),
            ("atol", fmt_sci(dig(golden, "atol"))),
            ("rtol", fmt_sci(dig(golden, "rtol"))),
            ("min cosine", fmt_cosine(dig(golden, "min_cosine"))),
            *((f"output {name}", f"atol {fmt_sci(dig(entry, 'atol'))}, min cosine {fmt_cosine(dig(entry, 'min_cosine'))} "
               f"(measured: max abs diff {fmt_sci(dig(entry, 'measured', 'max_abs_diff'))}, cosine {fmt_cosine(dig(entry, 'measured', 'cosine_min'))})")
              for name, entry in as_dict(dig(golden, "outputs")).items()),
        ],
    }


# ---------------------------------------------------------------- helpers


def _size_on_disk(model_path: Path, external: Any) -> float | None:
    paths = [model_path] + ([model_path.parent / external] if isinstance(external, str) else [])
    sizes = [p.stat().st_size for p in paths if p.is_file()]
    return float(sum(sizes)) if sizes else None


def _tensor_rows(tensors: Any) -> list[tuple[str, str, str]]:
    if not isinstance(tensors, list):
        return []
    return [(fmt_value(dig(t, "name")), fmt_value(dig(t, "dtype")), fmt_value(dig(t, "shape"))) for t in tensors]


def _dim_rows(dims: Any) -> list[tuple[str, str, str, str]]:
    if not isinstance(dims, dict):
        return []
    return [(str(name), *(fmt_value(dig(d, key)) for key in ("min", "opt", "max"))) for name, d in dims.items()]


def _target_facts(target: Any) -> list[tuple[str, str]]:
    cpu, gpu, npu, memory = (dig(target, key) for key in ("cpu", "gpu", "npu", "memory"))
    software = {key: value for key, value in as_dict(dig(target, "software")).items() if value is not None}
    throughput = [
        _join(_unit(dig(p, "value"), dig(p, "unit")), dig(p, "precision"), dig(p, "engine"), "sparse" if dig(p, "sparse") else None)
        for p in as_list(dig(target, "peak_throughput"))
    ]
    power = [f"{mode} {fmt_number(watts, 3)} W" for mode, watts in as_dict(dig(target, "power_modes")).items()]
    return [
        ("name", f"{fmt_value(dig(target, 'display_name'))} ({fmt_value(dig(target, 'name'))})"),
        ("vendor / family", f"{fmt_value(dig(target, 'vendor'))} / {fmt_value(dig(target, 'family'))}"),
        ("CPU", _join(dig(cpu, "arch"), _unit(dig(cpu, "cores"), "cores"), dig(cpu, "model"))),
        ("GPU", _join(dig(gpu, "name"), dig(gpu, "architecture"), _labelled("compute capability", dig(gpu, "compute_capability")))
         if isinstance(gpu, dict) else "none"),
        ("DLA cores", fmt_value(dig(target, "dla_cores"))),
        ("NPU", _join(dig(npu, "name"), dig(npu, "vendor"), _unit(dig(npu, "int8_tops"), "INT8 TOPS"), dig(npu, "execution_provider"))
         if isinstance(npu, dict) else "none"),
        ("memory", _join(_unit(dig(memory, "gb"), "GB"), _unit(dig(memory, "bandwidth_gbps"), "GB/s"),
                         "shared with the GPU" if dig(memory, "shared_with_gpu") else None)),
        ("software", fmt_value(software)),
        ("peak throughput", "; ".join(throughput) or NA),
        ("power modes", ", ".join(power) or NA),
        ("notes", fmt_value(dig(target, "notes"))),
    ]


def _memory_rows(manifest: dict[str, Any], model_bytes: float | None, memory_gb: float | None) -> list[dict[str, str]]:
    memory_bytes = memory_gb * 1e9 if memory_gb else None
    rss_mb = number(dig(manifest, "benchmark", "peak_rss_mb"))
    host = dig(manifest, "benchmark", "host")
    rows = [
        ("model file(s)", fmt_bytes(model_bytes), model_bytes),
        (f"peak RSS of the build process{f' on {fmt_host(host, short=True)}' if host else ''} (not the model's need)",
         fmt_mib(rss_mb), _mib_bytes(rss_mb)),
    ]
    return [
        {"label": label, "value": value, "share": fmt_percent(nbytes, memory_bytes), "width": _bar_width(nbytes, memory_bytes)}
        for label, value, nbytes in rows
    ]


def _memory_check(manifest: dict[str, Any], model_bytes: float | None, memory_gb: float | None) -> tuple[str, str]:
    """(sentence, css class) on whether the model file(s) fit the target's memory.

    The benchmark's peak RSS is left out: the build benchmarks in its own process, so that figure holds torch, the
    exporter and everything else the build loaded (641 MB for a 657 KB model whose ONNX Runtime process peaks near 80 MiB)."""
    if model_bytes is None or not memory_gb:
        return NA, "na"
    left_out = " (the build process's peak RSS is not the device's need, so it is not counted)"
    if number(dig(manifest, "benchmark", "peak_rss_mb")) is None:
        left_out = ""
    if model_bytes > memory_gb * 1e9:
        return f"Needs {fmt_bytes(model_bytes)} for the model file(s) alone, more than the target's {fmt_number(memory_gb, 3)} GB of memory.", "fail"
    return (f"Fits: the model file(s) ({fmt_bytes(model_bytes)}) are {fmt_percent(model_bytes, memory_gb * 1e9)} of the target's "
            f"memory{left_out}; the runtime and the activations add to it on the device."), "pass"


def _mib_bytes(mib: float | None) -> float | None:
    """Bytes in ``mib`` MiB (``peak_rss_mb`` is VmHWM kB / 1024: MiB, as :func:`fmt_mib` reads it), None for None."""
    return None if mib is None else mib * 2**20


def _bar_width(part: float | None, whole: float | None) -> str:
    """CSS width of a memory bar: at least a sliver so small shares stay visible, at most full."""
    if part is None or not whole:
        return "0%"
    return f"{min(100.0, max(0.5, 100 * part / whole)):.1f}%"


def _backend_rows(backends: Any, chosen_backend: Any, chosen_precision: Any) -> list[dict[str, Any]]:
    rows = []
    for support in as_list(backends):
        chosen = dig(support, "name") == chosen_backend
        precisions = as_list(dig(support, "precisions"))
        rows.append({
            "name": fmt_value(dig(support, "name")),
            "chosen": chosen,
            "precisions": [(fmt_value(p), chosen and p == chosen_precision) for p in precisions],
            "providers": ", ".join(fmt_value(dig(ep, "name")) for ep in as_list(dig(support, "execution_providers"))) or NA,
        })
    return rows


def _precision_check(backends: Any, chosen_backend: Any, chosen_precision: Any) -> tuple[str, str]:
    """(sentence, css class) on whether the target lists the built precision for the built backend."""
    if not isinstance(backends, list) or chosen_backend is None or chosen_precision is None:
        return NA, "na"
    for support in as_list(backends):
        if dig(support, "name") == chosen_backend:
            if chosen_precision in as_list(dig(support, "precisions")):
                return f"{chosen_precision} is supported by {chosen_backend} on this target.", "pass"
            return f"{chosen_precision} is not listed for {chosen_backend} on this target.", "fail"
    return "The target profile does not list the backend this bundle was built for.", "na"


def _join(*parts: Any) -> str:
    return ", ".join(fmt_value(p) for p in parts if p is not None and p != "") or NA


def _unit(value: Any, unit: Any) -> str | None:
    return f"{fmt_number(value, 4)} {fmt_value(unit)}" if number(value) is not None else None


def _labelled(label: str, value: Any) -> str | None:
    return f"{label} {value}" if value is not None else None
