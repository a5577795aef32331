"""The bundle's ``report.html``: one self-contained page (inline CSS and SVG, no scripts, no
external assets) telling an ML engineer what a build produced.

:func:`render_report` turns a manifest (``docs/bundle-format.md``), the benchmark's per-iteration
latencies and the model file into HTML; every manifest field may be missing or null and is then
shown as "n/a". Values are escaped by Jinja2's autoescaping; the plots come from
:mod:`edgekit.report.plots`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit import __version__
from edgekit.errors import BuildError, BundleError
from edgekit.report.formatting import (
    NA,
    bundle_vs_fp32,
    device_applied_precision,
    dig,
    fmt_cosine,
    fmt_mib,
    fmt_ms,
    fmt_number,
    fmt_sci,
    fmt_value,
    measured_on_target,
    number,
    peak_rss_note,
)
from edgekit.report.estimate_section import estimate_section
from edgekit.report.model_section import device_section, model_section
from edgekit.report.precision_section import precision_section
from edgekit.report.sections import accuracy_section, benchmark_section, parity_section, percentile_label, stages_section

if TYPE_CHECKING:
    import jinja2

    from edgekit.estimate.estimate import Estimate

logger = logging.getLogger(__name__)

REPORT_FILE = "report.html"
TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "report.html.j2"


def render_report(
    manifest: dict[str, Any],
    latency_samples_ms: Sequence[float] | None,
    model_path: Path | None,
    *,
    file_hashes: dict[str, str] | None = None,
    estimate: Estimate | None = None,
) -> str:
    """The report as an HTML string. ``latency_samples_ms`` feeds the latency histogram and
    ``model_path`` the model-size and op-count sections; either may be ``None``.
    ``file_hashes`` (relative path -> sha256) stands in for a manifest without ``files``.
    ``estimate``: the bundle's estimate on its target (the estimate section), None for none."""
    manifest = manifest if isinstance(manifest, dict) else {}
    parity = parity_section(manifest)
    accuracy = accuracy_section(manifest)
    benchmark = benchmark_section(manifest, latency_samples_ms)
    model = model_section(manifest, model_path)
    context = {
        "header": _header(manifest, parity, accuracy),
        "cards": _cards(manifest, parity, accuracy, benchmark, model),
        "parity": parity,
        "accuracy": accuracy,
        "benchmark": benchmark,
        "stages": stages_section(manifest),
        "model": model,
        "precision": precision_section(manifest),
        "device": device_section(manifest, model),
        "estimate": estimate_section(estimate),
        "toolchain": _pairs(dig(manifest, "toolchain")),
        "files": _files(manifest, file_hashes),
        "edgekit_version": __version__,
        "schema_version": fmt_value(dig(manifest, "schema_version")),
    }
    return _template().render(**context)


def write_report(
    bundle_dir: Path,
    manifest: dict[str, Any],
    latency_samples_ms: Sequence[float] | None,
    model_path: Path | None,
    *,
    estimate: Estimate | None = None,
) -> Path:
    """Render the report and write it to ``<bundle_dir>/report.html``; returns that path.

    A manifest is usually finished after its report (``files`` hashes the report too); without a
    ``files`` entry the report lists the hashes of the files in ``bundle_dir`` as it finds them."""
    bundle_dir = Path(bundle_dir)
    if not bundle_dir.is_dir():
        raise BundleError(
            f"{bundle_dir}: bundle directory does not exist, cannot write {REPORT_FILE}",
            hint="create the bundle directory (the build's output dir) before writing its report",
        )
    file_hashes = None if isinstance(dig(manifest, "files"), dict) else _hash_bundle_files(bundle_dir)
    page = render_report(manifest, latency_samples_ms, model_path, file_hashes=file_hashes, estimate=estimate)
    path = bundle_dir / REPORT_FILE
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise BuildError(
            f"{path}: cannot write the report ({exc.strerror})",
            hint="check that the output directory is writable and the disk is not full",
        ) from None
    logger.info("wrote %s (%d KB)", path, len(page.encode("utf-8")) // 1000)
    return path


# ---------------------------------------------------------------- small sections


@functools.lru_cache(maxsize=1)
def _template() -> "jinja2.Template":
    """The report template, compiled once. Autoescaping is on for every value; StrictUndefined turns
    a template naming a key the context lacks into an error instead of an empty cell."""
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return environment.get_template(TEMPLATE_NAME)


def _header(manifest: dict[str, Any], parity: dict[str, Any], accuracy: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": fmt_value(dig(manifest, "name")),
        "created": fmt_value(dig(manifest, "created")),
        "target": fmt_value(dig(manifest, "target", "display_name") or dig(manifest, "target", "name")),
        "backend": fmt_value(dig(manifest, "backend", "name")),
        "precision": fmt_value(dig(manifest, "precision")),
        "recipe": fmt_value(dig(manifest, "recipe", "name")),
        "badges": [("Export parity", *parity["status"]), ("Accuracy", *accuracy["status"])],
    }


def _cards(
    manifest: dict[str, Any],
    parity: dict[str, Any],
    accuracy: dict[str, Any],
    benchmark: dict[str, Any],
    model: dict[str, Any],
) -> list[dict[str, str]]:
    """The summary row: (title, big value, small print, css class) per card."""
    bench = dig(manifest, "benchmark")
    batch = dig(bench, "batch")
    host_note = "" if measured_on_target(manifest) else " (this host)"
    return [
        _card("Model size", model["size"], model["size_note"]),
        _parity_card(manifest, parity),
        _card("Accuracy" + host_note, accuracy["value"], accuracy["card_note"], accuracy["status"][1]),
        _card("Latency p50 / p99" + host_note, f"{fmt_ms(dig(bench, 'p50_ms'))} / {fmt_ms(dig(bench, 'p99_ms'))}",
              "; ".join(part for part in (benchmark["where"], _tail_note(bench)) if part)),
        _card(
            "Throughput" + host_note,
            f"{fmt_number(dig(bench, 'throughput_per_s'), 3)} /s" if number(dig(bench, "throughput_per_s")) else NA,
            f"batch {fmt_value(batch)}" if batch is not None else "",
        ),
        _card("Peak RSS, build process" + host_note, fmt_mib(dig(bench, "peak_rss_mb")), peak_rss_note(bench)),
    ]


def _tail_note(bench: Any) -> str:
    """The card's warning when its p99 is not a measured tail (fewer than 100 timed calls)."""
    if percentile_label("p99", dig(bench, "iterations")) == "p99":
        return ""
    return f"p99 of {number(dig(bench, 'iterations')):.0f} timed calls: interpolated, not a measured tail"


def _parity_card(manifest: dict[str, Any], parity: dict[str, Any]) -> dict[str, str]:
    """The headline parity: for an FP32 build the export's (ONNX vs PyTorch); for any other precision the
    bundle's own deviation from FP32 on the golden inputs, since the export parity is the FP32 graph's."""
    precision = dig(manifest, "precision")
    own = bundle_vs_fp32(manifest)
    if precision in (None, "fp32") or own is None:
        return _card("Parity max |diff|", parity["max_abs_diff"], f"atol {parity['atol']}", parity["status"][1])
    cosine = f"cosine min {fmt_cosine(own['cosine_min'])}; " if own["cosine_min"] is not None else ""
    if device_applied_precision(manifest):  # the bundle's graph is FP32: TensorRT applies the precision on the device
        return _card("Host FP32 graph vs FP32 max |diff|", fmt_sci(own["max_abs_diff"]),
                     f"{cosine}on the golden inputs; the device applies {str(precision).upper()} through TensorRT builder flags, "
                     "so its own deviation is not measured here")  # fmt: skip
    return _card(f"{str(precision).upper()} vs FP32 max |diff|", fmt_sci(own["max_abs_diff"]),
                 f"{cosine}on the golden inputs (export parity {parity['max_abs_diff']})")  # fmt: skip


#: A number and its unit in a card's value: kept on one line (a narrow card wraps "90.5 MB / 0.1 ms" only at " / ").
_NUMBER_AND_UNIT = re.compile(r"(\d) (B|KB|MB|GB|TB|ms|s|/s)\b")


def _card(title: str, value: str, note: str, css: str = "") -> dict[str, str]:
    return {"title": title, "value": _NUMBER_AND_UNIT.sub("\\1\u00a0\\2", value), "note": note, "css": css}


def _pairs(mapping: Any) -> list[tuple[str, str]]:
    if not isinstance(mapping, dict):
        return []
    return [(str(key), fmt_value(value)) for key, value in mapping.items()]


def _files(manifest: dict[str, Any], file_hashes: dict[str, str] | None) -> dict[str, Any]:
    files = dig(manifest, "files")
    from_directory = not isinstance(files, dict) and file_hashes is not None
    rows = sorted(_pairs(file_hashes if from_directory else files))
    return {
        "rows": rows,
        "note": "Hashed when this report was written; manifest.json lists the final hashes." if from_directory else "",
        "recipe_path": fmt_value(dig(manifest, "recipe", "path")),
        "recipe_sha256": fmt_value(dig(manifest, "recipe", "sha256")),
    }


def _hash_bundle_files(bundle_dir: Path) -> dict[str, str]:
    """sha256 of every file under the bundle directory except the manifest and the report itself."""
    hashes = {}
    for path in sorted(p for p in bundle_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(bundle_dir).as_posix()
        if relative in ("manifest.json", REPORT_FILE):
            continue
        digest = hashlib.sha256()
        with path.open("rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
        hashes[relative] = digest.hexdigest()
    return hashes
