"""Triton's example clients' calls against the agent: the ``simple`` (INT32 add/sub), ``simple_string``
(BYTES decimal numbers, add/sub answered as strings), ``simple_identity`` (BYTES echo) and ``text-labels``
(the recipe's string-input, string-label demo) models, each built with ``edgekit build`` from an ONNX graph
(string tensors through recipe, golden files, self-check and install), served from the agent's model
repository over HTTP (JSON and binary tensors) and gRPC.

The clients here make the same ``tritonclient`` calls as Triton's ``src/python/examples/simple_*`` scripts
(those scripts cannot be fetched by a test; docs/oip-compliance.md lists which of them were run unmodified
and with what result)."""

from __future__ import annotations

import asyncio
import queue
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgekit.demos import text_labels
from edgekit.pipeline import build
from edgekit_runtime.agent.service import AgentService
from tests.runtime.agent_service.model_bundles import oip_clients

_HOST_PIPELINE = (
    "builds its bundles with edgekit's host pipeline (its report needs markupsafe); "
    "the runtime-only Python 3.10 check (scripts/check_py310.sh) installs none of that"
)
pytest.importorskip("markupsafe", reason=_HOST_PIPELINE)
grpc = pytest.importorskip("grpc", reason="grpcio is the runtime's grpc extra: pip install 'edgekit-runtime[grpc]' (scripts/setup.sh)")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is in the dev extra (scripts/setup.sh)")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is in the dev extra (scripts/setup.sh)")
from tritonclient.utils import InferenceServerException  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
MODELS = ["simple", "simple_string", "simple_identity", "text-labels"]
RECIPE = """\
name: {name}
model: {{kind: onnx, path: {name}.onnx}}
inputs:
{inputs}
outputs: [{outputs}]
dims:
  batch: {{min: 1, opt: 1, max: 8}}
data:
  samples: {{callable: "tests.runtime.agent_service.test_triton_examples:{name}_batches"}}
build:
  benchmark: {{warmup: 1, iterations: 3}}
"""


def _numbers(batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(-50, 50, (batch, 16), dtype=np.int32), rng.integers(-50, 50, (batch, 16), dtype=np.int32)


def _text(array: np.ndarray) -> np.ndarray:
    return np.asarray(array.astype(str), dtype=object)


def simple_batches() -> list[dict[str, np.ndarray]]:
    return [dict(zip(("INPUT0", "INPUT1"), _numbers(batch, batch))) for batch in (1, 3)]


def simple_string_batches() -> list[dict[str, np.ndarray]]:
    return [{name: _text(array) for name, array in batch.items()} for batch in simple_batches()]


def simple_identity_batches() -> list[dict[str, np.ndarray]]:
    return [{"INPUT0": np.array([["he\x00llo", "wörd", "", "x"]] * 2, dtype=object)}]


def _graph(name: str) -> onnx.ModelProto:
    if name == "simple_identity":
        nodes = [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])]
        inputs = [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, ["batch", "width"])]
        outputs = [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, ["batch", "width"])]
    else:
        text = name == "simple_string"
        kind = TensorProto.STRING if text else TensorProto.INT32
        nodes = [helper.make_node("Cast", [f"INPUT{i}"], [f"n{i}"], to=TensorProto.INT32) for i in (0, 1)] if text else []
        first, second = ("n0", "n1") if text else ("INPUT0", "INPUT1")
        sums = ("s0", "s1") if text else ("OUTPUT0", "OUTPUT1")
        nodes += [helper.make_node("Add", [first, second], [sums[0]]), helper.make_node("Sub", [first, second], [sums[1]])]
        if text:
            nodes += [helper.make_node("Cast", [sums[i]], [f"OUTPUT{i}"], to=TensorProto.STRING) for i in (0, 1)]
        inputs = [helper.make_tensor_value_info(f"INPUT{i}", kind, ["batch", 16]) for i in (0, 1)]
        outputs = [helper.make_tensor_value_info(f"OUTPUT{i}", kind, ["batch", 16]) for i in (0, 1)]
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _recipe(folder: Path, name: str) -> Path:
    onnx.save(_graph(name), str(folder / f"{name}.onnx"))
    if name == "simple_identity":
        inputs, outputs = "  - {name: INPUT0, dtype: string, shape: [batch, width]}", "OUTPUT0"
        text = RECIPE.format(name=name, inputs=inputs, outputs=outputs).replace("dims:\n", "dims:\n  width: {min: 1, opt: 4, max: 64}\n")
    else:
        dtype = "string" if name == "simple_string" else "int32"
        inputs = "\n".join(f"  - {{name: INPUT{i}, dtype: {dtype}, shape: [batch, 16], low: -50, high: 50}}" for i in (0, 1))
        text = RECIPE.format(name=name, inputs=inputs, outputs="OUTPUT0, OUTPUT1")
    path = folder / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each model built with ``edgekit build`` for x86-64-cpu at fp32 (string tensors through the whole pipeline)."""
    folder = tmp_path_factory.mktemp("recipes")
    bundles: dict[str, Path] = {}
    for name in MODELS:
        recipe = REPO / "recipes" / "text-labels.yaml" if name == "text-labels" else _recipe(folder, name)
        result = build(recipe, "x86-64-cpu", precision="fp32", out=folder / "bundles" / name, force=True)
        bundles[name] = Path(result.bundle_dir) if hasattr(result, "bundle_dir") else folder / "bundles" / name
    return bundles


@pytest.fixture
def agent(built: dict[str, Path], agent_config: Callable[..., Path], tmp_path: Path, fleet_keys: tuple[Path, Path]) -> Iterator[AgentService]:
    from edgekit.bundle.signing import sign_bundle
    from edgekit_runtime.agent.cli import main as agent_main
    from edgekit_runtime.agent.config import load_config

    path = agent_config(models={"names": MODELS, "default": MODELS[0]}, api={"address": "127.0.0.1:0", "grpc": {"listen": "127.0.0.1:0"}})
    for name, bundle in built.items():
        copy = tmp_path / "src" / name
        shutil.copytree(bundle, copy)
        sign_bundle(copy, fleet_keys[0])
        assert agent_main(["install", str(copy), "--config", str(path), "--model", name]) == 0
    with AgentService(load_config(path)) as service:
        yield service


@pytest.fixture
def clients(agent: AgentService) -> Iterator[tuple[Any, Any]]:
    with oip_clients(agent) as pair:
        yield pair


def _int_inputs(module: Any, in0: np.ndarray, in1: np.ndarray, datatype: str, binary: bool | None = None) -> list[Any]:
    inputs = [module.InferInput("INPUT0", list(in0.shape), datatype), module.InferInput("INPUT1", list(in1.shape), datatype)]
    for item, data in zip(inputs, (in0, in1)):
        item.set_data_from_numpy(data) if binary is None else item.set_data_from_numpy(data, binary_data=binary)
    return inputs


EXAMPLE_IN0 = np.arange(16, dtype=np.int32).reshape(1, 16)
EXAMPLE_IN1 = np.ones((1, 16), dtype=np.int32)


def test_simple_http_and_grpc_infer_as_the_examples(clients: tuple[Any, Any]) -> None:
    """simple_http_infer_client / simple_grpc_infer_client: INT32 [1, 16] add and sub, binary and JSON."""
    http, rpc = clients
    for binary in (True, False):
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary), httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
        result = http.infer("simple", _int_inputs(httpclient, EXAMPLE_IN0, EXAMPLE_IN1, "INT32", binary), outputs=outputs,
                            headers={"test": "1"}, request_id="r1")  # fmt: skip
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), EXAMPLE_IN0 + EXAMPLE_IN1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), EXAMPLE_IN0 - EXAMPLE_IN1)
    result = rpc.infer("simple", _int_inputs(grpcclient, EXAMPLE_IN0, EXAMPLE_IN1, "INT32"),
                       outputs=[grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")])  # fmt: skip
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), EXAMPLE_IN0 + EXAMPLE_IN1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), EXAMPLE_IN0 - EXAMPLE_IN1)
    assert result.get_response().model_name == "simple"


def test_simple_async_and_aio_infer_as_the_examples(clients: tuple[Any, Any], agent: AgentService) -> None:
    """simple_http_async_infer_client, simple_grpc_async_infer_client, simple_http_aio / simple_grpc_aio."""
    http, rpc = clients
    pending = [http.async_infer("simple", _int_inputs(httpclient, EXAMPLE_IN0 + i, EXAMPLE_IN1, "INT32", True)) for i in range(4)]
    for i, request in enumerate(pending):
        np.testing.assert_array_equal(request.get_result().as_numpy("OUTPUT0"), EXAMPLE_IN0 + i + EXAMPLE_IN1)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    rpc.async_infer("simple", _int_inputs(grpcclient, EXAMPLE_IN0, EXAMPLE_IN1, "INT32"), callback=lambda result, error: answers.put((result, error)))
    result, error = answers.get(timeout=30)
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), EXAMPLE_IN0 - EXAMPLE_IN1)

    import tritonclient.grpc.aio as grpcaio
    import tritonclient.http.aio as httpaio

    async def both() -> tuple[Any, Any]:
        aio_http = httpaio.InferenceServerClient(url=agent.api_address)
        aio_rpc = grpcaio.InferenceServerClient(url=agent.grpc.bound_address)
        try:
            assert await aio_http.is_server_live() and await aio_rpc.is_server_ready()
            first = await aio_http.infer("simple", _int_inputs(httpaio, EXAMPLE_IN0, EXAMPLE_IN1, "INT32", True))
            second = await aio_rpc.infer("simple", _int_inputs(grpcaio, EXAMPLE_IN0, EXAMPLE_IN1, "INT32"))
            return first, second
        finally:
            await aio_http.close()
            await aio_rpc.close()

    first, second = asyncio.run(both())
    np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), EXAMPLE_IN0 + EXAMPLE_IN1)
    np.testing.assert_array_equal(second.as_numpy("OUTPUT1"), EXAMPLE_IN0 - EXAMPLE_IN1)


def test_health_and_metadata_as_the_examples(clients: tuple[Any, Any]) -> None:
    """simple_http_health_metadata / simple_grpc_health_metadata (bar the server name, 'edgekit-agent')."""
    http, rpc = clients
    assert http.is_server_live() and http.is_server_ready() and http.is_model_ready("simple")
    assert rpc.is_server_live() and rpc.is_server_ready() and rpc.is_model_ready("simple")
    assert http.get_server_metadata()["name"] == rpc.get_server_metadata().name == "edgekit-agent"
    metadata = http.get_model_metadata("simple_string")
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [("INPUT0", "BYTES", [-1, 16]), ("INPUT1", "BYTES", [-1, 16])]
    assert [t.datatype for t in rpc.get_model_metadata("simple_string").outputs] == ["BYTES", "BYTES"]
    config = rpc.get_model_config("simple_string").config
    assert [grpcclient.model_config_pb2.DataType.Name(t.data_type) for t in config.input] == ["TYPE_STRING", "TYPE_STRING"]
    assert http.get_model_config("simple")["input"][0]["data_type"] == "TYPE_INT32"
    with pytest.raises(InferenceServerException):
        http.get_model_metadata("wrong_model_name")
    assert not rpc.is_model_ready("wrong_model_name")


def _string_inputs(module: Any, binary: tuple[bool, bool] | None) -> list[Any]:
    texts = [np.array([str(x).encode("utf-8") for x in array.reshape(-1)], dtype=np.object_).reshape(1, 16) for array in (EXAMPLE_IN0, EXAMPLE_IN1)]
    inputs = [module.InferInput(f"INPUT{i}", [1, 16], "BYTES") for i in (0, 1)]
    for item, data, flag in zip(inputs, texts, binary or (None, None)):
        item.set_data_from_numpy(data) if flag is None else item.set_data_from_numpy(data, binary_data=flag)
    return inputs


def test_simple_string_infer_as_the_examples(clients: tuple[Any, Any]) -> None:
    """simple_http_string_infer_client / simple_grpc_string_infer_client: BYTES in (binary and JSON), BYTES out."""
    http, rpc = clients
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True), httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    result = http.infer("simple_string", _string_inputs(httpclient, (True, False)), outputs=outputs)
    assert [int(x) for x in result.as_numpy("OUTPUT0").reshape(-1)] == list((EXAMPLE_IN0 + EXAMPLE_IN1).reshape(-1))
    assert [int(x) for x in result.as_numpy("OUTPUT1").reshape(-1)] == list((EXAMPLE_IN0 - EXAMPLE_IN1).reshape(-1))
    answer = rpc.infer("simple_string", _string_inputs(grpcclient, None))
    assert answer.as_numpy("OUTPUT0").dtype == np.object_
    assert [int(x) for x in answer.as_numpy("OUTPUT0").reshape(-1)] == list((EXAMPLE_IN0 + EXAMPLE_IN1).reshape(-1))
    assert [int(x) for x in answer.as_numpy("OUTPUT1").reshape(-1)] == list((EXAMPLE_IN0 - EXAMPLE_IN1).reshape(-1))
    bad = [httpclient.InferInput(f"INPUT{i}", [1, 16], "BYTES") for i in (0, 1)]
    for item in bad:
        item.set_data_from_numpy(np.array([b"\xff\xfe"] * 16, dtype=np.object_).reshape(1, 16), binary_data=True)
    with pytest.raises(InferenceServerException, match="not UTF-8"):
        http.infer("simple_string", bad)


def test_identity_echoes_strings_with_nul_and_control_bytes(clients: tuple[Any, Any]) -> None:
    """simple_http_string_infer_client's identity part: "he\\x00llo" and b"\\x00\\x01\\x02\\x03", binary and JSON."""
    http, rpc = clients
    for data in (np.array(["he\x00llo".encode()] * 16, dtype=np.object_).reshape(1, 16),
                 np.array([b"\x00\x01\x02\x03"] * 16, dtype=np.bytes_).reshape(1, 16)):  # fmt: skip
        for binary in (True, False):
            item = httpclient.InferInput("INPUT0", list(data.shape), "BYTES")
            item.set_data_from_numpy(data, binary_data=binary)
            result = http.infer("simple_identity", [item], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
            echoed = result.as_numpy("OUTPUT0")
            as_bytes = [x if isinstance(x, bytes) else str(x).encode() for x in echoed.reshape(-1)]
            assert as_bytes == list(data.reshape(-1)), binary
        item = grpcclient.InferInput("INPUT0", list(data.shape), "BYTES")
        item.set_data_from_numpy(data)
        assert list(rpc.infer("simple_identity", [item]).as_numpy("OUTPUT0").reshape(-1)) == list(data.reshape(-1))


def test_text_labels_recipe_serves_string_labels(clients: tuple[Any, Any]) -> None:
    """The shipped recipes/text-labels.yaml bundle: words in, class scores and class names out, both protocols."""
    http, rpc = clients
    words = np.array([b"apple", b"oak", b"otter", b"stone"], dtype=np.object_)
    expected = [b"fruit", b"tree", b"animal", b"fruit"]
    for module, client in ((httpclient, http), (grpcclient, rpc)):
        item = module.InferInput("text", [4], "BYTES")
        item.set_data_from_numpy(words)
        result = client.infer("text-labels", [item])
        assert list(result.as_numpy("label")) == expected
        assert result.as_numpy("logits").shape == (4, 3)
        assert list(result.as_numpy("logits").argmax(axis=1)) == [0, 1, 2, 0]
    item = httpclient.InferInput("text", [2], "INT32")
    item.set_data_from_numpy(np.array([1, 2], np.int32))
    with pytest.raises(InferenceServerException, match="text"):
        http.infer("text-labels", [item])


def _post(agent: AgentService, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://{agent.api_address}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=20) as reply:
            return reply.status, reply.read(), dict(reply.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def test_bytes_on_the_wire_and_its_refusals(agent: AgentService) -> None:
    """The binary form byte for byte (4-byte little-endian length, then UTF-8), nested JSON strings, and a 400
    naming the input for a cut length prefix, a length past the data, too little data or too many elements for the
    shape, numbers as BYTES data and a count mismatch."""
    import json
    import struct

    words = ["oak", "wörd"]
    blob = b"".join(struct.pack("<I", len(w.encode())) + w.encode() for w in words)
    header = json.dumps({"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}],
                         "outputs": [{"name": "label", "parameters": {"binary_data": True}}]}).encode()  # fmt: skip
    status, body, headers = _post(agent, "/v2/models/text-labels/infer", header + blob, {"Inference-Header-Content-Length": str(len(header))})
    assert status == 200, body
    size = int(headers["Inference-Header-Content-Length"])
    reply = json.loads(body[:size])
    assert reply["outputs"][0]["datatype"] == "BYTES" and reply["outputs"][0]["shape"] == [2]
    assert body[size:] == struct.pack("<I", 4) + b"tree" + struct.pack("<I", 5) + b"fruit"
    status, body, _ = _post(agent, "/v2/models/text-labels/infer",
                            json.dumps({"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": [["cat"], ["pear"]]}]}).encode())  # fmt: skip
    assert status == 200 and json.loads(body)["outputs"][1]["data"] == ["animal", "fruit"]
    for data, blob_bytes, fragment in (
        (None, struct.pack("<I", 3) + b"oak" + b"\x01\x00", "ends inside the 4-byte length of element 1"),
        (None, struct.pack("<I", 3) + b"oak" + struct.pack("<I", 9) + b"ab", "element 1 says 9 bytes but only 2 follow"),
        (None, struct.pack("<I", 3) + b"oak", "shape [2] has 2 elements, which take at least 8 bytes"),
        # more elements than the shape: refused at the first one past it, not after decoding them all
        (None, b"".join(struct.pack("<I", 3) + w for w in (b"oak", b"fig", b"yew")), "shape [2] has 2 elements but the binary BYTES data holds more"),
        ([1, 2], None, "a BYTES tensor's data holds strings, got 1"),
        (["a", "b", "c"], None, "shape [2] has 2 elements but 3 strings were sent"),
    ):
        tensor: dict[str, Any] = {"name": "text", "shape": [2], "datatype": "BYTES"}
        if blob_bytes is None:
            tensor["data"] = data
            request, extra = json.dumps({"inputs": [tensor]}).encode(), {}
        else:
            tensor["parameters"] = {"binary_data_size": len(blob_bytes)}
            head = json.dumps({"inputs": [tensor]}).encode()
            request, extra = head + blob_bytes, {"Inference-Header-Content-Length": str(len(head))}
        status, body, _ = _post(agent, "/v2/models/text-labels/infer", request, extra)
        assert status == 400 and "input 'text'" in json.loads(body)["error"] and fragment in json.loads(body)["error"], body


def test_grpc_bytes_contents_and_cut_raw_contents(agent: AgentService) -> None:
    """gRPC typed ``bytes_contents`` (no raw contents) and a raw blob whose length prefix runs past it."""
    import struct

    from edgekit_runtime.agent.oip_grpc import load_messages

    messages = load_messages()
    channel = grpc.insecure_channel(agent.grpc.bound_address)
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=messages["ModelInferResponse"].FromString)  # fmt: skip
    request = messages["ModelInferRequest"](model_name="text-labels")
    tensor = request.inputs.add(name="text", datatype="BYTES", shape=[3])
    tensor.contents.bytes_contents.extend([b"pine", b"plum", b"horse"])
    response = infer(request, timeout=20)
    label = [o.name for o in response.outputs].index("label")
    assert response.raw_output_contents[label] == b"".join(struct.pack("<I", len(w)) + w for w in (b"tree", b"fruit", b"animal"))
    cut = messages["ModelInferRequest"](model_name="text-labels")
    cut.inputs.add(name="text", datatype="BYTES", shape=[1])
    cut.raw_input_contents.append(struct.pack("<I", 10) + b"oak")
    with pytest.raises(grpc.RpcError) as info:
        infer(cut, timeout=20)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "element 0 says 10 bytes" in info.value.details()
    channel.close()
