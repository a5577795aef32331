"""``--shape`` sizes are 1 or more (review: ``--shape batch=0`` was accepted and estimated no work at "batch 1")."""

from __future__ import annotations

import pytest

from edgekit.bench import parse_dims
from edgekit.errors import EdgekitError


def test_dims_are_read() -> None:
    assert parse_dims("batch=8, seq=128") == {"batch": 8, "seq": 128}


def test_a_zero_dim_is_refused_with_its_name() -> None:
    with pytest.raises(EdgekitError, match=r"^--shape: batch must be >= 1, not 0") as caught:
        parse_dims("seq=4,batch=0")
    assert "--shape batch=1" in caught.value.hint
