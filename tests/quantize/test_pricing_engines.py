"""The search's time budget with another engine's candidates (OpenVINO's on x86-64-cpu), issue 29: one rule for every
candidate of either engine. Each one's seconds are spent from the budget (so ``auto`` stays within its multiple of a
plain int8 build: MiniLM's ran 3.1x when OpenVINO's compiles were added to the budget instead), and each is priced by
what its kind took: a compile like any candidate without calibration, NNCF's int8 like a calibrating one."""

from __future__ import annotations

import time

from edgekit.precision import Precision
from edgekit.quantize.candidates import Candidate
from edgekit.quantize.pricing import CALIBRATING, CHEAP, TimeBudget


class _Builder:
    """What TimeBudget reads of the search's builder: no ranges held, nothing cached."""

    cached_calibration_s = 0.0
    auto_only_s = 0.0

    def has_ranges(self, candidate: Candidate) -> bool:
        return candidate.engine == "openvino"  # OpenVINO's int8 compiles int8-static's file


def _budget(spent_s: float, budget_s: float = 2.0) -> TimeBudget:
    return TimeBudget(_Builder(), started=time.perf_counter() - spent_s, time_budget_s=budget_s)


def _openvino(name: str, precision: Precision, **kwargs: object) -> Candidate:
    return Candidate(name, precision, None, "openvino", engine="openvino", **kwargs)  # type: ignore[arg-type]


def test_another_engines_compiles_are_spent_and_priced_like_any_candidate_without_calibration() -> None:
    dynamic = Candidate("int8-dynamic", Precision.INT8, None, "exported")
    budget = _budget(1.2)
    for name, precision in (("openvino-bf16", Precision.BF16), ("openvino-fp32", Precision.FP32)):
        budget.record(_openvino(name, precision, baseline=True), "passed", 0.45, first=False, timing_s=0.0)
    assert budget.costs == [(CHEAP, 0.45), (CHEAP, 0.45)]  # what a compile took prices the next cheap candidate, of either engine
    assert budget.expected_cost(dynamic) == (CHEAP, 0.45)
    assert budget.over_budget(dynamic) is None  # 1.2 s + 0.45 s expected < 2 s
    late = _budget(1.7)
    late.record(_openvino("openvino-bf16", Precision.BF16, baseline=True), "passed", 0.45, first=False, timing_s=0.0)
    why = late.over_budget(dynamic)  # the compile's seconds count as spent: nothing is added back for another engine
    assert why is not None and "time budget would overrun" in why and "another engine" not in why


def test_a_candidate_that_calibrates_itself_is_priced_at_the_calibrating_kind_whichever_engine() -> None:
    first = Candidate("int8-static", Precision.INT8, None, "exported")
    nncf = _openvino("openvino-nncf-int8", Precision.INT8, calibrates_itself=True)
    budget = _budget(3.0, budget_s=10.0)
    budget.record(first, "passed", 3.0, first=True, timing_s=0.0)
    budget.record(Candidate("int8-dynamic", Precision.INT8_DYNAMIC, None), "passed", 0.5, first=False, timing_s=0.0)
    assert budget.calibrates(nncf) and budget.expected_cost(nncf) == (CALIBRATING, budget.first_s)
    budget.record(nncf, "failed", 6.0, first=False, timing_s=0.0)
    assert (CALIBRATING, 6.0) in budget.costs  # what it took prices the next calibrating candidate
    assert budget.expected_cost(nncf)[1] == 6.0


def test_a_run_off_is_paid_from_what_is_left_of_the_budget() -> None:
    budget = _budget(1.0, budget_s=2.0)
    rounds, why = budget.runoff_rounds(2, 0, timing_s=0.3, models_timed=6, wanted=5, fewest=3)
    assert (rounds, why) == (5, "")  # 0.05 s a model, 0.15 s a round of 3: 1 s left pays for 5
    tight = _budget(1.8, budget_s=2.0)
    rounds, why = tight.runoff_rounds(2, 0, timing_s=0.3, models_timed=6, wanted=5, fewest=3)
    assert rounds == 0 and "pays for 1 of the 3 rounds a run-off needs" in why
    unbounded = TimeBudget(_Builder())
    assert unbounded.runoff_rounds(3, 1, timing_s=5.0, models_timed=2, wanted=5, fewest=3) == (5, "")
