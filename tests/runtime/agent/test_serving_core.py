"""The serving core that /v1, the Open Inference Protocol over HTTP and over gRPC share, on a real ONNX Runtime
session: a JSON body counted against the model's inputs then parsed into numpy, and the model's errors as one
typed error with the status each protocol answers."""

from __future__ import annotations

import json
from http import HTTPStatus

import numpy as np
import pytest

from edgekit_runtime.agent.serving import InferenceServer
from edgekit_runtime.agent.serving_core import ServingError, parse_json_request, run_model, timing_headers
from edgekit_runtime.errors import InputSignatureError


def test_a_json_request_is_counted_then_parsed_into_numpy_and_its_buffer_emptied(server: InferenceServer) -> None:
    data = np.linspace(0, 1, 512, dtype=np.float32).reshape(8, 1, 8, 8)  # ~10 KB of text: past MIN_NUMERIC_ARRAY_BYTES
    body = bytearray(json.dumps({"inputs": {"image": {"dtype": "float32", "data": data.tolist()}}}).encode())
    payload = parse_json_request(body, server.signature, "tiny")
    array = payload["inputs"]["image"]["data"]
    assert isinstance(array, np.ndarray) and array.shape == (8, 1, 8, 8)
    np.testing.assert_allclose(array, data, rtol=1e-6)
    assert body == bytearray()
    too_many = bytearray(b'{"inputs": {"image": {"data": [' + b"0," * 20000 + b"0]}}}")
    with pytest.raises(InputSignatureError) as caught:
        parse_json_request(too_many, server.signature, "tiny")
    assert caught.value.message.startswith("request body holds 20000 commas, more than the inputs of model 'tiny' can take")
    with pytest.raises(json.JSONDecodeError):  # for each protocol to word
        parse_json_request(bytearray(b'{"inputs": '), server.signature, "tiny")


def test_the_model_answers_or_raises_one_typed_error_with_its_status(server: InferenceServer) -> None:
    result = run_model(server, {"image": np.zeros((2, 1, 8, 8), np.float32)})
    assert result.outputs["logits"].shape == (2, 10)
    headers = timing_headers(result)
    assert set(headers) == {"X-Edgekit-Queue-Ms", "X-Edgekit-Compute-Ms"} and float(headers["X-Edgekit-Compute-Ms"]) > 0
    with pytest.raises(ServingError) as caught:
        run_model(server, {"image": np.zeros((1, 1, 8, 9), np.float32)})
    assert (caught.value.status, caught.value.kind) == (HTTPStatus.BAD_REQUEST, "input_signature")
    assert "input 'image'" in caught.value.message
    name = server.model_name
    runner = server.swap(None, model_name=None)  # no bundle loaded
    try:
        with pytest.raises(ServingError) as caught:
            run_model(server, {"image": np.zeros((1, 1, 8, 8), np.float32)})
    finally:
        server.swap(runner, model_name=name)  # closed by the fixture
    assert (caught.value.status, caught.value.kind) == (HTTPStatus.SERVICE_UNAVAILABLE, "no_model")
    assert caught.value.message == "no bundle is loaded, so there is no model to run"
