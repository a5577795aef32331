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
GET      ``/v2/models/<name>[/versions/<v>]/config``         the model configuration (Triton's ``ModelConfig``)
GET      ``/v2/models[/<name>[/versions/<v>]]/stats``        statistics: counts, queue and compute ns
POST     ``/v2/repository/index``                            the models, ``READY`` or ``UNAVAILABLE``
POST     ``/v2/repository/models/<name>/load|unload``        serve a model's bundle again / stop serving it
=======  ==================================================  ====================================================

The configuration, statistics and repository answers come from
:mod:`~edgekit_runtime.agent.oip_extensions`, shared with gRPC.

Errors are ``{"error": "<what, where and how to fix>"}``: 400 for a malformed request or inputs that do
not fit the model, 404 for an unknown model, version or path, 405 for the wrong method, 413 / 431 /
408 for the API's size and time limits, 503 for a model with no bundle loaded, 500 when the model
fails to run. A model's version is ``1`` (one version per model slot); the bundle's own version is in
the metadata's and configuration's ``parameters`` (``bundle_version``) and is accepted in paths too.

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
from edgekit_runtime.agent.http_handler import ApiError, RequestHandler, json_body
from edgekit_runtime.agent import oip_bytes
from edgekit_runtime.agent.oip_classification import classification_count, classify
from edgekit_runtime.agent.oip_extensions import PLATFORM, batches_first, load_model, model_config, model_statistics, repository_index, unload_model
from edgekit_runtime.agent.oip_types import BY_NUMPY as _BY_NUMPY
from edgekit_runtime.agent.oip_types import DATATYPES, OipError, bundle_version, datatype_of, find_slot, protocol_version
from edgekit_runtime.agent.oip_types import SERVED_VERSION, refuse_impossible_shape
from edgekit_runtime.agent.oip_types import shape_of as _shape
from edgekit_runtime.agent.serving_core import ServingError, parse_json_request, run_model, timing_headers
from edgekit_runtime.errors import InputSignatureError
from edgekit_runtime.signature import IOSignature

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
EXTENSIONS = ("binary_tensor_data", "classification", "model_configuration", "statistics", "model_repository")
_ACCEPTED_KINDS = {"f": "iuf", "i": "iu", "u": "iu", "b": "b"}
#: an output asked for: its ``binary_data`` (``None``: the request's default) and ``classification`` count
Wanted = tuple["bool | None", "int | None"]
__all__ = ["DATATYPES", "PLATFORM", "OipError", "datatype_of", "handle", "infer_model"]


# -- routing ------------------------------------------------------------------------------------------


def handle(handler: RequestHandler, method: str) -> None:
    """Answer one ``/v2`` request (the API's handler calls this for every path under ``/v2``)."""
    path = handler.path.split("?", 1)[0].rstrip("/") or "/"
    try:
        route, args = _route(path)
        allowed = "POST" if route in _POSTS else "GET"
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
    if parts == ["v2", "models", "stats"]:
        return _stats, ("", "")
    if parts == ["v2", "repository", "index"]:
        return _repository_index, ()
    if len(parts) == 5 and parts[1:3] == ["repository", "models"] and parts[4] in ("load", "unload") and parts[3]:
        return (_load if parts[4] == "load" else _unload), (parts[3],)
    if len(parts) >= 3 and parts[1] == "models":
        name, rest = parts[2], parts[3:]
        version = ""
        if len(rest) >= 2 and rest[0] == "versions":
            version, rest = rest[1], rest[2:]
        action = _MODEL_ACTIONS.get(tuple(rest))
        if action is not None and name:
            return action, (name, version)
    raise OipError(HTTPStatus.NOT_FOUND, f"no endpoint {path}; endpoints: /v2, /v2/health/live, /v2/health/ready, "
                   "/v2/models/NAME[/versions/VERSION][/ready|/infer|/config|/stats], /v2/models/stats, "
                   "/v2/repository/index, /v2/repository/models/NAME/load|unload")  # fmt: skip


def _slot(handler: RequestHandler, name: str, version: str) -> Any:
    return find_slot(handler.api.models, name, version)


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
    slot = _slot(handler, name, "")  # an unknown model is a 404; a version it does not serve is not ready (400)
    ready = bool(slot.ready) and (not version or version in (SERVED_VERSION, bundle_version(slot)))
    handler._send_json(HTTPStatus.OK if ready else HTTPStatus.BAD_REQUEST, {"name": name, "ready": ready})


def _model_metadata(handler: RequestHandler, name: str, version: str) -> None:
    slot = _slot(handler, name, version)
    signature: IOSignature | None = slot.server.signature
    if signature is None:
        raise OipError(HTTPStatus.SERVICE_UNAVAILABLE, f"model '{name}' has no bundle loaded; deploy one to it")

    def tensors(specs: tuple[Any, ...]) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": datatype_of(t.dtype), "shape": _shape(t.shape)} for t in specs]

    handler._send_json(HTTPStatus.OK, {"name": name, "versions": [protocol_version(slot)], "platform": PLATFORM,
                                       "inputs": tensors(signature.inputs), "outputs": tensors(signature.outputs),
                                       "parameters": {"bundle_version": bundle_version(slot)}})  # fmt: skip


# -- configuration, statistics and repository extensions (oip_extensions.py) --------------------------


def _config(handler: RequestHandler, name: str, version: str) -> None:
    handler._send_json(HTTPStatus.OK, model_config(handler.api.models, name, version))


def _stats(handler: RequestHandler, name: str, version: str) -> None:
    handler._send_json(HTTPStatus.OK, model_statistics(handler.api.models, name, version))


def _control_request(handler: RequestHandler) -> dict[str, Any]:
    """The JSON object of a repository request's body (empty when there is none)."""
    if handler.headers.get("Content-Length", "0") in ("0", ""):
        handler._body_read = True
        return {}
    body = handler.read_body()
    try:
        request = json.loads(bytes(body) or b"{}")
    except (UnicodeDecodeError, ValueError) as err:
        raise OipError(HTTPStatus.BAD_REQUEST, f"the request body is not valid JSON ({err}); send an object such as "
                       "{\"ready\": true}, or no body") from err  # fmt: skip
    if not isinstance(request, dict):
        raise OipError(HTTPStatus.BAD_REQUEST, f"the request body must be a JSON object, got {type(request).__name__}")
    return request


def _repository_index(handler: RequestHandler) -> None:
    ready = _control_request(handler).get("ready", False)
    if not isinstance(ready, bool):
        raise OipError(HTTPStatus.BAD_REQUEST, f"ready must be true or false, got {ready!r}")
    handler._send_json(HTTPStatus.OK, repository_index(handler.api.models, ready_only=ready))


def _load(handler: RequestHandler, name: str) -> None:
    _control_request(handler)  # parameters (a config or files to load from) are not taken: the store holds the bundle
    load_model(handler.api.models, name)
    handler._send(HTTPStatus.OK, b"", JSON_TYPE)


def _unload(handler: RequestHandler, name: str) -> None:
    _control_request(handler)
    unload_model(handler.api.models, name)
    handler._send(HTTPStatus.OK, b"", JSON_TYPE)


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
    request, feeds, wanted, binary_default = decode_request(slot, name, header_length_text, body)
    result = infer_model(slot, name, feeds)
    headers = timing_headers(result)  # the same timing headers as /v1 (extra headers are the protocol's to allow)
    reply, content_type, extra = encode_reply(request, slot, result.outputs, wanted, binary_default)
    handler._send(HTTPStatus.OK, reply, content_type, {**headers, **extra})
    handler.served_infer = True  # a keep-alive connection that infers may move to the API's event loop


def decode_request(slot: Any, name: str, header_length_text: str | None,
                   body: bytearray) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Wanted] | None, bool]:  # fmt: skip
    """An inference request's body (with its ``Inference-Header-Content-Length``) for model ``name``: the JSON
    request, the input tensors, the outputs asked for and ``binary_data_output``; :class:`OipError` (400) when
    it does not parse or fit. Shared by the threaded handler and the event loop (:mod:`~.http_loop`)."""
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
            signature = slot.server.signature
            if signature is None:  # unloaded while the body arrived (a JSON body's run answers the same)
                raise OipError(HTTPStatus.SERVICE_UNAVAILABLE, f"model '{name}' has no bundle loaded; deploy one to it")
            counted = check_json_item_counts(body[:header_length], signature, name)
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
    if "id" in request and not isinstance(request["id"], str):
        raise OipError(HTTPStatus.BAD_REQUEST, f"id must be a string (the protocol's request id), got {request['id']!r}")
    feeds = _decode_inputs(request.get("inputs"), memoryview(body)[header_length:])
    wanted, binary_default = _requested_outputs(request, slot.server.signature)
    return request, feeds, wanted, binary_default


def infer_model(slot: Any, name: str, feeds: dict[str, np.ndarray]) -> Any:
    """Run ``feeds`` on model ``name``'s server, the serving core's errors as the protocol's: a request that
    does not fit the model is 400, a model with no bundle 503, a failed run 500 (HTTP and gRPC alike)."""
    try:
        return run_model(slot.server, feeds)
    except ServingError as err:
        raise protocol_error(name, err) from err


def protocol_error(name: str, err: ServingError) -> OipError:
    """The serving core's error for model ``name`` in the protocol's words."""
    message = {"input_signature": f"model '{name}': {err.message}" + (f"; {err.hint}" if err.hint else ""),
               "no_model": f"model '{name}' has no bundle loaded; {err.hint}",
               "inference_failed": f"model '{name}' failed to run: {err.message}"}[err.kind]  # fmt: skip
    return OipError(err.status, message)


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
        if not isinstance(datatype, str) or (datatype not in DATATYPES and datatype != oip_bytes.BYTES):  # a list: unhashable
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: datatype {datatype!r} is not supported; use one of "
                           f"{', '.join(DATATYPES)}, BYTES (BF16 tensors are not served)")  # fmt: skip
        shape = tensor.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: shape must be a list of integers >= 0, got {shape!r}")
        refuse_impossible_shape(shape, where)
        if datatype == oip_bytes.BYTES:
            feeds[name], offset = _bytes_input(tensor, shape, binary, offset, where)
            continue
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


def _bytes_input(tensor: Mapping[str, Any], shape: list[int], binary: memoryview, offset: int, where: str) -> tuple[np.ndarray, int]:
    """A BYTES input (JSON strings, or length-prefixed elements in the binary data) and the binary offset after it."""
    parameters = tensor.get("parameters") or {}
    size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
    if size is None:
        if "data" not in tensor:
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where} has no data (and no binary_data_size parameter)")
        return oip_bytes.from_json(tensor["data"], shape, where), offset
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: binary_data_size must be an integer >= 0, got {size!r}")
    if "data" in tensor:
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where} has both data and binary_data_size; send one of them")
    if offset + size > len(binary):
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: its {size} bytes of binary data run past the end of the "
                       f"body ({len(binary)} bytes after the JSON header); check {HEADER_LENGTH}")  # fmt: skip
    return oip_bytes.from_blob(binary[offset : offset + size], shape, where), offset + size


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
    with np.errstate(over="ignore", invalid="ignore"):
        array = raw.astype(dtype)
    if raw.size and dtype.kind in "iu" and not np.array_equal(array, raw):
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: values overflow {_BY_NUMPY[dtype.name]}")
    if raw.size and dtype.kind == "f" and raw.dtype.kind in "iuf" and not np.array_equal(np.isfinite(array), np.isfinite(raw)):
        raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: values overflow {_BY_NUMPY[dtype.name]} (a finite number past its "
                       f"largest, {float(np.finfo(dtype).max):g}, would become infinity)")  # fmt: skip
    return array.reshape(shape)


def _requested_outputs(request: Mapping[str, Any], signature: IOSignature | None) -> tuple[dict[str, Wanted] | None, bool]:
    """The outputs asked for (name -> its ``binary_data``, ``None`` when unset, and its ``classification``
    count), ``None`` for all; and the request's ``binary_data_output`` (default false)."""
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
    wanted: dict[str, Wanted] = {}
    for index, output in enumerate(outputs):
        name = output.get("name") if isinstance(output, dict) else None
        if not isinstance(name, str):
            raise OipError(HTTPStatus.BAD_REQUEST, f"outputs[{index}] must be an object with a name")
        if name in wanted:
            raise OipError(HTTPStatus.BAD_REQUEST, f"outputs[{index}]: output '{name}' is asked for twice; name each output once")
        if signature is not None and name not in known:
            raise OipError(HTTPStatus.BAD_REQUEST, f"outputs[{index}]: the model has no output '{name}'; its outputs: {', '.join(known)}")
        output_parameters = output.get("parameters") or {}
        if not isinstance(output_parameters, dict):
            raise OipError(HTTPStatus.BAD_REQUEST, f"outputs[{index}].parameters must be an object, got {output_parameters!r}")
        binary = output_parameters.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise OipError(HTTPStatus.BAD_REQUEST, f"outputs[{index}].parameters.binary_data must be true or false, got {binary!r}")
        wanted[name] = (binary, classification_count(output_parameters.get("classification"), f"outputs[{index}]"))
    return wanted, binary_default


def encode_reply(request: Mapping[str, Any], slot: Any, outputs: Mapping[str, np.ndarray], wanted: dict[str, Wanted] | None,
                 binary_default: bool) -> tuple[bytes, str, dict[str, str]]:  # fmt: skip
    """An inference reply's body, content type and protocol headers (``Inference-Header-Content-Length`` with
    binary outputs, ``X-Edgekit-Non-Finite`` for NaN or infinities spelled in JSON)."""
    missing = [key for key in wanted or () if key not in outputs]
    if missing:  # a deploy swapped in a model without this output while the request ran
        raise OipError(HTTPStatus.SERVICE_UNAVAILABLE, f"model '{slot.name}' changed while this request ran and has no "
                       f"output '{missing[0]}' now; send the request again")  # fmt: skip
    chosen = outputs if wanted is None else {key: outputs[key] for key in wanted}
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for key, array in chosen.items():
        binary, classes = (wanted or {}).get(key) or (None, None)
        if classes is not None:
            array = classify(array, classes, batched=batches_first(slot.server), name=key)
        text = classes is not None or oip_bytes.is_bytes(array)
        datatype = oip_bytes.BYTES if text else datatype_of(array.dtype)
        entry: dict[str, Any] = {"name": key, "datatype": datatype, "shape": list(array.shape)}
        if binary if binary is not None else binary_default:
            blob = oip_bytes.to_blob(array) if text else np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif text:
            entry["data"] = oip_bytes.to_json(array)
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    response: dict[str, Any] = {"model_name": str(slot.name), "model_version": protocol_version(slot), "outputs": entries}
    if "id" in request:
        response["id"] = request["id"]
    if not blobs:
        body, extra = json_body(response)
        return body, JSON_TYPE, extra
    header, extra = json_body(response)  # JSON outputs beside the binary ones may hold NaN: spelled and counted too
    return b"".join([header, *blobs]), BINARY_TYPE, {**extra, HEADER_LENGTH: str(len(header))}


_MODEL_ACTIONS: dict[tuple[str, ...], Callable[..., None]] = {(): _model_metadata, ("ready",): _model_ready, ("infer",): _infer,
                                                               ("config",): _config, ("stats",): _stats}  # fmt: skip
_POSTS = (_infer, _repository_index, _load, _unload)
