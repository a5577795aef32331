"""The search's time budget with another engine's candidates (OpenVINO's on x86-64-cpu): the seconds they take are
added to the budget, so the search's own int8 candidates are not skipped for time because OpenVINO's were tried first
(ResNet's corpus search skipped ONNX Runtime's default int8 plan, 0.37x FP32, after 1.3 s on OpenVINO's three)."""

from __future__ import annotations

import time

from edgekit.precision import Precision
from edgekit.quantize.candidates import Candidate
from edgekit.quantize.pricing import TimeBudget


class _Builder:
    """What TimeBudget reads of the search's builder: no ranges held, nothing cached."""

    cached_calibration_s = 0.0
    auto_only_s = 0.0

    def has_ranges(self, candidate: Candidate) -> bool:
        return False


def _budget(spent_s: float) -> TimeBudget:
    return TimeBudget(_Builder(), started=time.perf_counter() - spent_s, time_budget_s=2.0)


def test_another_engines_candidates_do_not_spend_the_search_budget() -> None:
    dynamic = Candidate("int8-dynamic", Precision.INT8, None, "exported")
    first = Candidate("int8-static", Precision.FP32, None, "exported")
    budget = _budget(2.4)  # 2.4 s since the start of a 2 s search: spent, with only its own candidates
    budget.record(first, "passed", 0.5, first=False, timing_s=0.0)
    assert budget.over_budget(dynamic) is not None and "time budget spent" in budget.over_budget(dynamic)
    for name, precision in (("openvino-bf16", Precision.BF16), ("openvino-fp32", Precision.FP32), ("openvino-int8", Precision.INT8)):
        budget.record(Candidate(name, precision, None, "openvino", engine="openvino"), "passed", 0.45, first=False, timing_s=0.0)
    assert budget.other_engines_s == 1.35
    assert budget.over_budget(dynamic) is None  # 2.4 s - 1.35 s on OpenVINO: 1.05 s of 2 s spent, 0.5 s expected
    assert [kind for kind, _ in budget.costs] == ["a candidate without calibration"]  # OpenVINO's compiles price nothing of ours
    late = _budget(3.5)
    late.other_engines_s = 1.35
    why = late.over_budget(dynamic)
    assert why is not None and "not counting 1.4 s on another engine's candidates" in why
