"""The Open Inference Protocol (KServe v2) over HTTP/REST, on the agent's local API.

=======  ==================================================  ====================================================
method   path                                                what
=======  ==================================================  ====================================================
GET      ``/v2/health/live``                                 200 ``{"live": true}`` while the API answers
GET      ``/v2/health/ready``                                200 ``{"ready": true}`` when every model is loaded, else 400
GET      ``/v2``                                             ``{"name", "version", "extensions"}``
GET      ``/v2/models/<name>[/versions/<v>]``                ``{"name", "versions", "platform", "inputs", "outputs"}``
GET      ``/v2/models/<name>[/versions/<v>]/ready``          200 ``{"name", "ready": true}``, else 400
POST     ``/v2/models/<name>[/versions/<v>]/infer``          inference: JSON tensors, or the binary tensor data
                                                             extension (``Inference-Header-Content-Length``)
=======  ==================================================  ====================================================

Errors are ``{"error": "<what, where and how to fix>"}``: 400 for a malformed request or inputs that do
not fit the model, 404 for an unknown model, version or path, 405 for the wrong method, 413 / 431 /
408 for the API's size and time limits, 503 for a model with no bundle loaded, 500 when the model
fails to run. A model's version is the served bundle's ``bundle_version``; only the served version
is available (``previous`` is on disk, not loaded).

Requests run through the serving core (:mod:`~edgekit_runtime.agent.serving_core`) on the same
:class:`~edgekit_runtime.agent.serving.InferenceServer` as ``/v1/infer``: the same signature check,
statistics, batching and health watch. This module only converts the protocol's wire format to and from
that core, on the API's HTTP layer (:mod:`~edgekit_runtime.agent.http_handler`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any

import numpy as np

from edgekit_runtime import __version__ as AGENT_VERSION
from edgekit_runtime.agent.http_guard import check_json_item_counts, content_type_refusal
from edgekit_runtime.agent.http_handler import ApiError, RequestHandler
from edgekit_runtime.agent.serving_core import ServingError, parse_json_request, run_model, timing_headers
from edgekit_runtime.errors import InputSignatureError
from edgekit_runtime.signature import IOSignature

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
EXTENSIONS = ("binary_tensor_data",)
PLATFORM = "edgekit_onnxruntime"

#: OIP datatype <-> numpy dtype (little-endian on the wire). BYTES and BF16 have no numpy counterpart
#: among the dtypes bundles declare.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("bool"), "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"), "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"), "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}  # fmt: skip
_BY_NUMPY = {dtype.newbyteorder("=").name: name for name, dtype in DATATYPES.items()}
_ACCEPTED_KINDS = {"f": "iuf", "i": "iu", "u": "iu", "b": "b"}


class OipError(Exception):
    """An answer ``{"error": message}`` with ``status``."""

    def __init__(self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def datatype_of(dtype: str | np.dtype) -> str:
    name = np.dtype(dtype).name
    try:
        return _BY_NUMPY[name]
    except KeyError:
        raise OipError(HTTPStatus.INTERNAL_SERVER_ERROR, f"dtype {name} has no Open Inference Protocol datatype") from None


def _shape(tensor_shape: tuple[Any, ...]) -> list[int]:
    return [dim if isinstance(dim, int) else -1 for dim in tensor_shape]


# -- routing ------------------------------------------------------------------------------------------


def handle(handler: RequestHandler, method: str) -> None:
    """Answer one ``/v2`` request (the API's handler calls this for every path under ``/v2``)."""
    path = handler.path.split("?", 1)[0].rstrip("/") or "/"
    try:
        route, args = _route(path)
        allowed = "POST" if route is _infer else "GET"
        if method != allowed:
            raise OipError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not allowed on {path}; use {allowed}")
        route(handler, *args)
    except ApiError as err:  # the API's own limits (body size, Content-Length, truncation)
        handler._drain_body()
        _send_error(handler, OipError(err.status, f"{err.message}" + (f"; {err.hint}" if err.hint else ""), err.headers))
    except OipError as err:
        handler._drain_body()
        _send_error(handler, err)


def _send_error(handler: RequestHandler, err: OipError) -> None:
    handler._send_json(err.status, {"error": err.message}, err.headers or None)


def _route(path: str) -> tuple[Callable[..., None], tuple[str, ...]]:
    parts = path.split("/")[1:]  # "v2", ...
    if parts == ["v2"]:
        return _server_metadata, ()
    if parts == ["v2", "health", "live"]:
        return _live, ()
    if parts == ["v2", "health", "ready"]:
        return _server_ready, ()
    if len(parts) >= 3 and parts[1] == "models":
        name, rest = parts[2], parts[3:]
        version = ""
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
        action = {(): _model_metadata, ("ready",): _model_ready, ("infer",): _infer}.get(tuple(rest))
        if action is not None and name:
            return action, (name, version)
    raise OipError(HTTPStatus.NOT_FOUND, f"no endpoint {path}; endpoints: /v2, /v2/health/live, /v2/health/ready, "
                   "/v2/models/NAME[/versions/VERSION][/ready|/infer]")  # fmt: skip


def _slot(handler: RequestHandler, name: str, version: str) -> Any:
    models = handler.api.models
    slot = models.find(name)
    if slot is None:
        known = ", ".join(str(s.name) for s in models.slots() if s.name is not None) or "none"
        raise OipError(HTTPStatus.NOT_FOUND, f"unknown model '{name}'; this agent serves: {known}")
    if version and version != slot.version:
        served = slot.version or "none (no bundle loaded)"
        raise OipError(HTTPStatus.NOT_FOUND, f"model '{name}' has no version '{version}' loaded; it serves version {served} "
                       f"(leave /versions/... out for the served one)")  # fmt: skip
    return slot


# -- health and metadata --------------------------------------------------------------------------------


def _live(handler: RequestHandler) -> None:
    handler._send_json(HTTPStatus.OK, {"live": True})


def _server_ready(handler: RequestHandler) -> None:
    slots = handler.api.models.slots()
    ready = bool(slots) and all(slot.ready for slot in slots)
    handler._send_json(HTTPStatus.OK if ready else HTTPStatus.BAD_REQUEST, {"ready": ready})


def _server_metadata(handler: RequestHandler) -> None:
    handler._send_json(HTTPStatus.OK, {"name": "edgekit-agent", "version": AGENT_VERSION, "extensions": list(EXTENSIONS)})


def _model_ready(handler: RequestHandler, name: str, version: str) -> None:
    slot = _slot(handler, name, version)
    ready = slot.ready
    handler._send_json(HTTPStatus.OK if ready else HTTPStatus.BAD_REQUEST, {"name": name, "ready": ready})


def _model_metadata(handler: RequestHandler, name: str, version: str) -> None:
    slot = _slot(handler, name, version)
    signature: IOSignature | None = slot.server.signature
    if signature is None:
        raise OipError(HTTPStatus.SERVICE_UNAVAILABLE, f"model '{name}' has no bundle loaded; deploy one to it")

    def tensors(specs: tuple[Any, ...]) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": datatype_of(t.dtype), "shape": _shape(t.shape)} for t in specs]

    handler._send_json(HTTPStatus.OK, {"name": name, "versions": [slot.version] if slot.version else [],
                                       "platform": PLATFORM, "inputs": tensors(signature.inputs),
                                       "outputs": tensors(signature.outputs)})  # fmt: skip


# -- inference ------------------------------------------------------------------------------------------


def _infer(handler: RequestHandler, name: str, version: str) -> None:
    slot = _slot(handler, name, version)
    refusal = content_type_refusal(handler.headers.get("Content-Type"), (JSON_TYPE, BINARY_TYPE))
    if refusal is not None:
        raise OipError(refusal.status, f"{refusal.message}; {refusal.hint}")
    if slot.server.signature is None:  # refused before the body is read
        raise OipError(HTTPStatus.SERVICE_UNAVAILABLE, f"model '{name}' has no bundle loaded; deploy one to it")
    header_length_text = handler.headers.get(HEADER_LENGTH)
    body = handler.read_body(slot.server, name)
    if header_length_text is not None:
        digits = header_length_text.strip()
        if not (digits.isascii() and digits.isdigit()) or int(digits) > len(body):  # "²" is a digit int() refuses
            raise OipError(HTTPStatus.BAD_REQUEST, f"{HEADER_LENGTH} {header_length_text!r} must be an integer no larger than "
                           f"the body ({len(body)} bytes): the size of the JSON header before the binary tensor data")  # fmt: skip
        header_length = int(digits)
    else:
        header_length = len(body)
    try:
        if header_length == len(body):  # all JSON: counted, then large arrays of numbers straight to numpy, then the bytes go
            request = parse_json_request(body, slot.server.signature, name)
        else:
            counted = check_json_item_counts(body[:header_length], slot.server.signature, name)
            if counted is not None:
                raise InputSignatureError(counted.message, hint=counted.hint)
            request = json.loads(str(memoryview(body)[:header_length], "utf-8"))
    except InputSignatureError as err:
        raise OipError(HTTPStatus.BAD_REQUEST, f"{err.message}; {err.hint}") from err
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise OipError(HTTPStatus.BAD_REQUEST, f"the inference request's JSON header is not valid JSON ({err}); send "
                       f"{{\"inputs\": [...]}}, and with binary tensor data set {HEADER_LENGTH} to its size") from err  # fmt: skip
    if not isinstance(request, dict):
        raise OipError(HTTPStatus.BAD_REQUEST, "the inference request must be a JSON object with \"inputs\"")
    feeds = _decode_inputs(request.get("inputs"), memoryview(body)[header_length:])
    wanted, binary_default = _requested_outputs(request, slot.server.signature)
    result = infer_model(slot, name, feeds)
    headers = timing_headers(result)  # the same timing headers as /v1 (extra headers are the protocol's to allow)
    _reply(handler, request, name, slot.version or "", result.outputs, wanted, binary_default, headers)


def infer_model(slot: Any, name: str, feeds: dict[str, np.ndarray]) -> Any:
    """Run ``feeds`` on model ``name``'s server, the serving core's errors as the protocol's: a request that
    does not fit the model is 400, a model with no bundle 503, a failed run 500 (HTTP and gRPC alike)."""
    try:
        return run_model(slot.server, feeds)
    except ServingError as err:
        message = {"input_signature": f"model '{name}': {err.message}" + (f"; {err.hint}" if err.hint else ""),
                   "no_model": f"model '{name}' has no bundle loaded; {err.hint}",
                   "inference_failed": f"model '{name}' failed to run: {err.message}"}[err.kind]  # fmt: skip
        raise OipError(err.status, message) from err


def _decode_inputs(inputs: object, binary: memoryview) -> dict[str, np.ndarray]:
    example = '{"inputs": [{"name": "image", "shape": [1, 3], "datatype": "FP32", "data": [0.1, 0.2, 0.3]}]}'
    if not isinstance(inputs, list) or not inputs:
        raise OipError(HTTPStatus.BAD_REQUEST, f"\"inputs\" must be a non-empty list of tensors, e.g. {example}")
    feeds: dict[str, np.ndarray] = {}
    offset = 0
    for index, tensor in enumerate(inputs):
        where = f"inputs[{index}]"
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where} must be an object with name, shape, datatype and data, e.g. {example}")
        name = tensor["name"]
        where = f"input '{name}'"
        if name in feeds:
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where} is given twice; send each input once")
        datatype = tensor.get("datatype")
        if datatype not in DATATYPES:
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: datatype {datatype!r} is not supported; use one of "
                           f"{', '.join(DATATYPES)} (BYTES and BF16 tensors are not served)")  # fmt: skip
        shape = tensor.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: shape must be a list of integers >= 0, got {shape!r}")
        dtype = DATATYPES[datatype]
        count = math.prod(shape)
        parameters = tensor.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: parameters must be an object, got {parameters!r}")
        size = parameters.get("binary_data_size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size != count * dtype.itemsize:
                raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: binary_data_size {size!r} does not match {datatype}{shape} "
                               f"({count * dtype.itemsize} bytes)")  # fmt: skip
            if "data" in tensor:
                raise OipError(HTTPStatus.BAD_REQUEST, f"{where} has both data and binary_data_size; send one of them")
            if offset + size > len(binary):
                raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: its {size} bytes of binary data run past the end of the "
                               f"body ({len(binary)} bytes after the JSON header); check {HEADER_LENGTH}")  # fmt: skip
            array = np.frombuffer(binary, dtype=dtype, count=count, offset=offset).reshape(shape)
            feeds[name] = array if dtype.isnative else array.astype(dtype.newbyteorder("="))
            offset += size
            continue
        if "data" not in tensor:
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where} has no data (and no binary_data_size parameter)")
        feeds[name] = _json_array(tensor["data"], dtype.newbyteorder("="), shape, where)
    if offset != len(binary):
        raise OipError(HTTPStatus.BAD_REQUEST, f"the body holds {len(binary)} bytes of binary tensor data but the inputs' "
                       f"binary_data_size add up to {offset}; check {HEADER_LENGTH} and each binary_data_size")  # fmt: skip
    return feeds


def _json_array(data: object, dtype: np.dtype, shape: list[int], where: str) -> np.ndarray:
    """``data`` (flat in row-major order, or nested) as an array of ``shape``: no silent rounding or overflow."""
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError, RecursionError) as err:
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: data is not a list of numbers ({err})") from err
    if raw.size and raw.dtype.kind not in _ACCEPTED_KINDS[dtype.kind]:
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: data holds {raw.dtype.name} values, which do not fit datatype "
                       f"{_BY_NUMPY[dtype.name]} without rounding; send numbers of that type")  # fmt: skip
    if raw.size != math.prod(shape):
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: shape {shape} has {math.prod(shape)} elements but data has {raw.size}")
    array = raw.astype(dtype)
    if raw.size and dtype.kind in "iu" and not np.array_equal(array, raw):
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: values overflow {_BY_NUMPY[dtype.name]}")
    return array.reshape(shape)


def _requested_outputs(request: Mapping[str, Any], signature: IOSignature | None) -> tuple[dict[str, bool | None] | None, bool]:
    """The outputs asked for (name -> its ``binary_data``, ``None`` when unset), ``None`` for all; and the
    request's ``binary_data_output`` (default false)."""
    parameters = request.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise OipError(HTTPStatus.BAD_REQUEST, f"parameters must be an object, got {parameters!r}")
    binary_default = parameters.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise OipError(HTTPStatus.BAD_REQUEST, f"parameters.binary_data_output must be true or false, got {binary_default!r}")
    outputs = request.get("outputs")
    if outputs is None:
        return None, binary_default
    known = signature.output_names if signature is not None else ()
    if not isinstance(outputs, list):
        raise OipError(HTTPStatus.BAD_REQUEST, f"outputs must be a list of {{\"name\": ...}}, got {outputs!r}")
    wanted: dict[str, bool | None] = {}
    for index, output in enumerate(outputs):
        name = output.get("name") if isinstance(output, dict) else None
        if not isinstance(name, str):
            raise OipError(HTTPStatus.BAD_REQUEST, f"outputs[{index}] must be an object with a name")
        if signature is not None and name not in known:
            raise OipError(HTTPStatus.BAD_REQUEST, f"outputs[{index}]: the model has no output '{name}'; its outputs: {', '.join(known)}")
        output_parameters = output.get("parameters") or {}
        binary = output_parameters.get("binary_data") if isinstance(output_parameters, dict) else None
        if binary is not None and not isinstance(binary, bool):
            raise OipError(HTTPStatus.BAD_REQUEST, f"outputs[{index}].parameters.binary_data must be true or false, got {binary!r}")
        wanted[name] = binary
    return wanted, binary_default


def _reply(handler: RequestHandler, request: Mapping[str, Any], name: str, version: str, outputs: Mapping[str, np.ndarray],
           wanted: dict[str, bool | None] | None, binary_default: bool, headers: dict[str, str]) -> None:  # fmt: skip
    chosen = outputs if wanted is None else {key: outputs[key] for key in wanted}
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for key, array in chosen.items():
        binary = (wanted or {}).get(key)
        entry: dict[str, Any] = {"name": key, "datatype": datatype_of(array.dtype), "shape": list(array.shape)}
        if binary if binary is not None else binary_default:
            blob = np.ascontiguousarray(array, dtype=DATATYPES[entry["datatype"]]).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    response: dict[str, Any] = {"model_name": name, "model_version": version, "outputs": entries}
    if isinstance(request.get("id"), str):
        response["id"] = request["id"]
    if not blobs:
        handler._send_json(HTTPStatus.OK, response, headers)
        return
    header = json.dumps(response, allow_nan=False).encode("utf-8")
    handler._send(HTTPStatus.OK, b"".join([header, *blobs]), BINARY_TYPE, {**headers, HEADER_LENGTH: str(len(header))})
