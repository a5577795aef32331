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

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from edgekit.errors import EdgekitError  # noqa: E402
from scripts.published_fit import Params, RowWork, leave_one_source_out, predicted  # noqa: E402
from scripts.published_graphs import GRAPHS, SEQUENCE_GRAPHS, PublishedFiguresError  # noqa: E402
from scripts.published_analysis import ANALYSIS  # noqa: E402
from scripts.published_lengths import LENGTHS, STATISTICS, effective_length  # noqa: E402
from scripts.shared_setup import markdown_table  # noqa: E402

HEADING = "## Against published Jetson figures"
FIGURES = REPO / "docs" / "benchmarks" / "published_jetson.yaml"
DOC = REPO / "docs" / "estimates.md"
METRICS = ("latency_ms", "throughput_per_s")
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
OPTIONAL = {"notes", "conditions_source", "input", "source_group", "sequence_length"}


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
    source_group: str = ""  # the independent source it belongs to (left out together in the validation)
    seq: int | None = None  # the effective sequence length the graph is built at (a variable-length run), else None
    seq_note: str = ""  # how ``seq`` was taken (statistic and length histogram)

    @property
    def group(self) -> str:
        """``source_group``, else the source URL up to its repository or host."""
        if self.source_group:
            return self.source_group
        parts = self.source["url"].split("/")
        return "/".join(parts[2:5]) if "github.com" in self.source["url"] else parts[2]


# ---------------------------------------------------------------------------------------------- figures file


def load_published(path: Path, graphs: Mapping[str, Any] | None = None,
                   sequence_graphs: Mapping[str, Any] | None = None) -> list[PublishedRow]:  # fmt: skip
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
        seq, seq_note = _sequence_length(raw, where, sequence_graphs if sequence_graphs is not None else SEQUENCE_GRAPHS)
        rows.append(PublishedRow(
            id=str(raw["id"]), module=str(raw["module"]), target=str(raw["target"]), power_mode=str(raw["power_mode"]),
            model=str(raw["model"]), graph=str(raw["graph"]), precision=str(raw["precision"]), batch=batch, shape=shape,
            metric=str(raw["metric"]), value=value, measured=str(raw["measured"]), engine=str(raw["engine"]),
            software=str(raw["software"]), source={str(k): str(v) for k, v in source.items()}, notes=str(raw.get("notes") or ""),
            conditions_source={str(k): str(v) for k, v in dict(raw.get("conditions_source") or {}).items()},
            input=str(raw.get("input") or ""), source_group=str(raw.get("source_group") or ""), seq=seq, seq_note=seq_note,
        ))  # fmt: skip
    return rows


def _sequence_length(raw: Mapping[str, Any], where: str, sequence_graphs: Mapping[str, Any]) -> tuple[int | None, str]:
    """A row's ``sequence_length: {lengths: <histogram name>, statistic: median|mean}`` as (tokens, how it was taken):
    the length a variable-length run behaves like (:mod:`scripts.published_lengths`); (None, "") when the row has none."""
    spec = raw.get("sequence_length")
    if spec is None:
        return None, ""
    fix = f"sequence_length: {{lengths: {' | '.join(LENGTHS)}, statistic: {' | '.join(STATISTICS)}}}"
    if not isinstance(spec, dict) or set(spec) != {"lengths", "statistic"}:
        raise PublishedFiguresError(f"{where}: sequence_length needs exactly 'lengths' and 'statistic'", hint=fix)
    if spec["lengths"] not in LENGTHS or spec["statistic"] not in STATISTICS:
        raise PublishedFiguresError(f"{where}: unknown sequence_length {spec['lengths']!r} / {spec['statistic']!r}", hint=fix)
    if raw["graph"] not in sequence_graphs:
        raise PublishedFiguresError(f"{where}: graph '{raw['graph']}' cannot be built at another sequence length",
                                    hint=f"sequence_length applies to {', '.join(sorted(sequence_graphs)) or 'no graph'}")  # fmt: skip
    source = LENGTHS[spec["lengths"]]
    seq = effective_length(source.histogram, spec["statistic"])
    return seq, (f"Estimated at {seq} tokens, the {spec['statistic']} length of {source.what} "
                 f"([histogram]({source.url})): the harness runs each sample at its own length, no padding.")


# ---------------------------------------------------------------------------------------------- graphs


def cache_dir() -> Path:
    return Path(os.environ.get("EDGEKIT_CACHE_DIR", Path.home() / ".cache" / "edgekit")) / "published"


def graph_path(name: str, graphs: Mapping[str, Callable[[Path], str]] | None = None, directory: Path | None = None,
               seq: int | None = None, sequence_graphs: Mapping[str, Callable[[Path, int], str]] | None = None) -> tuple[Path, str]:  # fmt: skip
    """The cached ONNX file of graph ``name`` (at ``seq`` tokens when given; built on first use) and how it was made."""
    graphs = GRAPHS if graphs is None else graphs
    directory = directory or cache_dir()
    stem = name if seq is None else f"{name}-seq{seq}"
    path = directory / f"{stem}.onnx"
    note = directory / f"{stem}.txt"
    if not path.is_file() or not note.is_file():
        note.parent.mkdir(parents=True, exist_ok=True)
        if seq is None:
            note.write_text(graphs[name](path))
        else:
            note.write_text((SEQUENCE_GRAPHS if sequence_graphs is None else sequence_graphs)[name](path, seq))
    return path, note.read_text().strip()


# ---------------------------------------------------------------------------------------------- estimates


@dataclass(frozen=True)
class Compared:
    row: PublishedRow
    estimate_value: float  # in the row's metric, default factors
    p50_ms: float
    throughput_per_s: float
    engine: str
    gops: float
    graph_note: str
    hardware_notes: tuple[str, ...]
    shares: dict[str, float] = field(default_factory=dict)  # layer (or node) class -> share of the estimated time
    nodes: int = 0  # ONNX nodes that run (not folded)
    layers: int = 0  # the layers the estimate timed (TensorRT layers on an NVIDIA target, else nodes)
    assumptions: tuple[str, ...] = ()
    work: RowWork | None = None  # the row as layer work, for the leave-one-source-out fit
    loso_value: float | None = None  # in the row's metric, with factors fitted on the OTHER sources
    loso_params: Params | None = None

    @property
    def error(self) -> float:
        """(estimate - published) / published, default factors."""
        return (self.estimate_value - self.row.value) / self.row.value

    @property
    def loso_error(self) -> float | None:
        return None if self.loso_value is None else (self.loso_value - self.row.value) / self.row.value


def dla_share(row: PublishedRow, target: Any, hardware: Any) -> float:
    """What the DLAs add to a throughput row that ran on the GPU and the DLAs, as a share of the GPU's rate: the
    target's dense DLA INT8 figure over the GPU's (the same efficiency assumed on both). 0 for a latency row, a row
    that ran on the GPU alone, or a target whose peak already counts the DLAs (``engine: total``)."""
    if row.metric != "throughput_per_s" or "DLA" not in row.engine or hardware.engine != "gpu":
        return 0.0
    dla = [p for p in target.peak_throughput if p.engine == "dla" and getattr(p.precision, "value", p.precision) == row.precision
           and p.power_mode in (None, row.power_mode)]  # fmt: skip
    gpu = hardware.peak_ops.get(row.precision)
    if not dla or not gpu:
        return 0.0
    return dla[0].value * 1e12 / (2 if dla[0].sparse else 1) / gpu


def row_work(row: PublishedRow, cost: Any, hardware: Any, dla: float = 0.0) -> RowWork:
    """``row``'s graph as TensorRT layer work with each layer's prior efficiency (what the fit varies)."""
    from edgekit.estimate.roofline import TENSORRT_EFFICIENCY
    from edgekit.estimate.tensorrt_layers import layer_work

    work = layer_work(cost, hardware)
    value = row.value / (1.0 + dla)  # the fit predicts the GPU's share; the DLAs add their fixed share on top
    return RowWork(row.id, row.group, row.metric, value, row.batch,
                   np.array([w.compute_s for w in work]), np.array([w.memory_s for w in work]),
                   np.array([TENSORRT_EFFICIENCY.get(w.op_class, 1.0) for w in work]),
                   np.array([1.0 if w.precision == "int8" else 0.0 for w in work]))  # fmt: skip


def estimate_row(row: PublishedRow, path: Path, graph_note: str) -> Compared:
    """The estimate of ``row``'s graph on its target, mode, precision and shape, with the default factors."""
    from edgekit.estimate.estimate import estimate
    from edgekit.estimate.hardware import hardware_for
    from edgekit.target import get_target

    import onnx

    # the graph as a ModelProto, not a path: shapes come from ONNX shape inference only. With a path, nodes that
    # inference leaves without a static shape are learnt by running the graph on ONNX Runtime at the benchmark shape,
    # which for BERT-large at batch 256 x 384 tokens takes more memory than this host has.
    proto = onnx.load(str(path), load_external_data=False)
    target = get_target(row.target)
    result = estimate(proto, target, dims=row.shape, batch=row.batch, power_mode=row.power_mode,
                      calibration={"entries": []}, assume_precision=None if row.precision == "fp32" else row.precision)  # fmt: skip
    value = result.p50_ms if row.metric == "latency_ms" else result.throughput_per_s
    hardware = hardware_for(target, row.power_mode)
    dla = dla_share(row, target, hardware)
    value *= 1.0 + dla
    notes = tuple(f for f in result.factors if "peak" in f or "derived" in f or "bandwidth" in f or "no work" in f or "TF32" in f)
    shares = {cls: v["share"] for cls, v in result.by_class.items()}
    nodes = sum(1 for n in result.cost.nodes if n.inputs or n.subgraph_calls)
    work = row_work(row, result.cost, hardware, dla) if hardware.layer_model == "tensorrt" else None
    return Compared(row, value, result.p50_ms, result.throughput_per_s, result.engine, result.cost.total_ops / 1e9, graph_note, notes,
                    shares, nodes, len(result.node_ms), tuple(result.cost.assumptions), work)  # fmt: skip


def compare_all(rows: Sequence[PublishedRow], graphs: Mapping[str, Callable[[Path], str]] | None = None,
                directory: Path | None = None, sequence_graphs: Mapping[str, Callable[[Path, int], str]] | None = None) -> list[Compared]:  # fmt: skip
    out = []
    for row in rows:
        path, note = graph_path(row.graph, graphs, directory, row.seq, sequence_graphs)
        out.append(estimate_row(row, path, note))
    return out


@dataclass(frozen=True)
class Validation:
    """The leave-one-source-out result: per source the factors fitted without it, and the fit on every row."""

    folds: dict[str, tuple[Params, list[str]]]
    all_rows: tuple[Params, list[str]]


def validate(compared: Sequence[Compared]) -> tuple[list[Compared], Validation | None]:
    """Each row with its leave-one-source-out prediction (factors fitted on the other sources only)."""
    from dataclasses import replace

    works = [c.work for c in compared if c.work is not None]
    if len({w.group for w in works}) < 2:
        return list(compared), None
    folds, everything = leave_one_source_out(works)
    out = []
    for c in compared:
        if c.work is None:
            out.append(c)
            continue
        params = folds[c.work.group][0]
        dla = c.row.value / c.work.value  # 1 + the DLAs' share for a GPU + DLA throughput row (the fit predicts the GPU's)
        out.append(replace(c, loso_value=predicted(c.work, params) * dla, loso_params=params))
    return out, Validation(folds, everything)


# ---------------------------------------------------------------------------------------------- rendering


def _fmt(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def _figure(row: PublishedRow) -> str:
    unit = "ms" if row.metric == "latency_ms" else "/s"
    return f"{_fmt(row.value)} {unit} ([{row.source['title']}]({row.source['url']}))"


def render_table(compared: Sequence[Compared]) -> str:
    header = ["source", "module", "mode", "model", "precision", "batch", "published figure (source)", "estimate (default factors)",
              "error", "estimate (factors fitted without this source)", "its error", "ONNX nodes -> layers"]
    rows = []
    for c in compared:
        r = c.row
        unit = "ms" if r.metric == "latency_ms" else "/s"
        loso = (f"{_fmt(c.loso_value)} {unit}", f"{c.loso_error * 100:+.0f} %") if c.loso_value is not None else ("-", "-")  # type: ignore[operator]
        rows.append([r.group, r.module, r.power_mode, r.model, r.precision, r.batch, _figure(r), f"{_fmt(c.estimate_value)} {unit}",
                     f"{c.error * 100:+.0f} %", *loso, f"{c.nodes} -> {c.layers}"])  # fmt: skip
    return markdown_table(header, rows, right_aligned=(5, 7, 8, 9, 10, 11))


def render_conditions(compared: Sequence[Compared]) -> str:
    lines = []
    for c in compared:
        r = c.row
        cond = f" Conditions from [{r.conditions_source['title']}]({r.conditions_source['url']})." if r.conditions_source else ""
        lines.append(f"* **{r.id}**: {r.measured}; {r.engine}; {r.software}; input {r.input or r.shape}.{cond} "
                     f"Graph: {c.graph_note} ({c.gops:.1f} GOPs at {r.shape}). {r.seq_note + ' ' if r.seq_note else ''}{r.notes}".rstrip())  # fmt: skip
    return "\n".join(lines)


def median_abs_error(compared: Sequence[Compared]) -> float:
    return statistics.median(abs(c.error) for c in compared)


def error_summary(errors: Sequence[float]) -> str:
    """'median 23 % (2 to 310 %), 40 of 56 within 35 %, 3 off by more than 2x'."""
    absolute = [abs(e) for e in errors]
    over_2x = sum(1 for e in errors if e >= 1.0 or e <= -0.5)
    return (f"median absolute error **{statistics.median(absolute) * 100:.0f} %** (range {min(absolute) * 100:.0f} to "
            f"{max(absolute) * 100:.0f} %), **{sum(1 for e in absolute if e <= 0.35)} of {len(errors)}** within 35 %, "
            f"{over_2x} off by 2x or more")  # fmt: skip


def render_validation(compared: Sequence[Compared], validation: Validation | None) -> str:
    if validation is None:
        return "Leave-one-source-out: fewer than two sources with TensorRT layer work, no validation."
    lines = ["| source left out | rows | factors fitted on the other sources | its rows' median error (default factors) | its rows' median error (fitted without it) |",
             "|---|---:|---|---:|---:|"]  # fmt: skip
    for group, (params, edges) in validation.folds.items():
        mine = [c for c in compared if c.work is not None and c.work.group == group]
        default = statistics.median(abs(c.error) for c in mine)
        held_out = statistics.median(abs(c.loso_error) for c in mine)  # type: ignore[arg-type]
        edge = f" ({'; '.join(edges)})" if edges else ""
        lines.append(f"| {group} | {len(mine)} | {params.describe()}{edge} | {default * 100:.0f} % | {held_out * 100:.0f} % |")
    params, edges = validation.all_rows
    edge = f" ({'; '.join(edges)})" if edges else ""
    lines += ["", f"Fitted on all {sum(1 for c in compared if c.work is not None)} rows (in-sample, for reference only: "
                  f"not a validation): {params.describe()}{edge}."]  # fmt: skip
    return "\n".join(lines)


def render_section(compared: Sequence[Compared], analysis: str, when: str, validation: Validation | None = None) -> str:
    """The whole `## Against published Jetson figures` section (heading included, ending with a newline)."""
    from edgekit.estimate.roofline import TENSORRT_EFFICIENCY, TENSORRT_LAYER_LAUNCH_US, TENSORRT_MEMORY_SHARE

    groups = sorted({c.row.group for c in compared})
    modules = sorted({c.row.target for c in compared})
    summary = [f"{len(compared)} rows from {len(groups)} sources ({', '.join(groups)}) on {len(modules)} modules ({', '.join(modules)}).",
               "", f"* **Default factors** (`edgekit estimate` as shipped): {error_summary([c.error for c in compared])}."]  # fmt: skip
    scored = [c for c in compared if c.loso_error is not None]
    if scored:
        summary.append(f"* **Leave one source out** (each row predicted with factors fitted only on the OTHER sources): "
                       f"{error_summary([c.loso_error for c in scored])}.")  # type: ignore[misc]
    parts = [
        HEADING, "",
        "Published figures, each with its source and conditions in `docs/benchmarks/published_jetson.yaml`, against "
        "`edgekit estimate` on the matching target and power mode, at the published precision and batch. On these NVIDIA "
        "targets the estimate times the graph as TensorRT runs it (`edgekit/estimate/tensorrt_layers.py`: conv / GEMM "
        "epilogues, pointwise chains and attention fused, Q/DQ folded, views and concats free, tile and wave fill, TF32 for "
        "FP32) with per-layer-class efficiency and a launch cost per layer. Default factors: "
        + ", ".join(f"{k} {v:g}" for k, v in sorted(TENSORRT_EFFICIENCY.items()))
        + f"; memory at {TENSORRT_MEMORY_SHARE:g} of the bandwidth; {TENSORRT_LAYER_LAUNCH_US:g} us a layer (priors, not "
        "fitted to these rows). Error = (estimate - published) / published; for a throughput row a positive error means "
        "the estimate promises more than was measured. Regenerate with `python scripts/estimate_published.py` (graphs "
        f"built offline, cached in `~/.cache/edgekit/published`). Run {when}.",
        "", *summary, "", render_table(compared), "",
        "### Leave-one-source-out validation", "",
        "The fit varies five numbers on a grid (`scripts/published_fit.py`): a scale on the efficiency of FP16 / FP32 "
        "layers, a scale on that of INT8 layers, the share of bandwidth a layer streams at, the launch cost per layer and a "
        "fixed cost per call (what each source's timing wraps around the engine), minimising the absolute log error over "
        "the rows it is given with every source weighing the same (a source's mean, then the mean over sources); where "
        "several grid points score the same (a number the rows do not constrain) the one nearest the priors is kept. The "
        "objective may add a pull toward the priors; its strength is chosen per fold by a leave-one-source-out over that "
        "fold's training sources alone (nested), never on the source being scored. Each source's rows are predicted by "
        "the factors fitted on the other sources only; nothing is fitted per row.", "",
        render_validation(compared, validation), "",
        "Conditions per row:", "", render_conditions(compared), "",
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
    compared, validation = validate(compare_all(rows))
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = render_section(compared, ANALYSIS, when, validation)
    args.out.write_text(replace_section(args.out.read_text() if args.out.is_file() else "", section))
    if args.json:
        args.json.write_text(json.dumps([{"id": c.row.id, "source": c.row.group, "published": c.row.value, "metric": c.row.metric,
                                          "estimate": c.estimate_value, "error": c.error, "loso_estimate": c.loso_value,
                                          "loso_error": c.loso_error, "loso_factors": c.loso_params.describe() if c.loso_params else None,
                                          "p50_ms": c.p50_ms, "throughput_per_s": c.throughput_per_s, "engine": c.engine,
                                          "gops": c.gops, "hardware": list(c.hardware_notes), "shares": c.shares,
                                          "nodes": c.nodes, "layers": c.layers, "assumptions": list(c.assumptions)}
                                         for c in compared], indent=2))  # fmt: skip
    for c in compared:
        loso = f"loso {c.loso_error * 100:+6.0f} %" if c.loso_error is not None else ""
        print(f"{c.row.id:58s} published {c.row.value:10.4g} estimate {c.estimate_value:10.4g} error {c.error * 100:+6.0f} % {loso}")
    print(f"default: {error_summary([c.error for c in compared])}")
    scored = [c.loso_error for c in compared if c.loso_error is not None]
    if scored:
        print(f"leave one source out: {error_summary(scored)}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
