from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Estimates read a default calibration file and cache the host peak: keep both out of ~/.cache."""
    monkeypatch.setenv("EDGEKIT_CACHE_DIR", str(tmp_path_factory.mktemp("edgekit-cache")))
