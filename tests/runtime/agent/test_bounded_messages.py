"""Limits on untrusted JSON (size, depth) and on what the agent says about it (quotations, event size)."""

from __future__ import annotations

import json
import struct

import pytest

from edgekit_runtime.agent.bounded import MAX_EVENT_BYTES, bound_event, excerpt, excerpt_bytes
from edgekit_runtime.agent.telemetry import build_event, encode_message
from edgekit_runtime.agent.wire import BINARY_CONTENT_TYPE, JsonLimitError, decode_binary, json_depth, loads_limited
from edgekit_runtime.errors import InputSignatureError
from edgekit_runtime.schemas import schema_problems, validate_message


@pytest.mark.parametrize(("text", "depth"), [
    ("1", 0), ("[]", 1), ('{"a": [1, {"b": []}]}', 4), ('"[[[["', 0), ('["]]]\\"[[[", [[]]]', 3),
    ('{"a": "\\\\"}', 1), ("[" * 5000, 5000),
])  # fmt: skip
def test_json_depth_counts_brackets_outside_strings(text: str, depth: int) -> None:
    assert json_depth(text) == depth


def test_loads_limited_refuses_before_parsing() -> None:
    with pytest.raises(JsonLimitError) as deep:
        loads_limited(b"[" * 5000, what="command payload", max_bytes=65536, max_depth=16)
    assert deep.value.message == "command payload nests arrays and objects 5000 levels deep, more than the limit of 16"
    assert deep.value.hint == "flatten the JSON to at most 16 levels"
    with pytest.raises(JsonLimitError, match=r"^command payload is 70000 bytes, more than the limit of 65536 bytes"):
        loads_limited(b" " * 70000, what="command payload", max_bytes=65536, max_depth=16)
    with pytest.raises(JsonLimitError, match=r"^x is not UTF-8: byte 1 \(invalid start byte\)"):
        loads_limited(b"[\xff]", what="x", max_bytes=100, max_depth=4)
    with pytest.raises(JsonLimitError, match=r"^x is not valid JSON: Expecting value: line 1 column 2"):
        loads_limited("[", what="x", max_bytes=100, max_depth=4)
    assert loads_limited('{"a": ["[[[["]}', what="x", max_bytes=100, max_depth=2) == {"a": ["[[[["]}


def test_a_deep_binary_header_is_an_input_error_not_a_crash() -> None:
    header = b"[" * 3000
    header += b" " * (-(8 + len(header)) % 8)
    body = struct.pack("<4sI", b"EKT1", len(header)) + header
    with pytest.raises(InputSignatureError) as info:
        decode_binary(body)
    assert info.value.message == (f"{BINARY_CONTENT_TYPE} header nests arrays and objects 3000 levels deep, "
                                  "more than the limit of 8")  # fmt: skip


def test_schema_problems_quote_values_briefly_and_stop_at_the_limit() -> None:
    command = {"schema": "edgekit.command/1", "id": "x" * 100_000, "command": "y" * 5000, "args": [1] * 10_000}
    problems = schema_problems(command, "command.v1")
    assert "id: string of 100000 characters is longer than 128" in problems
    assert f"command: '{'y' * 116}... is not one of ['deploy', 'rollback', 'set_interval', 'ping', 'deploy_pipeline']" in problems
    assert "args: <list of 10000 items> is not of type object" in problems
    assert max(len(p) for p in problems) < 300
    assert len(schema_problems(command, "command.v1", limit=1)) == 1


def test_excerpts_say_how_much_was_cut() -> None:
    assert excerpt("short") == "short"
    cut = excerpt("a" * 1000, 100)
    assert len(cut) == 100 and cut.endswith("...[truncated: 1000 characters]")
    raw = excerpt_bytes(b"\xff" + b"[" * 4999)
    assert len(raw) <= 200 and raw.startswith("\ufffd[[") and raw.endswith("...[truncated: 5000 bytes]")


def _event(**details: object) -> dict[str, object]:
    return build_event(device="dev-1", fleet="lab", kind="deploy_result", level="error", message="deploy failed",
                       command_id="c-1", details=details)  # fmt: skip


def test_a_huge_event_is_bounded_and_keeps_its_outcome() -> None:
    problems = "\n  - ".join(f"unlisted: extra/{'n' * 200}-{index} (not in manifest.json files)" for index in range(3000))
    event = _event(outcome="failed", step="files", error=f"bundle failed verification:\n  - {problems}",
                   files=[f"extra/{index}" for index in range(20_000)], nested={"a": {"b": {"c": {"d": {"e": {"f": {"g": 1}}}}}}})  # fmt: skip
    original = len(encode_message(event))
    assert original > 800_000
    bounded = bound_event(event)
    size = len(encode_message(bounded))
    assert size <= MAX_EVENT_BYTES
    validate_message(bounded, "event.v1")
    details = bounded["details"]
    assert details["outcome"] == "failed" and details["step"] == "files"  # type: ignore[index]
    assert details["truncated_from_bytes"] == original  # type: ignore[index]
    assert details["error"].startswith("bundle failed verification:\n  - unlisted: extra/nnn")  # type: ignore[index]
    assert details["error"].endswith(f"...[truncated: {len(event['details']['error'])} characters]")  # type: ignore[index]
    assert details["files"][-1] == "[19968 more items truncated]"  # type: ignore[index]
    assert "nested too deep: truncated" in json.dumps(details["nested"])  # type: ignore[index]
    assert bounded["command_id"] == "c-1" and bounded["message"] == "deploy failed" and bounded["event_id"] == event["event_id"]


def test_a_small_event_is_unchanged() -> None:
    event = _event(outcome="succeeded")
    assert bound_event(event) == event
