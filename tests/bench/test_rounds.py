"""Interleaved timing splits the runs asked for over its rounds: exactly that many, never 5 for 3 or 7."""

from __future__ import annotations

import pytest

from edgekit.bench.compare import round_sizes
from edgekit.errors import EdgekitError


@pytest.mark.parametrize(("iterations", "sizes"), [(1, [1]), (3, [1, 1, 1]), (5, [1] * 5), (7, [2, 2, 1, 1, 1]), (50, [10] * 5)])
def test_round_sizes_add_up_to_the_request(iterations: int, sizes: list[int]) -> None:
    assert round_sizes(iterations, 5) == sizes and sum(sizes) == iterations


@pytest.mark.parametrize("iterations", [0, -3])
def test_no_runs_is_an_error(iterations: int) -> None:
    with pytest.raises(EdgekitError, match=f"--iterations must be 1 or more, not {iterations}"):
        round_sizes(iterations, 5)
