"""The agent config's API limits and the spool's in-memory overflow bound: loaded typed, defaults, errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from edgekit_runtime.agent.api import AgentApi
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.agent.serving import InferenceServer


def test_api_limits_and_overflow_load_and_reach_the_api(agent_config: Callable[..., Path], tmp_path: Path) -> None:
    config = load_config(agent_config(
        api={"address": "127.0.0.1:0", "max_request_mb": 8, "max_header_kb": 4, "max_connections": 5,
             "idle_timeout_s": 30, "header_timeout_s": 2.5, "body_timeout_s": 20},
        telemetry={"interval_s": 10, "spool": {"path": str(tmp_path / "spool.db"), "overflow_messages": 50}},
    ))  # fmt: skip
    api_config = config.api
    assert (api_config.max_request_bytes, api_config.max_header_bytes, api_config.max_connections) == (8 << 20, 4096, 5)
    assert (api_config.idle_timeout_s, api_config.header_timeout_s, api_config.body_timeout_s) == (30, 2.5, 20)
    assert config.telemetry.spool.overflow_messages == 50
    api = AgentApi.from_config(InferenceServer(), api_config)
    assert (api.max_header_bytes, api.max_connections, api.header_timeout_s, api.body_timeout_s, api.idle_timeout_s) == (4096, 5, 2.5, 20, 30)

    defaults = load_config(agent_config())
    assert defaults.api.max_connections == 64 and defaults.api.max_header_bytes == 16384
    assert defaults.api.header_timeout_s == 10 and defaults.telemetry.spool.overflow_messages == 1000


@pytest.mark.parametrize(
    ("section", "key", "value", "fragment"),
    [
        ("api", "max_connections", 0, "api.max_connections: expected an integer >= 1, got 0"),
        ("api", "header_timeout_s", -1, "api.header_timeout_s: expected a number > 0, got -1"),
        ("api", "max_header_kb", "big", "api.max_header_kb: expected a number >= 1, got 'big'"),
        ("spool", "overflow_messages", 2.5, "telemetry.spool.overflow_messages: expected an integer >= 1, got 2.5"),
    ],
)
def test_bad_limits_name_the_file_and_key(agent_config: Callable[..., Path], tmp_path: Path, section: str, key: str,
                                          value: object, fragment: str) -> None:  # fmt: skip
    if section == "api":
        path = agent_config(api={"address": "127.0.0.1:0", key: value})
    else:
        path = agent_config(telemetry={"interval_s": 10, "spool": {"path": str(tmp_path / "s.db"), key: value}})
    with pytest.raises(AgentConfigError) as info:
        load_config(path)
    assert fragment in str(info.value) and str(path) in str(info.value)
