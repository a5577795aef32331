"""The corpus's verdicts and its markdown: per model, is ``auto`` at least as fast as the fastest peer that meets the
model's task-metric budget (ONNX Runtime's quantizers, and OpenVINO's peers in a run with them; faster than FP32 where
none does), and did its build
take at most :data:`BUILD_RATIO_GOAL` times a plain ``int8`` build. Pure functions of :class:`CorpusRow`s,
so a table can be re-rendered from ``docs/benchmarks/corpus.json``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from edgekit.corpus.run import CALLS_PER_ROUND, HOST_TARGET, OPENVINO_PEERS, PEERS, CorpusRow

#: The issue's goals: auto wins on this share of the models, and builds within this multiple of int8.
WIN_GOAL = 0.8
BUILD_RATIO_GOAL = 3.0


@dataclass(frozen=True)
class ModelVerdict:
    model: str
    chosen: str | None  # what auto chose
    auto_x_fp32: float | None
    against: str  # the variant auto is judged against: a peer from PEERS, "fp32", or "" (no comparison)
    ratio: float | None  # auto's p50 over the comparator's
    ratio_iqr: tuple[float, float] | None  # interquartile range of the per-round ratios
    win: bool  # meets or beats: a win by timing, or a same-configuration tie
    reason: str  # why it wins or loses, in words
    build_ratio: float | None  # auto build s / int8 build s
    auto_build_s: float | None
    int8_build_s: float | None
    other_targets: str  # per non-host target: bundles built and golden checks passed
    #: the comparator auto's choice runs the same configuration as (engine, precision and graph; or FP32's own file): the
    #: verdict is a tie by construction, whatever the timing says ("" where it is not)
    same_as: str = ""

    @property
    def tie(self) -> bool:
        return bool(self.same_as)

    @property
    def within_noise(self) -> bool:
        """The per-round ratios straddle 1.0: a win or a loss this small is not told apart from noise."""
        return self.ratio_iqr is not None and self.ratio_iqr[0] <= 1.0 <= self.ratio_iqr[1]

    @property
    def build_ok(self) -> bool | None:
        return None if self.build_ratio is None else self.build_ratio <= BUILD_RATIO_GOAL


def per_round_iqr(numerator: CorpusRow, denominator: CorpusRow) -> tuple[float, float] | None:
    """Interquartile range of the ratio of two variants' round medians (they ran in the same rounds)."""
    pairs = [(a / b) for a, b in zip(numerator.round_ms, denominator.round_ms) if b > 0]
    if len(pairs) < 2:
        return None
    low, high = np.percentile(pairs, [25, 75])
    return float(low), float(high)


def _other_targets(rows: Sequence[CorpusRow]) -> str:
    parts = []
    for target in dict.fromkeys(r.target for r in rows if r.target != HOST_TARGET and r.variant not in PEERS):
        mine = [r for r in rows if r.target == target]
        built = [r for r in mine if r.error is None]
        passed = [r for r in built if (r.golden or "").startswith("pass")]
        parts.append(f"{target}: built {len(built)}/{len(mine)}, golden {len(passed)}/{len(built)}")
    return "; ".join(parts)


def model_verdict(model: str, rows: Sequence[CorpusRow]) -> ModelVerdict:
    """The issue's verdict for one model from its rows (host-target rows decide; other targets are listed)."""
    host = {r.variant: r for r in rows if r.target == HOST_TARGET}
    auto, int8, fp32 = host.get("auto"), host.get("int8"), host.get("fp32")
    build_ratio = None
    if auto and int8 and auto.error is None and int8.error is None and auto.build_s and int8.build_s:
        build_ratio = auto.build_s / int8.build_s

    def verdict(win: bool, reason: str, against: str = "", ratio: float | None = None, iqr: tuple[float, float] | None = None,
                same_as: str = "") -> ModelVerdict:
        return ModelVerdict(model, auto.chosen if auto else None, auto.x_fp32 if auto else None, against, ratio, iqr, win, reason,
                            build_ratio, auto.build_s if auto else None, int8.build_s if int8 else None, _other_targets(rows), same_as)

    failed = next((r for r in rows if r.variant == "-"), None)
    if failed is not None:
        return verdict(False, f"not run: {failed.error}")
    if auto is None:
        return verdict(False, f"auto not built for {HOST_TARGET}")
    if auto.error is not None:
        return verdict(False, f"auto failed: {auto.error}")
    if auto.p50_ms is None or fp32 is None or fp32.p50_ms is None:
        return verdict(False, "not timed (no FP32 bundle to compare with)")
    if auto.meets_budget is False:
        return verdict(False, f"auto is outside the budget here ({auto.metric_name} {auto.metric:.4f} < {auto.min_value:g})")
    in_budget = [host[p] for p in PEERS if p in host and host[p].p50_ms is not None and host[p].meets_budget]
    if in_budget:
        peer = min(in_budget, key=lambda r: r.p50_ms or 0.0)
        assert peer.p50_ms
        ratio = auto.p50_ms / peer.p50_ms
        if auto.config is not None and auto.config == peer.config:
            return verdict(True, f"same configuration as {peer.variant} ({auto.config}): meets (tie by construction)", peer.variant, ratio,
                           per_round_iqr(auto, peer), same_as=peer.variant)
        win = ratio <= 1.0
        return verdict(win, f"{'at least as fast as' if win else 'slower than'} {peer.variant}", peer.variant, ratio, per_round_iqr(auto, peer))
    ratio = auto.p50_ms / fp32.p50_ms
    if auto.model_sha256 is not None and auto.model_sha256 == fp32.model_sha256:
        # FP32 is the budget-meeting choice when no peer meets the budget, and auto kept it: the same file, so any gap is noise.
        return verdict(True, f"no {_peers_word(rows)} meets the budget; auto kept FP32's own file, which does: same configuration as FP32, "
                       "meets (tie by construction)", "fp32", ratio, per_round_iqr(auto, fp32), same_as="fp32")
    win = ratio < 1.0
    return verdict(win, f"no {_peers_word(rows)} meets the budget; {'faster' if win else 'not faster'} than FP32", "fp32", ratio, per_round_iqr(auto, fp32))


def with_openvino(rows: Iterable[CorpusRow]) -> bool:
    """The run had OpenVINO's peers (``scripts/corpus.py --openvino``)."""
    return any(r.variant in OPENVINO_PEERS for r in rows)


def _peers_word(rows: Sequence[CorpusRow]) -> str:
    return "peer (ORT or OpenVINO)" if with_openvino(rows) else "ORT quantizer"


def _short(variant: str) -> str:
    return variant.removeprefix("ort-quantize_")


def model_verdicts(rows: Iterable[CorpusRow]) -> list[ModelVerdict]:
    """One verdict per model, in the order the models first appear."""
    rows = list(rows)
    return [model_verdict(name, [r for r in rows if r.model == name]) for name in dict.fromkeys(r.model for r in rows)]


# ---------------------------------------------------------------- markdown


def _fmt(value: float | None, pattern: str) -> str:
    return "" if value is None else format(value, pattern)


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def _latency(row: CorpusRow) -> str:
    if row.p50_ms is not None:
        spread = f" ({row.p25_ms:.2f}–{row.p75_ms:.2f})" if row.p25_ms is not None and row.p75_ms is not None else ""
        return f"{row.p50_ms:.2f}{spread}"
    if row.estimate_p50_ms is not None:
        return f"est. {row.estimate_p50_ms:.3g}" + (f" ({row.estimate_engine})" if row.estimate_engine else "")
    return ""


def _budget(row: CorpusRow) -> str:
    if row.meets_budget is None:
        return ""
    return f"{'yes' if row.meets_budget else '**no**'} (≥ {row.min_value:g})"


def results_table(rows: Sequence[CorpusRow]) -> list[str]:
    lines = [
        f"| model | target | variant | size MB | build s | latency ms (IQR) | × FP32 | × {'best peer' if with_openvino(rows) else 'ORT'} in budget | "
        "task metric | meets budget | cosine | golden | notes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        notes = "; ".join([*([f"chose {r.chosen}"] if r.chosen else []), *r.notes, *([f"error: {r.error}"] if r.error else [])])
        metric = f"{r.metric_name} {r.metric:.4f}" if r.metric is not None else ""
        peer = f"{r.x_best_ort:.2f} ({_short(r.best_ort)})" if r.x_best_ort is not None and r.best_ort else ""
        lines.append(f"| {r.model} | {r.target} | {r.variant} | {_fmt(r.size_bytes and r.size_bytes / 1e6, '.2f')} | {_fmt(r.build_s, '.1f')} | "
                     f"{_latency(r)} | {_fmt(r.x_fp32, '.2f')} | {peer} | {metric} | {_budget(r)} | {_fmt(r.cosine, '.4f')} | "
                     f"{_cell(r.golden or '')} | {_cell(notes)} |")
    return lines


def summary(verdicts: Sequence[ModelVerdict], rounds: int, openvino: bool = False) -> list[str]:
    """The per-model verdict table and the two counts the issue's Done-when asks for. ``openvino``: the peers include
    OpenVINO's (the verdict is then against the fastest budget-meeting peer of either engine)."""
    peers = ("fastest peer that also meets the budget among ONNX Runtime's quantizers and OpenVINO (default precision, strict f32, NNCF int8)"
             if openvino else "faster ONNX Runtime quantizer that also meets the budget")
    lines = [
        "### Verdict per model",
        "",
        f"`auto` (with the recipe's task-metric budget) against the {peers} on "
        f"{HOST_TARGET}, or against FP32 when none does: a win is auto's median latency ≤ the peer's (< FP32's). "
        f"{rounds} interleaved rounds of {CALLS_PER_ROUND} timed calls per variant; the IQR is the interquartile range of the "
        "per-round ratios, so a ratio whose IQR holds 1.0 is within this host's noise.",
        "",
        "| model | auto chose | auto × FP32 | auto × comparator (which) | per-round IQR | verdict | auto build s / int8 build s | other targets |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        against = f"{v.ratio:.2f} ({_short(v.against) if v.against != 'fp32' else 'FP32'})" if v.ratio is not None else ""
        iqr = f"{v.ratio_iqr[0]:.2f}–{v.ratio_iqr[1]:.2f}" if v.ratio_iqr else ""
        word = "tie (same configuration)" if v.tie else ("win" if v.win else "**lose**") + (" (within noise)" if v.within_noise else "")
        build = (f"{v.auto_build_s:.1f} / {v.int8_build_s:.1f} = {v.build_ratio:.1f}×{'' if v.build_ok else ' **> 3×**'}"
                 if v.build_ratio is not None and v.auto_build_s is not None and v.int8_build_s is not None else "")
        lines.append(f"| {v.model} | {_cell(v.chosen or '')} | {_fmt(v.auto_x_fp32, '.2f')} | {against} | {iqr} | {word}: {_cell(v.reason)} | "
                     f"{build} | {_cell(v.other_targets)} |")
    total = len(verdicts)
    wins = sum(v.win for v in verdicts)
    ties = sum(v.tie for v in verdicts)
    noisy_losses = sum((not v.win) and v.within_noise for v in verdicts)
    needed = int(np.ceil(WIN_GOAL * total))
    timed_builds = [v for v in verdicts if v.build_ok is not None]
    fast_builds = sum(bool(v.build_ok) for v in timed_builds)
    lines += [
        "",
        f"**{wins} of {total} models: auto meets or beats the {'fastest budget-meeting peer (ORT or OpenVINO)' if openvino else 'better budget-meeting ORT quantizer'}** (faster than FP32 where none "
        f"meets the budget); the goal is {WIN_GOAL:.0%} ({needed} of {total}): {'met' if total and wins >= needed else '**not met**'}. "
        f"{wins - ties} win(s) by timing, {ties} same-configuration tie(s) (auto's choice is the comparator's engine, precision and "
        f"graph, or FP32's own file where no peer meets the budget), {total - wins} loss(es), {noisy_losses} of them within the per-round noise.",
        "",
        f"**auto ≤ {BUILD_RATIO_GOAL:g}× int8 build time on {fast_builds} of {total} models**"
        + (f" ({total - len(timed_builds)} without both builds)" if len(timed_builds) < total else "") + ".",
    ]
    return lines
