#!/usr/bin/env python3
"""How far is `edgekit estimate` from figures nobody here produced? Read the published Jetson latency and
throughput figures in docs/benchmarks/published_jetson.yaml (each with its source and conditions), build the
matching graph offline (transformers configs and a hand-written YOLOv8n, seeded weights: nothing is
downloaded; latency does not depend on the weights' values), estimate it on the row's target, power mode,
precision and batch, and rewrite the `## Against published Jetson figures` section of docs/estimates.md (from
that heading to the end of the file; everything above it is left as it is).

    python scripts/estimate_published.py [--figures docs/benchmarks/published_jetson.yaml] [--out docs/estimates.md]
                                         [--rows id,id,...] [--json FILE]

Graphs are cached as ONNX under $EDGEKIT_CACHE_DIR/published (default ~/.cache/edgekit/published).
Estimates use the default (uncalibrated) efficiency factors: no fleet calibration file is read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import yaml  # noqa: E402

from edgekit.errors import EdgekitError  # noqa: E402
from scripts.published_graphs import GRAPHS, PublishedFiguresError  # noqa: E402
from scripts.shared_setup import markdown_table  # noqa: E402

HEADING = "## Against published Jetson figures"
FIGURES = REPO / "docs" / "benchmarks" / "published_jetson.yaml"
DOC = REPO / "docs" / "estimates.md"
METRICS = ("latency_ms", "throughput_per_s")
#: op classes a TensorRT engine runs as kernels of their own; the elementwise, normalization and data-movement
#: nodes around them are what its fusions fold into those kernels (the "conv/GEMM only" diagnostic column)
GEMM_CLASSES = ("conv", "matmul", "attention")
#: keys every row must have (with a non-empty value), and what each one says
REQUIRED = {
    "id": "a unique name for the row",
    "module": "the Jetson module (and carrier) the figure was measured on",
    "target": "the edgekit target profile the row is estimated on (targets/<name>.yaml)",
    "power_mode": "the target power mode matching the source's nvpmodel mode",
    "model": "the model as the source names it",
    "graph": "the graph builder that reproduces it (see GRAPHS in scripts/published_graphs.py)",
    "precision": "the precision the source ran",
    "batch": "the batch size the figure is for",
    "shape": "the dims the graph is estimated at, e.g. {batch: 1, seq: 384}",
    "metric": f"one of {', '.join(METRICS)}",
    "value": "the published figure, a positive number",
    "measured": "what the figure measures (statistic, scenario, what the timing includes)",
    "engine": "which engines ran it (GPU, GPU + 2 DLA, ...)",
    "software": "the software stack the source names",
    "source": "where the figure is published: {url: ..., title: ...}",
}
OPTIONAL = {"notes", "conditions_source", "input"}


@dataclass(frozen=True)
class PublishedRow:
    id: str
    module: str
    target: str
    power_mode: str
    model: str
    graph: str
    precision: str
    batch: int
    shape: dict[str, int]
    metric: str
    value: float
    measured: str
    engine: str
    software: str
    source: dict[str, str]
    notes: str = ""
    conditions_source: dict[str, str] = field(default_factory=dict)
    input: str = ""


# ---------------------------------------------------------------------------------------------- figures file


def load_published(path: Path, graphs: Mapping[str, Any] | None = None) -> list[PublishedRow]:
    """The rows of ``path``, each checked: every field present, the metric known, a source URL, the batch in the
    shape, the graph registered (``graphs``: default :data:`GRAPHS`) and the target and power mode shipped."""
    from edgekit.target import get_target

    graphs = GRAPHS if graphs is None else graphs
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PublishedFiguresError(f"cannot read published figures {path}: {exc}", hint="fix the YAML syntax") from exc
    if not isinstance(document, dict) or not isinstance(document.get("rows"), list) or not document["rows"]:
        raise PublishedFiguresError(f"{path}: expected a mapping with a non-empty 'rows' list", hint="see the file's header")
    rows, seen = [], set()
    for index, raw in enumerate(document["rows"]):
        where = f"{path}: rows[{index}]" + (f" ({raw.get('id')})" if isinstance(raw, dict) and raw.get("id") else "")
        if not isinstance(raw, dict):
            raise PublishedFiguresError(f"{where}: a row must be a mapping", hint=f"give the keys {', '.join(REQUIRED)}")
        for key, meaning in REQUIRED.items():
            if raw.get(key) in (None, "", {}, []):
                raise PublishedFiguresError(f"{where}: missing '{key}'", hint=f"add {key}: {meaning}")
        unknown = set(raw) - set(REQUIRED) - OPTIONAL
        if unknown:
            raise PublishedFiguresError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}",
                                        hint=f"allowed: {', '.join([*REQUIRED, *sorted(OPTIONAL)])}")  # fmt: skip
        if raw["id"] in seen:
            raise PublishedFiguresError(f"{where}: duplicate id '{raw['id']}'", hint="give every row its own id")
        seen.add(raw["id"])
        if raw["metric"] not in METRICS:
            raise PublishedFiguresError(f"{where}: metric '{raw['metric']}' is not one of {', '.join(METRICS)}",
                                        hint="latency_ms for a latency, throughput_per_s for samples per second")  # fmt: skip
        source = raw["source"]
        if not isinstance(source, dict) or not str(source.get("url", "")).startswith("https://") or not source.get("title"):
            raise PublishedFiguresError(f"{where}: source needs an https url and a title",
                                        hint="source: {url: https://..., title: what the page or file is}")  # fmt: skip
        try:
            value = float(raw["value"])
            batch = int(raw["batch"])
            shape = {str(k): int(v) for k, v in dict(raw["shape"]).items()}
        except (TypeError, ValueError) as exc:
            raise PublishedFiguresError(f"{where}: value, batch and shape must be numbers ({exc})",
                                        hint="value: 0.64, batch: 1, shape: {batch: 1}") from exc  # fmt: skip
        if value <= 0 or batch <= 0:
            raise PublishedFiguresError(f"{where}: value and batch must be positive", hint="copy the figure as published")
        if shape.get("batch") != batch:
            raise PublishedFiguresError(f"{where}: shape batch {shape.get('batch')} differs from batch {batch}",
                                        hint="estimate at the published batch: shape: {batch: <batch>, ...}")  # fmt: skip
        if raw["graph"] not in graphs:
            raise PublishedFiguresError(f"{where}: unknown graph '{raw['graph']}'", hint=f"one of {', '.join(sorted(graphs))}")
        try:
            target = get_target(str(raw["target"]))
        except EdgekitError as exc:
            raise PublishedFiguresError(f"{where}: unknown target '{raw['target']}'", hint="a name from `edgekit targets`") from exc
        if raw["power_mode"] not in target.power_modes:
            raise PublishedFiguresError(f"{where}: target {target.name} has no power mode '{raw['power_mode']}'",
                                        hint=f"one of {', '.join(target.power_modes)}")  # fmt: skip
        rows.append(PublishedRow(
            id=str(raw["id"]), module=str(raw["module"]), target=str(raw["target"]), power_mode=str(raw["power_mode"]),
            model=str(raw["model"]), graph=str(raw["graph"]), precision=str(raw["precision"]), batch=batch, shape=shape,
            metric=str(raw["metric"]), value=value, measured=str(raw["measured"]), engine=str(raw["engine"]),
            software=str(raw["software"]), source={str(k): str(v) for k, v in source.items()}, notes=str(raw.get("notes") or ""),
            conditions_source={str(k): str(v) for k, v in dict(raw.get("conditions_source") or {}).items()},
            input=str(raw.get("input") or ""),
        ))  # fmt: skip
    return rows


# ---------------------------------------------------------------------------------------------- graphs


def cache_dir() -> Path:
    return Path(os.environ.get("EDGEKIT_CACHE_DIR", Path.home() / ".cache" / "edgekit")) / "published"


def graph_path(name: str, graphs: Mapping[str, Callable[[Path], str]] | None = None, directory: Path | None = None) -> tuple[Path, str]:
    """The cached ONNX file of graph ``name`` (built on first use) and how it was made."""
    graphs = GRAPHS if graphs is None else graphs
    directory = directory or cache_dir()
    path = directory / f"{name}.onnx"
    note = directory / f"{name}.txt"
    if not path.is_file() or not note.is_file():
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(graphs[name](path))
    return path, note.read_text().strip()


# ---------------------------------------------------------------------------------------------- estimates


@dataclass(frozen=True)
class Compared:
    row: PublishedRow
    estimate_value: float  # in the row's metric
    p50_ms: float
    throughput_per_s: float
    engine: str
    gops: float
    graph_note: str
    hardware_notes: tuple[str, ...]
    shares: dict[str, float] = field(default_factory=dict)  # op class -> share of the estimated time
    nodes: int = 0
    assumptions: tuple[str, ...] = ()
    gemm_only_value: float = 0.0  # the same estimate counting only conv / matmul / attention nodes, without overhead
    overhead_ms: float = 0.0  # the per-node overhead summed over the graph's nodes

    @property
    def gemm_only_error(self) -> float:
        return (self.gemm_only_value - self.row.value) / self.row.value

    @property
    def error(self) -> float:
        """(estimate - published) / published."""
        return (self.estimate_value - self.row.value) / self.row.value


def estimate_row(row: PublishedRow, path: Path, graph_note: str) -> Compared:
    """The estimate of ``row``'s graph on its target, mode, precision and shape, with the default factors."""
    from edgekit.estimate.estimate import estimate
    from edgekit.target import get_target

    import onnx

    # the graph as a ModelProto, not a path: shapes come from ONNX shape inference only. With a path, nodes that
    # inference leaves without a static shape are learnt by running the graph on ONNX Runtime at the benchmark shape,
    # which for BERT-large at batch 256 x 384 tokens takes more memory than this host has.
    proto = onnx.load(str(path), load_external_data=False)
    result = estimate(proto, get_target(row.target), dims=row.shape, batch=row.batch, power_mode=row.power_mode,
                      calibration={"entries": []}, assume_precision=None if row.precision == "fp32" else row.precision)  # fmt: skip
    value = result.p50_ms if row.metric == "latency_ms" else result.throughput_per_s
    notes = tuple(f for f in result.factors if "peak" in f or "derived" in f or "bandwidth" in f or "no work" in f)
    shares = {cls: v["share"] for cls, v in result.by_class.items()}
    nodes = int(sum(v["nodes"] for v in result.by_class.values()))
    overhead_ms = float(result.calibration["node_overhead_us"]) / 1e3
    gemm_ms = sum(v["ms"] - v["nodes"] * overhead_ms for cls, v in result.by_class.items() if cls in GEMM_CLASSES)
    gemm_value = gemm_ms if row.metric == "latency_ms" else row.batch * 1000.0 / gemm_ms
    return Compared(row, value, result.p50_ms, result.throughput_per_s, result.engine, result.cost.total_ops / 1e9, graph_note, notes,
                    shares, nodes, tuple(result.cost.assumptions), gemm_value, overhead_ms * nodes)  # fmt: skip


def compare_all(rows: Sequence[PublishedRow], graphs: Mapping[str, Callable[[Path], str]] | None = None,
                directory: Path | None = None) -> list[Compared]:  # fmt: skip
    out = []
    for row in rows:
        path, note = graph_path(row.graph, graphs, directory)
        out.append(estimate_row(row, path, note))
    return out


# ---------------------------------------------------------------------------------------------- rendering


def _fmt(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def _figure(row: PublishedRow) -> str:
    unit = "ms" if row.metric == "latency_ms" else "/s"
    return f"{_fmt(row.value)} {unit} ([{row.source['title']}]({row.source['url']}))"


def render_table(compared: Sequence[Compared]) -> str:
    header = ["module", "mode", "model", "precision", "batch", "published figure (source)", "estimate", "error", "nodes (overhead)",
              "elementwise + norm + data movement share", "conv/GEMM only, no overhead (diagnostic)", "its error"]
    rows = []
    for c in compared:
        r = c.row
        unit = "ms" if r.metric == "latency_ms" else "/s"
        side = sum(v for k, v in c.shares.items() if k not in GEMM_CLASSES)
        rows.append([r.module, r.power_mode, r.model, r.precision, r.batch, _figure(r), f"{_fmt(c.estimate_value)} {unit}",
                     f"{c.error * 100:+.0f} %", f"{c.nodes} ({c.overhead_ms:.2g} ms)", f"{side * 100:.0f} %",
                     f"{_fmt(c.gemm_only_value)} {unit}", f"{c.gemm_only_error * 100:+.0f} %"])  # fmt: skip
    return markdown_table(header, rows, right_aligned=(4, 6, 7, 8, 9, 10, 11))


def render_conditions(compared: Sequence[Compared]) -> str:
    lines = []
    for c in compared:
        r = c.row
        cond = f" Conditions from [{r.conditions_source['title']}]({r.conditions_source['url']})." if r.conditions_source else ""
        lines.append(f"* **{r.id}**: {r.measured}; {r.engine}; {r.software}; input {r.input or r.shape}.{cond} "
                     f"Graph: {c.graph_note} ({c.gops:.1f} GOPs at {r.shape}). {r.notes}".rstrip())  # fmt: skip
    return "\n".join(lines)


def median_abs_error(compared: Sequence[Compared]) -> float:
    return statistics.median(abs(c.error) for c in compared)


def render_section(compared: Sequence[Compared], analysis: str, when: str) -> str:
    """The whole `## Against published Jetson figures` section (heading included, ending with a newline)."""
    errors = [abs(c.error) for c in compared]
    slower = sum(1 for c in compared if (c.error > 0) == (c.row.metric == "latency_ms"))  # more ms, or fewer per s
    gemm = statistics.median(abs(c.gemm_only_error) for c in compared)
    summary = (f"Median absolute error over {len(compared)} rows: **{median_abs_error(compared) * 100:.0f} %** "
               f"(range {min(errors) * 100:.0f} to {max(errors) * 100:.0f} %); the estimate is slower than the published "
               f"figure in {slower} of {len(compared)} rows. Within 35 %: {sum(1 for e in errors if e <= 0.35)} of {len(compared)}. "
               f"The diagnostic conv/GEMM-only column (what the estimate would say if every elementwise, normalization and "
               f"data-movement node were fused away and dispatch cost nothing; not what `edgekit estimate` reports): "
               f"median absolute error {gemm * 100:.0f} %.")  # fmt: skip
    parts = [
        HEADING, "",
        "Published figures, each with its source and conditions in `docs/benchmarks/published_jetson.yaml`, against "
        "`edgekit estimate` with the DEFAULT (uncalibrated) factors on the matching target and power mode, at the "
        "published precision and batch. Error = (estimate - published) / published; for a throughput row a positive "
        "error means the estimate promises more than was measured. Regenerate with `python scripts/estimate_published.py` "
        f"(graphs built offline, cached in `~/.cache/edgekit/published`). Run {when}.",
        "", render_table(compared), "", summary, "", "Conditions per row:", "", render_conditions(compared), "",
    ]  # fmt: skip
    if analysis:
        parts += [analysis.strip(), ""]
    return "\n".join(parts)


def replace_section(document: str, section: str) -> str:
    """``document`` with everything from the `## Against published Jetson figures` heading to the end replaced by
    ``section`` (appended when the heading is missing); the text above is kept byte for byte."""
    at = document.find("\n" + HEADING)
    head = document if at < 0 else document[: at + 1]
    if not head.endswith("\n"):
        head += "\n"
    if at < 0:
        head += "\n"
    return head + section


# ---------------------------------------------------------------------------------------------- analysis

#: What the latest run shows, written after reading its table (keep it true to the numbers above it).
ANALYSIS = """Where the estimate is off, and why (read from the table; nothing here is fitted to these figures):

1. **Unfused elementwise work and the per-node overhead.** TensorRT folds bias, residual Add + ReLU, SiLU, GELU and
   LayerNorm into the convolution and GEMM kernels (NVIDIA's MLPerf BERT also uses fused attention and skip-LayerNorm
   plugins). The graph cost fuses only an activation that is a Conv/MatMul's only reader, so ResNet-50's residual
   Add + Relu, YOLOv8n's SiLU (Sigmoid + Mul, two readers) and BERT's GELU chain (Div, Erf, Add, Mul, Mul) are timed
   as separate memory-bound passes: 36 to 49 % of the ResNet-50 estimates, 50 to 73 % of YOLOv8n's, 60 to 68 % of
   BERT's. The GPU prior of 8 us a node adds 0.7 ms over ResNet-50's 88 ONNX nodes (more than the whole published
   0.64 ms on AGX Orin), 2.4 ms over YOLOv8n's 300 and 8.3 ms over BERT's 1041, while a TensorRT engine runs far
   fewer kernels than the ONNX graph has nodes. Counting only the conv / GEMM nodes without overhead (the diagnostic
   column) brings the latency rows to -18 % and -5 % (ResNet-50), +50 % and +31 % (BERT at 384 tokens) and +16 %
   (YOLOv8n FP32), but undershoots YOLOv8n FP16 / INT8 (-56 %, -72 %): its many thin convolutions at 640x640 do not
   reach the efficiency of large ones, so neither "nothing fused" nor "everything fused" describes it. Per-target
   factors fitted by `edgekit fleet calibrate` on telemetry from a real Jetson are what should replace the
   elementwise factor and the per-node overhead for these targets.
2. **DLA.** The ResNet-50 Offline figures use the GPU and both DLAs; the estimate times the GPU alone. NVIDIA's own
   config expects 4500/s (AGX Orin) and 1700/s (Orin NX) from the GPU alone (a harness expectation, not a published
   result): against those the diagnostic column (3,242/s, 1,720/s) is within 30 %, the full estimate is not.
3. **BERT's real sequences are shorter than 384 tokens.** The estimate is at the padded 384 tokens (247.5 GOPs a
   sample); NVIDIA's harness runs each sample at its own length (AGX Orin SingleStream latencies range from 3.3 to
   6.5 ms). At 384 tokens the AGX Orin Offline rate would need 553.7 x 247.5 GOPs = 137 TOPS, above the 85 dense
   INT8 TOPS of its GPU (the profile's 170 sparse counted half), so the device does less work per sample than the
   estimate counts: part of the BERT error is the comparison's. The files read do not give the sequence-length
   distribution, so no corrected row is shown.
4. **Orin NX: the profile has no GPU-only peak.** `jetson-orin-nx-16gb` quotes only GPU + 2 DLA totals (100 sparse
   INT8 TOPS at 25W, `engine: total`), so its GPU-only estimates use a peak that includes the DLAs' share (too
   optimistic for the GPU), and the MLPerf runs' nvpmodel mode (JetPack 5.1.1, MaxP) is not named in the files read
   (25W assumed). A sourced GPU-only figure from the Orin NX datasheet belongs in the profile; it is not added here
   because no datasheet text was at hand to cite. No other peak figure in the Jetson profiles contradicted these
   sources.
5. **FP32 on Ampere.** The profile times FP32 on the CUDA cores (1024 x 2 x 1020 MHz = 2.09 TFLOPS on the Orin Nano
   Super); TensorRT's builder allows TF32 tensor-core kernels by default, which is one reason the measured 8.36 ms is
   below even the conv-only diagnostic (9.74 ms)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--figures", type=Path, default=FIGURES)
    parser.add_argument("--out", type=Path, default=DOC)
    parser.add_argument("--rows", default="", help="comma-separated row ids (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="also write the comparison as JSON")
    args = parser.parse_args(argv)
    rows = load_published(args.figures)
    if args.rows:
        wanted = set(args.rows.split(","))
        rows = [r for r in rows if r.id in wanted]
    compared = compare_all(rows)
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = render_section(compared, ANALYSIS, when)
    args.out.write_text(replace_section(args.out.read_text() if args.out.is_file() else "", section))
    if args.json:
        args.json.write_text(json.dumps([{"id": c.row.id, "published": c.row.value, "metric": c.row.metric,
                                          "estimate": c.estimate_value, "p50_ms": c.p50_ms, "throughput_per_s": c.throughput_per_s,
                                          "error": c.error, "engine": c.engine, "gops": c.gops, "hardware": list(c.hardware_notes),
                                          "shares": c.shares, "nodes": c.nodes, "overhead_ms": c.overhead_ms,
                                          "gemm_only": c.gemm_only_value, "gemm_only_error": c.gemm_only_error,
                                          "assumptions": list(c.assumptions)}
                                         for c in compared], indent=2))  # fmt: skip
    for c in compared:
        print(f"{c.row.id:40s} published {c.row.value:10.4g} estimate {c.estimate_value:10.4g} error {c.error * 100:+6.0f} % "
              f"({c.engine}, {c.gops:.2f} GOPs)")  # fmt: skip
    print(f"median |error| {median_abs_error(compared) * 100:.0f} % over {len(compared)} rows; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
