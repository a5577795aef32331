"""The leave-one-source-out fit of scripts/published_fit.py: separate FP16 / FP32 and INT8 scales, every source
weighing the same, the prior kept where the rows say nothing, and the DLAs' share in a left-out Offline row."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from scripts.published_fit import Params, RowWork, fit, leave_one_source_out, predicted, source_weights
from tests.estimate.test_published import ep


def _row(group: str, value: float, compute_ms: float, int8: bool = False, layers: int = 10, metric: str = "latency_ms",
         batch: int = 1) -> RowWork:  # fmt: skip
    return RowWork(f"{group}-{value}-{int8}", group, metric, value, batch, np.full(layers, compute_ms / layers / 1e3),
                   np.zeros(layers), np.full(layers, 0.5), np.full(layers, 1.0 if int8 else 0.0))  # fmt: skip


def test_int8_rows_alone_leave_the_fp16_scale_at_its_prior() -> None:
    # INT8 rows only, published at half the prior-efficiency time: INT8 efficiency x2, and nothing about FP16 / FP32
    rows = [_row("a", 1.0, 1.0, int8=True), _row("b", 2.0, 2.0, int8=True)]
    params, _ = fit(rows)
    assert params.int8_scale == pytest.approx(2.0, rel=0.01)
    assert params.compute_scale == 1.0  # unconstrained: the prior, not the grid's first point
    assert params.memory_share == 0.75  # these rows move no bytes: the prior share


def test_the_two_scales_are_independent() -> None:
    fp16 = _row("a", 2.0, 1.0)  # at the prior: x1
    int8 = _row("b", 1.0, 1.0, int8=True)  # twice as fast: x2
    params = Params(1.0, 2.0, 0.75, 0.0)
    assert predicted(fp16, params) == pytest.approx(2.0) and predicted(int8, params) == pytest.approx(1.0)


def test_every_source_weighs_the_same() -> None:
    rows = [_row("many", 2.0, 1.0) for _ in range(9)] + [_row("few", 1.0, 1.0)]
    weights = source_weights(rows)
    assert weights[:9].sum() == pytest.approx(0.5) and weights[9] == pytest.approx(0.5)


def test_a_left_out_gpu_and_dla_offline_row_gets_the_dla_share_back() -> None:
    # the fit predicts the GPU's share (the published throughput / (1 + DLA share)); the row is scored on the whole
    work = _row("a", 1000.0 / 1.5, 128.0, int8=True, metric="throughput_per_s", batch=256)
    others = [_row("b", 64.0, 128.0, int8=True)]
    compared = ep.Compared(row=_published("a", 1000.0), estimate_value=1000.0, p50_ms=0.0, throughput_per_s=1000.0,
                           engine="gpu", gops=0.0, graph_note="", hardware_notes=(), work=work)  # fmt: skip
    other = replace(compared, row=_published("b", 64.0, "latency_ms"), work=others[0])
    scored, _ = ep.validate([compared, other])
    params = leave_one_source_out([work, others[0]])[0]["a"][0]
    assert scored[0].loso_value == pytest.approx(predicted(work, params) * 1.5)


def _published(group: str, value: float, metric: str = "throughput_per_s") -> "ep.PublishedRow":
    return ep.PublishedRow(id=group, module="m", target="jetson-agx-orin-64gb", power_mode="MAXN", model="m", graph="g",
                           precision="int8", batch=256, shape={"batch": 256}, metric=metric, value=value, measured="m",
                           engine="GPU + 2 DLA", software="s", source={"url": "https://example.org", "title": "t"},
                           source_group=group)  # fmt: skip


def test_the_pull_toward_the_priors_is_chosen_on_the_training_sources_only() -> None:
    from scripts.published_fit import choose_prior_weight, error_matrix, grid, prior_distance

    # three sources that disagree (x2, x1, x0.5 of the prior time): fitting on two mispredicts the third, so the
    # nested choice pulls toward the priors; with two sources there is nothing to choose on
    rows = [_row("a", 2.0, 1.0), _row("b", 1.0, 1.0), _row("c", 0.5, 1.0), _row("d", 7.0, 1.0)]
    params = grid()
    errors = error_matrix(rows, params)
    distances = np.array([prior_distance(p) for p in params])
    assert choose_prior_weight(rows, errors, params, distances, [0, 1, 2]) > 0
    assert choose_prior_weight(rows, errors, params, distances, [0, 1]) == 0.0
    folds, _ = leave_one_source_out(rows)
    moved = [*rows[:3], _row("d", 70.0, 1.0)]  # d's own figure cannot change the factors d is scored with
    assert leave_one_source_out(moved)[0]["d"][0] == folds["d"][0]
