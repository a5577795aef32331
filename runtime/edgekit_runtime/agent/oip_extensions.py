"""Triton's model configuration, statistics and model repository extensions, in the protocol's JSON form;
the HTTP routes (:mod:`~edgekit_runtime.agent.oip`) send these dicts as they are, the gRPC servicer
(:mod:`~edgekit_runtime.agent.oip_grpc`) parses them into its messages (the field names are the proto's).

* **configuration** (``GET /v2/models/M/config``, ``ModelConfig``): derived from the served bundle's
  signature and the agent's config: ``max_batch_size`` is the bound of the batch dim when every input and
  output has it first (the dims then leave it out, as Triton's do), else 0 with the whole shapes;
  ``dynamic_batching`` when the agent batches the model (``max_queue_delay_microseconds`` from
  ``batching.max_delay_ms``); ``batching.instances`` instances, ``KIND_GPU`` when a GPU execution provider runs it, else
  ``KIND_CPU``; ``parameters`` carry the bundle's name, version and manifest sha256.
* **statistics** (``GET /v2/models[/M[/versions/V]]/stats``, ``ModelStatistics``): counts and nanoseconds
  since the model's server started (:mod:`~edgekit_runtime.agent.serving_stats`).
* **repository** (``POST /v2/repository/index``, ``/v2/repository/models/M/load`` and ``/unload``, and the
  ``Repository*`` RPCs): the models of the agent's repository; unload stops serving a model and keeps its
  bundle on disk, load verifies its ``current`` bundle again (else ``previous``), as at start, and serves it.
  Load and unload take no credentials: ``api.model_control: false`` refuses them (403, ``PERMISSION_DENIED``).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from edgekit_runtime.agent.errors import DeployError
from edgekit_runtime.agent.oip_types import OipError, bundle_version, datatype_of, find_slot, protocol_version, shape_of

PLATFORM = "edgekit_onnxruntime"
BACKEND = "onnxruntime"
_GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")
_NS_PER_US = 1_000


def model_config(models: Any, name: str, version: str) -> dict[str, Any]:
    """The model configuration of model ``name`` (503 when it has no bundle loaded)."""
    slot = find_slot(models, name, version)
    server = slot.server
    signature = server.signature
    if signature is None:
        raise OipError(HTTPStatus.SERVICE_UNAVAILABLE, f"model '{name}' has no bundle loaded; deploy or load one")
    batching = server.batching
    batched = batches_first(server)
    max_batch = 0
    if batched:
        max_batch = signature.dims[batching.dim if batching is not None else "batch"].max
        if server.batching_active:
            max_batch = min(max_batch, server.max_batch_items)

    def dims(shape: tuple[Any, ...]) -> list[int]:
        return shape_of(shape[1:] if batched else shape)

    def data_type(dtype: str) -> str:  # Triton's config calls BYTES TYPE_STRING
        datatype = datatype_of(dtype)
        return "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype

    config: dict[str, Any] = {
        "name": name,
        "platform": PLATFORM,
        "backend": BACKEND,
        "max_batch_size": max_batch,
        "input": [{"name": t.name, "data_type": data_type(t.dtype), "dims": dims(t.shape)} for t in signature.inputs],
        "output": [{"name": t.name, "data_type": data_type(t.dtype), "dims": dims(t.shape)} for t in signature.outputs],
        "instance_group": [{"name": f"{name}_0", "kind": _instance_kind(server), "count": server.instances}],
        "parameters": _bundle_parameters(slot),
    }
    if server.batching_active and batching is not None:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": int(batching.max_delay_ms * 1000)}
    return config


def batches_first(server: Any) -> bool:
    """Whether every input and output of ``server``'s model has the batch dim first (Triton's batching models)."""
    signature = server.signature
    if signature is None:  # unloaded while a request ran: its outputs are answered unbatched, not a crash
        return False
    batching = server.batching
    dim = batching.dim if batching is not None else "batch"
    tensors = (*signature.inputs, *signature.outputs)
    return dim in signature.dims and all(t.shape and t.shape[0] == dim for t in tensors)


def _instance_kind(server: Any) -> str:
    providers = server.providers
    return "KIND_GPU" if any(provider in _GPU_PROVIDERS for provider in providers) else "KIND_CPU"


def _bundle_parameters(slot: Any) -> dict[str, dict[str, str]]:
    served = getattr(slot, "served", None)
    values = {"bundle_version": bundle_version(slot)}
    if served is not None:
        values.update(bundle=served.name, bundle_id=served.bundle_id, manifest_sha256=served.manifest_sha256)
    return {key: {"string_value": str(value)} for key, value in values.items()}


def model_statistics(models: Any, name: str, version: str) -> dict[str, Any]:
    """``{"model_stats": [...]}`` for model ``name`` (``""``: every model with a name)."""
    slots = [find_slot(models, name, version)] if name else [s for s in models.slots() if s.name is not None]
    return {"model_stats": [slot.server.protocol_statistics(str(slot.name), protocol_version(slot) or "1") for slot in slots]}


def repository_index(models: Any, *, ready_only: bool) -> list[dict[str, str]]:
    """One entry per model: name, version, ``READY`` or ``UNAVAILABLE`` and why (``reason``)."""
    entries = []
    for slot in models.slots():
        if slot.name is None or (ready_only and not slot.ready):
            continue
        entry = {"name": str(slot.name), "version": protocol_version(slot) or "1"}
        if slot.ready:
            entry.update(state="READY", reason=f"bundle version {bundle_version(slot)}")
        else:
            why = "unloaded; its bundle is on disk (load it again)" if getattr(slot, "unloaded", False) else "no bundle deployed"
            entry.update(state="UNAVAILABLE", reason=why)
        entries.append(entry)
    return entries


def load_model(models: Any, name: str) -> None:
    """Verify model ``name``'s bundle again and serve it (400 when no bundle of it passes its checks)."""
    slot = find_slot(models, name, "")
    _control(models, slot, name, "load")


def unload_model(models: Any, name: str) -> None:
    """Stop serving model ``name``; its bundle stays on disk."""
    slot = find_slot(models, name, "")
    _control(models, slot, name, "unload")


def _control(models: Any, slot: Any, name: str, action: str) -> None:
    config = getattr(models, "config", None)
    if config is not None and not config.api.model_control:
        raise OipError(HTTPStatus.FORBIDDEN, f"model '{name}' cannot be {action}ed: model control is off in the agent "
                       "config (api.model_control: false); deploy or roll back through the fleet instead")  # fmt: skip
    method = getattr(slot, action, None)
    if method is None:
        raise OipError(HTTPStatus.BAD_REQUEST, f"model '{name}' cannot be {action}ed: it was given to the API already "
                       "loaded, with no bundle store behind it")  # fmt: skip
    try:
        method()
    except DeployError as err:
        raise OipError(HTTPStatus.BAD_REQUEST, f"model '{name}': {action} failed: {err.message}"
                       + (f"; {err.hint}" if err.hint else "")) from err  # fmt: skip
