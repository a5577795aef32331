"""The Open Inference Protocol's ``GRPCInferenceService`` (KServe v2 / Triton ``inference`` package), an
optional extra: ``pip install 'edgekit-runtime[grpc]'`` (grpcio, protobuf) and ``api.grpc: {listen:
127.0.0.1:8001}`` in the agent's configuration. Off by default; ``grpc`` is imported only when it is on.

=================  ==========================================================================================
RPC                what
=================  ==========================================================================================
ServerLive         ``live: true`` while the server answers
ServerReady        ``ready``: every model has a bundle loaded
ModelReady         ``ready`` of a model (false for an unknown model or a version that is not served)
ServerMetadata     ``name``, ``version``, ``extensions`` (as ``GET /v2``)
ModelMetadata      ``name``, ``versions``, ``platform``, ``inputs``, ``outputs`` (as ``GET /v2/models/NAME``)
ModelInfer         inputs as ``raw_input_contents`` (one blob per input; BYTES elements length-prefixed) or typed
                   ``contents`` (BYTES: ``bytes_contents``); outputs always as ``raw_output_contents`` (as
                   Triton); the request's ``id`` is echoed; queue and compute
                   milliseconds in the trailing metadata ``x-edgekit-queue-ms`` / ``x-edgekit-compute-ms``
ModelConfig        the model configuration (as ``GET /v2/models/NAME/config``)
ModelStatistics    counts and queue / compute ns of one model, or of every model for an empty name
RepositoryIndex    the models, ``READY`` or ``UNAVAILABLE``; RepositoryModelLoad / RepositoryModelUnload
                   verify and serve a model's bundle again / stop serving it (the bundle stays on disk)
=================  ==========================================================================================

Errors are gRPC status codes with the same messages as the HTTP ``/v2`` routes: INVALID_ARGUMENT (400),
NOT_FOUND (404), UNAVAILABLE (503: no bundle loaded), INTERNAL (500: the model failed to run).
RESOURCE_EXHAUSTED for a message over the server's message limit is grpcio's own, sent when the message's length
prefix arrives, before its bytes are buffered: the limit is what the served models' inputs can need (as the HTTP
path's body limit: every dim at its bound, 32 bytes a value, at least 4 MiB) up to ``api.max_request_mb``, so a
large request cannot take memory a served model could not use. grpcio fixes it when the server starts: when a
model that needs more comes to be served, the server restarts on the same address with the larger limit (in the
background, after in-flight calls finish; the limit never shrinks).

The messages are not generated code: ``proto/grpc_service.desc`` (``proto/grpc_service.proto`` compiled to
a ``FileDescriptorSet`` with grpcio-tools) is loaded into a private descriptor pool and the classes are
built from it at start, so one file works with any protobuf from 3.20 on (generated ``_pb2`` modules
pin the protobuf major they came from) and does not clash with a client's own ``inference`` messages
in the same process. Requests run on the same :class:`~edgekit_runtime.agent.serving.InferenceServer`
as ``/v1/infer`` and ``/v2``: one serving path, the same signature check, statistics, batching and
health watch; decoding shares :mod:`edgekit_runtime.agent.oip`'s datatypes and checks.

The server is grpcio's asyncio one on a loop in a thread of its own (:mod:`~edgekit_runtime.agent.oip_grpc_loop`):
``ModelInfer`` requests that arrive together run together (``InferenceServer.infer_together``: one runner call
for a batch when the model batches), the other RPCs on a few worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from http import HTTPStatus
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np

from edgekit_runtime import __version__ as AGENT_VERSION
from edgekit_runtime.agent.config import ApiConfig, GrpcConfig
from edgekit_runtime.agent.errors import AgentConfigError
from edgekit_runtime.agent.http_guard import json_body_limit
from edgekit_runtime.agent.oip import EXTENSIONS, _json_array, protocol_error
from edgekit_runtime.agent import oip_bytes
from edgekit_runtime.agent.oip_classification import classification_count, classify
from edgekit_runtime.agent.oip_extensions import PLATFORM, batches_first, load_model, model_config, model_statistics, repository_index, unload_model
from edgekit_runtime.agent.oip_grpc_loop import AioServerThread
from edgekit_runtime.agent.oip_types import DATATYPES, OipError, datatype_of, find_slot, protocol_version, shape_of
from edgekit_runtime.agent.oip_types import refuse_impossible_shape
from edgekit_runtime.agent.serving_core import serving_error
from edgekit_runtime.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit_runtime.agent.repository import ModelRepository, ModelSlot

logger = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
INSTALL_HINT = "pip install 'edgekit-runtime[grpc]'"
#: the message of INTERNAL for a failure that is not the model's (a bug): the traceback goes to the log
INTERNAL_ERROR = "internal error in the agent; see its log"
#: the typed ``InferTensorContents`` field of each datatype (FP16 travels only as raw contents)
CONTENTS_FIELDS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
                   "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
                   "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
                   "FP64": "fp64_contents"}  # fmt: skip
_STATUS_NAMES = {HTTPStatus.BAD_REQUEST: "INVALID_ARGUMENT", HTTPStatus.NOT_FOUND: "NOT_FOUND",
                 HTTPStatus.SERVICE_UNAVAILABLE: "UNAVAILABLE", HTTPStatus.INTERNAL_SERVER_ERROR: "INTERNAL",
                 HTTPStatus.FORBIDDEN: "PERMISSION_DENIED"}  # fmt: skip


def _import_grpc() -> Any:
    try:
        import grpc
        from google.protobuf import descriptor_pb2  # noqa: F401  (the extra's other half)
    except ImportError as err:
        raise AgentConfigError(f"api.grpc is set but the gRPC extra is not installed ({err})",
                               hint=f"{INSTALL_HINT}, or remove api.grpc from the configuration") from err  # fmt: skip
    return grpc


def load_messages() -> dict[str, Any]:
    """The service's message classes by short name (``ModelInferRequest``, ...), from the descriptor set."""
    from google.protobuf import descriptor_pool, message_factory
    from google.protobuf.descriptor_pb2 import FileDescriptorSet

    data = resources.files("edgekit_runtime.agent").joinpath("proto/grpc_service.desc").read_bytes()
    pool = descriptor_pool.DescriptorPool()  # private: a tritonclient in the same process has its own `inference`
    for file_proto in FileDescriptorSet.FromString(data).file:
        pool.Add(file_proto)
    file = pool.FindFileByName("grpc_service.proto")
    get_class = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.21
    if get_class is None:  # pragma: no cover - older protobuf
        get_class = message_factory.MessageFactory(pool).GetPrototype
    return {name: get_class(descriptor) for name, descriptor in file.message_types_by_name.items()}


#: the least message limit: room for every RPC but inference and for small models' requests
MIN_MESSAGE_BYTES = 4 * 2**20
#: how long in-flight calls may finish when the server restarts with a larger message limit
RESTART_GRACE_S = 5.0


def message_limit(models: Any, max_request_bytes: int) -> int:
    """The largest request message the served models can need (:func:`json_body_limit` of each one's inputs), at
    least :data:`MIN_MESSAGE_BYTES`; ``max_request_bytes`` when a model's inputs are unbounded (a dim without bounds,
    a string tensor) or need more."""
    limit = MIN_MESSAGE_BYTES
    for slot in models.slots():
        signature = slot.server.signature
        if signature is None:  # nothing served: calls to it fail before their inputs matter
            continue
        needed = json_body_limit(signature)
        if needed is None:
            return max_request_bytes
        limit = max(limit, needed)
    return min(limit, max_request_bytes)


class OipGrpcServer:
    """The gRPC server over the agent's :class:`ModelRepository`; ``start()`` / ``stop()``; ``models_changed()``
    when what is served changed (the message limit may have to grow)."""

    def __init__(self, models: ModelRepository, config: GrpcConfig, api: ApiConfig) -> None:
        self._grpc = _import_grpc()
        self.models, self.config = models, config
        self._max_message_bytes = api.max_request_bytes
        self.messages = load_messages()
        self._server: AioServerThread | None = None
        self._restart_lock = threading.Lock()
        self._stopped = False  # stop() was called: a restart under way does not start the server again
        self.message_limit = 0  # bytes: the limit the running server took in messages with
        self.bound_address: str | None = None

    def models_changed(self) -> None:
        """Restart the server, in the background, when the models served now need a larger message limit."""
        if self._server is None or message_limit(self.models, self._max_message_bytes) <= self.message_limit:
            return
        threading.Thread(target=self._restart, name="edgekit-grpc-restart", daemon=True).start()

    def _restart(self) -> None:
        with self._restart_lock:
            limit = message_limit(self.models, self._max_message_bytes)
            if self._server is None or limit <= self.message_limit:
                return
            logger.info("gRPC: the models served now need messages up to %d bytes (was %d): restarting on %s",
                        limit, self.message_limit, self.bound_address)  # fmt: skip
            self._stop_server(RESTART_GRACE_S)
            if self._stopped:  # the agent stopped meanwhile
                return
            try:
                self._start(self.bound_address)
            except AgentConfigError:
                logger.exception("gRPC: could not restart on %s; gRPC is off until the agent restarts", self.bound_address)

    def start(self) -> OipGrpcServer:
        self._stopped = False
        return self._start(None)

    def _start(self, address: str | None) -> OipGrpcServer:
        grpc, m = self._grpc, self.messages
        rpcs = {
            "ServerLive": (self._server_live, m["ServerLiveRequest"]),
            "ServerReady": (self._server_ready, m["ServerReadyRequest"]),
            "ModelReady": (self._model_ready, m["ModelReadyRequest"]),
            "ServerMetadata": (self._server_metadata, m["ServerMetadataRequest"]),
            "ModelMetadata": (self._model_metadata, m["ModelMetadataRequest"]),
            "ModelInfer": (self._model_infer, m["ModelInferRequest"]),
            "ModelConfig": (self._model_config, m["ModelConfigRequest"]),
            "ModelStatistics": (self._model_statistics, m["ModelStatisticsRequest"]),
            "RepositoryIndex": (self._repository_index, m["RepositoryIndexRequest"]),
            "RepositoryModelLoad": (self._repository_load, m["RepositoryModelLoadRequest"]),
            "RepositoryModelUnload": (self._repository_unload, m["RepositoryModelUnloadRequest"]),
        }
        server = AioServerThread(grpc)
        handlers = {name: grpc.unary_unary_rpc_method_handler(self._answering(server, method, name == "ModelInfer"),
                                                              request_deserializer=request.FromString,
                                                              response_serializer=lambda message: message.SerializeToString())
                    for name, (method, request) in rpcs.items()}  # fmt: skip
        limit = message_limit(self.models, self._max_message_bytes)
        # replies are not bounded by the request limit: a model's outputs may be larger than its inputs (Tile,
        # upsampling, segmentation), and HTTP answers them whole
        options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", -1)]
        listen = self.config.listen
        target = address or (f"unix:{listen.unix_path}" if listen.unix_path is not None else str(listen))
        self._server = server
        try:
            port = server.start(grpc.method_handlers_generic_handler(SERVICE, handlers), options, target)
        except RuntimeError as err:  # grpcio raises when it cannot bind
            self._server = None
            raise AgentConfigError(f"api.grpc.listen: cannot listen on {target} ({err})",
                                   hint="pick a free port, or 127.0.0.1:0 for any") from err  # fmt: skip
        if listen.unix_path is not None:
            self.bound_address = target
        else:
            host = f"[{listen.host}]" if listen.host and ":" in listen.host else listen.host
            self.bound_address = f"{host}:{port}"
        self.message_limit = limit  # once it serves with it
        logger.info("Open Inference Protocol gRPC on %s (messages up to %d bytes)", self.bound_address, limit)
        return self

    def stop(self, grace_s: float = 2.0) -> None:
        self._stopped = True
        self._stop_server(grace_s)

    def _stop_server(self, grace_s: float) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace_s)

    def _answering(self, server: AioServerThread, method: Any, on_loop: bool) -> Any:
        """``method`` as an async handler, its :class:`OipError` turned into the matching gRPC status and message:
        awaited on the loop when ``on_loop`` (ModelInfer), else called on one of the server's worker threads."""
        codes = self._grpc.StatusCode

        async def call(request: Any, context: Any) -> Any:
            try:
                if on_loop:
                    return await method(request, context)
                return await asyncio.get_running_loop().run_in_executor(server.workers, method, request, context)
            except OipError as err:
                await context.abort(getattr(codes, _STATUS_NAMES.get(err.status, "UNKNOWN")), err.message)
            except Exception:  # a bug: logged, and INTERNAL with a message (not UNKNOWN naming the exception's class)
                logger.exception("gRPC: %s failed", getattr(method, "__name__", "a call"))
                await context.abort(codes.INTERNAL, INTERNAL_ERROR)

        return call

    # -- health and metadata ------------------------------------------------------------------------

    def _server_live(self, request: Any, context: Any) -> Any:
        return self.messages["ServerLiveResponse"](live=True)

    def _server_ready(self, request: Any, context: Any) -> Any:
        slots = self.models.slots()
        return self.messages["ServerReadyResponse"](ready=bool(slots) and all(slot.ready for slot in slots))

    def _model_ready(self, request: Any, context: Any) -> Any:
        try:
            ready = self._slot(request.name, request.version).ready
        except OipError:
            ready = False  # an unknown model or version is not ready, as /v2/.../ready's 400 / 404 to HTTP clients
        return self.messages["ModelReadyResponse"](ready=ready)

    def _server_metadata(self, request: Any, context: Any) -> Any:
        return self.messages["ServerMetadataResponse"](name="edgekit-agent", version=AGENT_VERSION, extensions=list(EXTENSIONS))

    def _model_metadata(self, request: Any, context: Any) -> Any:
        slot = self._slot(request.name, request.version)
        signature = slot.server.signature
        if signature is None:
            raise OipError(HTTPStatus.SERVICE_UNAVAILABLE, f"model '{request.name}' has no bundle loaded; deploy one to it")
        response = self.messages["ModelMetadataResponse"](name=request.name, platform=PLATFORM, versions=[protocol_version(slot)])
        for specs, field in ((signature.inputs, response.inputs), (signature.outputs, response.outputs)):
            for spec in specs:
                field.add(name=spec.name, datatype=datatype_of(spec.dtype), shape=shape_of(spec.shape))
        return response

    def _slot(self, name: str, version: str) -> ModelSlot:
        return find_slot(self.models, name, version)  # type: ignore[no-any-return]

    # -- configuration, statistics and repository (oip_extensions.py, shared with HTTP) ---------------

    def _model_config(self, request: Any, context: Any) -> Any:
        config = _parse(model_config(self.models, request.name, request.version), self.messages["ModelConfig"])
        return self.messages["ModelConfigResponse"](config=config)

    def _model_statistics(self, request: Any, context: Any) -> Any:
        stats = model_statistics(self.models, request.name, request.version)
        return _parse(stats, self.messages["ModelStatisticsResponse"])

    def _repository_index(self, request: Any, context: Any) -> Any:
        return _parse({"models": repository_index(self.models, ready_only=request.ready)}, self.messages["RepositoryIndexResponse"])

    def _repository_load(self, request: Any, context: Any) -> Any:
        load_model(self.models, request.model_name)
        return self.messages["RepositoryModelLoadResponse"]()

    def _repository_unload(self, request: Any, context: Any) -> Any:
        unload_model(self.models, request.model_name)
        return self.messages["RepositoryModelUnloadResponse"]()

    # -- inference ----------------------------------------------------------------------------------

    async def _model_infer(self, request: Any, context: Any) -> Any:
        name = request.model_name
        slot = self._slot(name, request.model_version)
        feeds = _decode_inputs(request)
        wanted = _requested_outputs(request, slot.server.signature)
        passes = self._server.passes if self._server is not None else None
        if passes is None:  # stopping
            raise OipError(HTTPStatus.SERVICE_UNAVAILABLE, "the agent's gRPC server is stopping; try again")
        result = await passes.infer(slot.server, feeds)
        if isinstance(result, Exception):
            raise _failure(name, result)
        timing = result.timing
        context.set_trailing_metadata((("x-edgekit-queue-ms", f"{timing.queue_ms:.4f}"),
                                       ("x-edgekit-compute-ms", f"{timing.compute_ms:.4f}")))  # fmt: skip
        return self._infer_response(slot, name, request.id, wanted, result.outputs)

    def _infer_response(self, slot: ModelSlot, name: str, request_id: str, wanted: dict[str, int | None] | None,
                        outputs: dict[str, np.ndarray]) -> Any:  # fmt: skip
        """The ModelInferResponse of ``outputs``: those ``wanted`` (every one for ``None``), each raw."""
        response = self.messages["ModelInferResponse"](model_name=name, model_version=protocol_version(slot), id=request_id)
        for key, classes in (wanted or dict.fromkeys(outputs)).items():
            array = outputs.get(key)
            if array is None:  # a deploy swapped in a model without this output while the request ran
                raise OipError(HTTPStatus.SERVICE_UNAVAILABLE, f"model '{name}' changed while this request ran and has no "
                               f"output '{key}' now; send the request again")  # fmt: skip
            if classes is not None:
                labels = classify(array, classes, batched=batches_first(slot.server), name=key)
                response.outputs.add(name=key, datatype="BYTES", shape=labels.shape)
                response.raw_output_contents.append(oip_bytes.to_blob(labels))
                continue
            datatype = datatype_of(array.dtype)
            if datatype == oip_bytes.BYTES:
                response.outputs.add(name=key, datatype=datatype, shape=array.shape)
                response.raw_output_contents.append(oip_bytes.to_blob(array))
                continue
            response.outputs.add(name=key, datatype=datatype, shape=array.shape)
            response.raw_output_contents.append(np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes())
        return response


def _failure(name: str, err: Exception) -> OipError:
    """Model ``name``'s error ``err`` (from ``infer_together``) in the protocol's words: the model's own errors
    as the HTTP routes word them, anything else (a bug) logged and INTERNAL."""
    if isinstance(err, EdgekitError):
        return protocol_error(name, serving_error(err))
    logger.error("gRPC: model %s failed", name, exc_info=err)
    return OipError(HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR)


def _requested_outputs(request: Any, signature: Any) -> dict[str, int | None] | None:
    """The outputs asked for (name -> its ``classification`` count), ``None`` for every output: 400 for an
    output the model lacks or one named twice."""
    wanted: dict[str, int | None] = {}
    for index, output in enumerate(request.outputs):
        if signature is not None and output.name not in signature.output_names:
            raise OipError(HTTPStatus.BAD_REQUEST, f"outputs[{index}]: the model has no output '{output.name}'; "
                           f"its outputs: {', '.join(signature.output_names)}")  # fmt: skip
        if output.name in wanted:
            raise OipError(HTTPStatus.BAD_REQUEST, f"outputs[{index}]: output '{output.name}' is asked for twice; name each output once")
        count = None
        if "classification" in output.parameters:
            parameter = output.parameters["classification"]
            choice = parameter.WhichOneof("parameter_choice")
            if choice != "int64_param":  # as Triton: a double, a uint64 (unknown to this proto) or no value is refused
                raise OipError(HTTPStatus.BAD_REQUEST, f"outputs[{index}].parameters.classification must be an int64_param "
                               f"(how many top classes to return), got {choice or 'an empty parameter'}")  # fmt: skip
            count = classification_count(parameter.int64_param, f"outputs[{index}]")
        wanted[output.name] = count
    return wanted or None


def _parse(value: dict[str, Any], message_class: Any) -> Any:
    """A message of ``message_class`` from the protocol's JSON form of it (field names as in the proto)."""
    from google.protobuf import json_format

    return json_format.ParseDict(value, message_class())


def _decode_inputs(request: Any) -> dict[str, np.ndarray]:
    """The request's input tensors: from ``raw_input_contents`` (one blob per input) or typed ``contents``."""
    inputs, raw = request.inputs, request.raw_input_contents
    if not inputs:
        raise OipError(HTTPStatus.BAD_REQUEST, "the request has no inputs; send each of the model's inputs")
    if raw and len(raw) != len(inputs):
        raise OipError(HTTPStatus.BAD_REQUEST, f"raw_input_contents holds {len(raw)} blob(s) for {len(inputs)} input(s); "
                       "send one per input, in the order of inputs")  # fmt: skip
    feeds: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(inputs):
        where = f"input '{tensor.name}'" if tensor.name else f"inputs[{index}]"
        if not tensor.name:
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where} has no name")
        if tensor.name in feeds:
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where} is given twice; send each input once")
        if tensor.datatype not in DATATYPES and tensor.datatype != oip_bytes.BYTES:
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: datatype {tensor.datatype!r} is not supported; use one of "
                           f"{', '.join(DATATYPES)}, BYTES (BF16 tensors are not served)")  # fmt: skip
        shape = list(tensor.shape)
        if any(dim < 0 for dim in shape):
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: shape must hold integers >= 0, got {shape}")
        refuse_impossible_shape(shape, where)
        if tensor.datatype == oip_bytes.BYTES:  # length-prefixed in raw_input_contents, else contents.bytes_contents
            if raw and tensor.HasField("contents"):
                raise OipError(HTTPStatus.BAD_REQUEST, f"{where} has contents while the request has raw_input_contents; "
                               "send every input one way")  # fmt: skip
            feeds[tensor.name] = (oip_bytes.from_blob(raw[index], shape, f"{where}: raw_input_contents[{index}]") if raw
                                  else oip_bytes.from_items(tensor.contents.bytes_contents, shape, f"{where}: contents.bytes_contents"))  # fmt: skip
            continue
        dtype = DATATYPES[tensor.datatype]
        count = math.prod(shape)
        if raw:
            if tensor.HasField("contents"):
                raise OipError(HTTPStatus.BAD_REQUEST, f"{where} has contents while the request has raw_input_contents; "
                               "send every input one way")  # fmt: skip
            blob = raw[index]
            if len(blob) != count * dtype.itemsize:
                raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: raw_input_contents[{index}] holds {len(blob)} bytes, "
                               f"{tensor.datatype}{shape} needs {count * dtype.itemsize}")  # fmt: skip
            array = np.frombuffer(blob, dtype=dtype, count=count).reshape(shape)
            feeds[tensor.name] = array if dtype.isnative else array.astype(dtype.newbyteorder("="))
            continue
        field = CONTENTS_FIELDS.get(tensor.datatype)
        if field is None:
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: {tensor.datatype} has no typed contents; send it in raw_input_contents")
        values = list(getattr(tensor.contents, field))
        if not values and count:
            raise OipError(HTTPStatus.BAD_REQUEST, f"{where}: no data; a {tensor.datatype} tensor's values go in contents.{field} "
                           "(or every input's bytes in raw_input_contents)")  # fmt: skip
        feeds[tensor.name] = _json_array(values, dtype.newbyteorder("="), shape, f"{where}: contents.{field}")
    return feeds
