"""The agent's own configuration file as hostile input: it is read with the same limited YAML reader as
recipes and target profiles (:mod:`edgekit_runtime.yaml_limited`), so an alias bomb, deep or recursive
nesting, a huge or non-UTF-8 file or a duplicate key is a named :class:`AgentConfigError` (exit code 2
from ``edgekit-agent check``), in bounded time and memory, never a hang or a traceback."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import edgekit.config
from edgekit_runtime import yaml_limited
from edgekit_runtime.agent.cli import EXIT_CONFIG
from edgekit_runtime.agent.cli import main as agent_main
from edgekit_runtime.agent.config import load_config
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.yaml_limited import MAX_YAML_BYTES, MAX_YAML_DEPTH


def alias_bomb(levels: int = 9) -> str:
    """2.5 KB of anchors, each a list of nine aliases of the one before (9^9 = 387 million strings)."""
    lines = ['l0: &l0 "lol"']
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def load_error(path: Path) -> str:
    with pytest.raises(AgentConfigError) as info:
        load_config(path)
    return str(info.value)


def test_the_host_and_the_agent_share_one_reader() -> None:
    assert edgekit.config.MAX_CONFIG_DEPTH == yaml_limited.MAX_YAML_DEPTH
    assert edgekit.config.parse_yaml_limited is yaml_limited.parse_yaml_limited
    assert edgekit.config.read_limited_bytes is yaml_limited.read_limited_bytes


def test_an_alias_bomb_in_the_agent_config_is_refused_in_bounded_time_and_memory(
    agent_config: Callable[..., Path], capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    path = agent_config()
    path.write_text(path.read_text(encoding="utf-8") + alias_bomb(), encoding="utf-8")
    assert path.stat().st_size < 4000
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    message = load_error(path)
    assert time.perf_counter() - start < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200_000  # KiB
    assert "alias bomb" in message and "larger than 100,000 values with its aliases expanded" in message
    assert message.startswith(f"{path}:26:10: alias *l5 makes the document larger")
    # Through the agent's CLI: a configuration error, exit code 2, no traceback.
    assert agent_main(["check", "--config", str(path)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "alias bomb" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("device_id: &loop\n  again: *loop\n", ":2:10: alias *loop is inside the collection &loop it refers to (a recursive alias)"),
        ("x: " + "[" * 5000 + "]" * 5000 + "\n", f"nests deeper than {MAX_YAML_DEPTH} levels of mappings and sequences"),
        ("device_id: dev-1\nfleet: lab\ndevice_id: dev-2\n", ":3:1: key 'device_id' appears twice (first on line 1)"),
        ("device_id: \"\\ud800\"\n", "this string holds a lone surrogate escape (U+D800)"),
        ("device_id: dev\x07\n", ":1:15: character U+0007 at character offset 14 is not allowed in YAML"),
        ("# nothing but a comment\n", "the agent configuration is empty"),
    ],
    ids=["recursive-alias", "5000-deep", "duplicate-key", "surrogate", "control-character", "empty"],
)
def test_malformed_agent_configs_are_named_errors(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    message = load_error(path)
    assert fragment in message and str(path) in message


def test_non_utf8_and_oversized_agent_configs_are_refused_before_parsing(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"device_id: dev-1\nfleet: caf\xe9\n")
    assert f"{latin1}:2:11: byte 0xe9 at byte offset 27 is not UTF-8" in load_error(latin1)
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"device_id: dev-1\n" + b"#" * MAX_YAML_BYTES + b"\n")
    message = load_error(huge)
    assert f"the agent configuration is {huge.stat().st_size:,} bytes; configuration files are read up to {MAX_YAML_BYTES:,} bytes" in message
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    assert "agent configuration not found: " in load_error(folder) and "(it is a directory)" in load_error(folder)
