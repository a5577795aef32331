"""Values the agent config took and then failed on at run time (review of the agent config): a time past what Python's
thread and socket timeouts hold (the API answered nothing, a thread restarted forever), an id with a trailing newline
(`$` matches before it), and a size so small it rounded to a 0-byte limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from edgekit_runtime.agent.config import MAX_SECONDS, load_config
from edgekit_runtime.errors import EdgekitError


def _config(tmp_path: Path, **top: Any) -> Path:
    doc: dict[str, Any] = {"device_id": "dev-1", "fleet": "lab", "api": {"address": "127.0.0.1:0"}, "power": {"sensor": "none"},
                           "telemetry": {"spool": {"path": str(tmp_path / "spool.db")}},
                           "bundles": {"dir": str(tmp_path / "b"), "allow_unsigned": True}}  # fmt: skip
    for key, value in top.items():
        doc[key] = {**doc[key], **value} if isinstance(value, dict) and isinstance(doc.get(key), dict) else value
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize(("section", "key"), [("api", "idle_timeout_s"), ("probe", "interval_s"), ("bundles", "download_max_s")])
def test_a_time_past_what_timeouts_hold_is_refused_naming_the_key(tmp_path: Path, section: str, key: str) -> None:
    with pytest.raises(EdgekitError) as caught:
        load_config(_config(tmp_path, **{section: {key: 10_000_000_000}}))
    assert f"{section}.{key}" in str(caught.value) and "<= 1e+09" in str(caught.value)
    assert load_config(_config(tmp_path, **{section: {key: MAX_SECONDS}}))  # the ceiling itself is taken


@pytest.mark.parametrize("key", ["device_id", "fleet"])
def test_an_id_with_a_trailing_newline_is_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(EdgekitError) as caught:
        load_config(_config(tmp_path, **{key: "dev-1\n"}))
    assert key in str(caught.value) and "may only hold letters, digits" in str(caught.value)


@pytest.mark.parametrize(("section", "key"), [("api", "max_request_mb"), ("api", "max_inflight_body_mb"),
                                              ("bundles", "max_download_mb")])  # fmt: skip
def test_a_size_that_rounds_to_nothing_is_refused(tmp_path: Path, section: str, key: str) -> None:
    with pytest.raises(EdgekitError) as caught:
        load_config(_config(tmp_path, **{section: {key: 0.0000001}}))
    assert f"{section}.{key}" in str(caught.value) and ">= 0.001" in str(caught.value)
    assert load_config(_config(tmp_path, **{section: {key: 0.5}}))
