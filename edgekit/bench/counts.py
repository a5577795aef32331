"""How many calls a build's benchmark times: the recipe's counts where it sets them, else as many as fit a time budget.

A build's ``bench`` stage timed 10 warm-up and 50 timed calls whatever a call cost; at about a second a call (a
classifier at a large ``opt`` batch on a loaded 2-core host) that was 64 s of a 256 s fp32 build. Without
``build.benchmark.warmup``/``iterations`` in the recipe, one probe call prices the model and the counts shrink to fit
:data:`BENCH_BUDGET_S`, never under :data:`MIN_TIMED_CALLS` timed calls nor over the defaults. Percentiles are
NumPy's linear interpolation (``edgekit_runtime.timing``): from fewer than 100 timed calls p99 lies between the two
largest samples (10 calls: 0.91 of the way from the 9th to the 10th), an interpolation rather than a measured tail,
and the report flags it as such (``edgekit.report.sections.percentile_label``). A recipe that sets a count gets exactly
what it asks for.
"""

from __future__ import annotations

import math

from edgekit.recipe import BenchmarkSpec

#: Seconds of timed calls a build's benchmark aims at when the recipe sets no counts.
BENCH_BUDGET_S = 10.0
#: Seconds of warm-up calls it aims at.
WARMUP_BUDGET_S = 2.0
#: Fewest timed calls a time-bounded benchmark makes.
MIN_TIMED_CALLS = 10
#: Fewest warm-up calls (after the probe call, which warms up too).
MIN_WARMUP_CALLS = 1


def recipe_sets_counts(spec: BenchmarkSpec) -> bool:
    return bool({"warmup", "iterations"} & spec.model_fields_set)


def bench_counts(spec: BenchmarkSpec, probe_ms: float) -> tuple[int, int, str]:
    """(warmup, iterations, why) for a benchmark whose one probe call took ``probe_ms``; the recipe's counts if it sets any."""
    if recipe_sets_counts(spec):
        return spec.warmup, spec.iterations, "recipe build.benchmark"
    per_call_s = max(probe_ms, 1e-3) / 1000
    iterations = min(spec.iterations, max(MIN_TIMED_CALLS, math.floor(BENCH_BUDGET_S / per_call_s)))
    warmup = min(spec.warmup, max(MIN_WARMUP_CALLS, math.floor(WARMUP_BUDGET_S / per_call_s)))
    if (warmup, iterations) == (spec.warmup, spec.iterations):
        return warmup, iterations, "defaults"
    return warmup, iterations, (f"time-bounded: a probe call took {probe_ms:.0f} ms, so {warmup} warm-up and {iterations} timed calls "
                                f"(about {BENCH_BUDGET_S:.0f} s; defaults {spec.warmup} and {spec.iterations}: set build.benchmark.iterations to time more)")
