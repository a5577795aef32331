"""The event loop's per-layout decode and reply (agent/oip_layouts.py): a repeated request skips the JSON work
and gets exactly the answer ``decode_request`` / ``encode_reply`` give; anything else goes through them."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from edgekit_runtime.agent import oip_layouts
from edgekit_runtime.agent.oip import BINARY_TYPE, HEADER_LENGTH, decode_request, encode_reply
from edgekit_runtime.agent.oip_layouts import RequestLayouts
from edgekit_runtime.agent.oip_types import OipError
from edgekit_runtime.agent.serving import InferenceServer


def _binary_body(image: np.ndarray, *, outputs: list[dict[str, Any]] | None = None) -> tuple[str, bytearray]:
    header: dict[str, Any] = {"id": "r1", "inputs": [{"name": "image", "datatype": "FP32", "shape": list(image.shape),
                                                      "parameters": {"binary_data_size": image.nbytes}}]}  # fmt: skip
    if outputs is not None:
        header["outputs"] = outputs
    text = json.dumps(header).encode()
    return str(len(text)), bytearray(text + image.tobytes())


@pytest.fixture
def slot(server: InferenceServer) -> SimpleNamespace:
    return SimpleNamespace(server=server, name="tiny", ready=True, version="1")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counted = {"decode": 0, "encode": 0}

    def counting_decode(*args: Any) -> Any:
        counted["decode"] += 1
        return decode_request(*args)

    def counting_encode(*args: Any) -> Any:
        counted["encode"] += 1
        return encode_reply(*args)

    monkeypatch.setattr(oip_layouts, "decode_request", counting_decode)
    monkeypatch.setattr(oip_layouts, "encode_reply", counting_encode)
    return counted


def test_a_repeated_binary_request_is_decoded_and_answered_from_its_layout(slot: Any, calls: dict[str, int], images: np.ndarray) -> None:
    layouts = RequestLayouts()
    wanted = [{"name": "logits", "parameters": {"binary_data": True}}]
    for index in range(3):  # new tensor bytes each time, the same JSON header
        image = images[index : index + 1]
        length, body = _binary_body(image, outputs=wanted)
        expected_request, expected_feeds, expected_wanted, expected_default = decode_request(slot, "tiny", length, bytearray(body))
        layout, feeds = layouts.decode(slot, "tiny", length, body)
        assert layout.request == expected_request and layout.wanted == expected_wanted and layout.binary_default == expected_default
        np.testing.assert_array_equal(feeds["image"], expected_feeds["image"])
        assert feeds["image"].shape == (1, 1, 8, 8) and feeds["image"].dtype == np.float32
        outputs = slot.server.infer(feeds).outputs
        reply = layouts.encode(layout, slot, outputs)
        assert reply == encode_reply(expected_request, slot, outputs, expected_wanted, expected_default)
        assert reply[1] == BINARY_TYPE and HEADER_LENGTH in reply[2]
    assert calls == {"decode": 1, "encode": 1}  # the first request only


def test_a_deploy_starts_afresh(slot: Any, calls: dict[str, int], images: np.ndarray) -> None:
    layouts = RequestLayouts()
    length, body = _binary_body(images[:1])
    layouts.decode(slot, "tiny", length, bytearray(body))
    layouts.decode(slot, "tiny", length, bytearray(body))
    assert calls["decode"] == 1
    swapped = SimpleNamespace(server=SimpleNamespace(signature=slot.server.signature.__class__.from_manifest(
        slot.server.signature.to_dict())), name="tiny", ready=True, version="2")  # fmt: skip
    layouts.decode(swapped, "tiny", length, bytearray(body))
    assert calls["decode"] == 2


@pytest.mark.parametrize("case", ["json", "header length with spaces", "bad header"])
def test_other_requests_go_through_decode_request_every_time(slot: Any, calls: dict[str, int], images: np.ndarray, case: str) -> None:
    layouts = RequestLayouts()
    length, body = _binary_body(images[:1])
    if case == "json":
        body = bytearray(json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8],
                                                 "data": images[:1].ravel().tolist()}]}).encode())  # fmt: skip
        length = str(len(body))
    elif case == "header length with spaces":
        length = f" {length} "
    else:
        body[0:1] = b"["  # the JSON header no longer parses
    for _ in range(2):
        if case == "bad header":
            with pytest.raises(OipError, match="not valid JSON"):
                layouts.decode(slot, "tiny", length, bytearray(body))
        else:
            layout, feeds = layouts.decode(slot, "tiny", length, bytearray(body))
            np.testing.assert_array_equal(feeds["image"], images[:1])
    assert calls["decode"] == 2


def test_json_outputs_are_not_templated(slot: Any, calls: dict[str, int], images: np.ndarray) -> None:
    layouts = RequestLayouts()
    for _ in range(2):
        length, body = _binary_body(images[:1])  # no binary_data asked for: the logits come back as JSON numbers
        layout, feeds = layouts.decode(slot, "tiny", length, body)
        outputs = slot.server.infer(feeds).outputs
        body_out, content_type, _ = layouts.encode(layout, slot, outputs)
        assert content_type == "application/json"
        assert json.loads(body_out)["outputs"][0]["data"] == pytest.approx(outputs["logits"].ravel().tolist())
    assert calls == {"decode": 1, "encode": 2}


def test_a_long_header_is_never_kept(slot: Any, calls: dict[str, int], images: np.ndarray) -> None:
    """A client varying a huge ``id`` once held 256 layouts of its headers (and their reply templates): hundreds
    of MB with nothing in flight. Headers past MAX_CACHED_HEADER are decoded each time and kept nowhere."""
    layouts = RequestLayouts()
    header = {"id": "x" * (oip_layouts.MAX_CACHED_HEADER + 1),
              "inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8], "parameters": {"binary_data_size": 256}}]}  # fmt: skip
    text = json.dumps(header).encode()
    for _ in range(3):
        layout, feeds = layouts.decode(slot, "tiny", str(len(text)), bytearray(text + images[:1].tobytes()))
        layouts.encode(layout, slot, slot.server.infer(feeds).outputs)
    assert calls["decode"] == 3 and not layouts._layouts
