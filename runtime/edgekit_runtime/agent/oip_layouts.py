"""Inference requests that repeat: the event loop's decode and reply, worked out once per distinct JSON header.

A client under load sends the same request again and again with new tensor bytes: perf_analyzer, and most
clients, send one JSON header (same inputs, shapes, datatypes, outputs asked for) before the binary tensor
data. Decoding that header (:func:`~edgekit_runtime.agent.oip.decode_request`: the item count against the
model's signature, the JSON parse, every input's and output's checks) gives the same answer each time, and so
does the reply's JSON header for outputs of the same shapes. :class:`RequestLayouts` keeps both, per model
and served signature (a deploy starts afresh), for the plain case only: every input sent as binary data of a
numeric datatype in native byte order, and, for the reply template, every output asked for returned as binary
data without classification. Anything else, and the first request of each layout, goes through
``decode_request`` and ``encode_reply`` as the threaded handler does, so the answers (and errors) are the
same; a repeated request then costs a dict look-up, one ``np.frombuffer`` per input and one ``tobytes`` per
output (``docs/agent.md``, "Per-request work in the event loop").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from edgekit_runtime.agent import oip_bytes
from edgekit_runtime.agent.oip import BINARY_TYPE, HEADER_LENGTH, decode_request, encode_reply
from edgekit_runtime.agent.oip_types import DATATYPES, datatype_of

#: distinct request layouts kept (cleared when full: a client that varies its header gains nothing, loses nothing)
MAX_LAYOUTS = 256
#: the longest JSON header a layout is kept for: real clients' are a few hundred bytes; a longer one (a huge
#: ``id``) is decoded each time, so the cache holds at most MAX_LAYOUTS x (this + MAX_REPLIES x its reply header)
MAX_CACHED_HEADER = 4096
#: reply templates kept per layout (distinct output shapes, e.g. a sequence model's lengths)
MAX_REPLIES = 64


class BinaryInput(NamedTuple):
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    values: int


class RequestLayout(NamedTuple):
    """A decoded request's JSON header for model ``slot`` served with ``signature``: the request, its outputs asked
    for, ``binary_data_output``; ``inputs`` (where each input's bytes lie in the body) when it is the plain
    binary case, else ``None`` (not kept); ``replies``: reply templates by the outputs' names, datatypes and
    shapes."""

    slot: Any
    signature: Any
    request: dict[str, Any]
    wanted: Any
    binary_default: bool
    inputs: tuple[BinaryInput, ...] | None
    replies: dict[tuple[Any, ...], tuple[bytes, tuple[tuple[str, np.dtype | None], ...]]]


class RequestLayouts:
    """The layouts of the requests the event loop has decoded, by model, signature and JSON header."""

    def __init__(self) -> None:
        self._layouts: dict[tuple[Any, ...], RequestLayout] = {}

    def decode(self, slot: Any, name: str, header_length_text: str | None,
               body: bytearray) -> tuple[RequestLayout, dict[str, np.ndarray]]:  # fmt: skip
        """``decode_request``'s answer for this body (its :class:`~edgekit_runtime.agent.oip_types.OipError` too),
        as a layout and the input tensors; a header seen before for this model skips the decode."""
        signature = slot.server.signature
        key = None
        if header_length_text is not None and header_length_text.isascii() and header_length_text.isdigit():
            header_length = int(header_length_text)
            if header_length < len(body) and header_length <= MAX_CACHED_HEADER:  # binary data follows the JSON header
                key = (id(slot), len(body), bytes(memoryview(body)[:header_length]))
                layout = self._layouts.get(key)
                if layout is not None and layout.signature is signature and layout.slot is slot:  # a deploy starts afresh
                    inputs = layout.inputs
                    assert inputs is not None  # only binary layouts are kept
                    return layout, {item.name: np.frombuffer(body, item.dtype, item.values, item.offset).reshape(item.shape)
                                    for item in inputs}  # fmt: skip
        request, feeds, wanted, binary_default = decode_request(slot, name, header_length_text, body)
        layout = RequestLayout(slot, signature, request, wanted, binary_default, None, {})
        if key is not None:
            inputs = _binary_inputs(request, feeds, int(header_length_text or 0))
            if inputs is not None:
                if len(self._layouts) >= MAX_LAYOUTS:
                    self._layouts.clear()
                layout = layout._replace(inputs=inputs)
                self._layouts[key] = layout
        return layout, feeds

    def encode(self, layout: RequestLayout, slot: Any, outputs: Mapping[str, np.ndarray]) -> tuple[bytes, str, dict[str, str]]:
        """``encode_reply``'s answer for ``outputs``; from the layout's template when these outputs (names,
        datatypes, shapes) were answered before for it in binary."""
        wanted = layout.wanted
        if wanted is not None and not all(key in outputs for key in wanted):  # the model changed meanwhile: encode_reply says so
            return encode_reply(layout.request, slot, outputs, wanted, layout.binary_default)
        chosen = outputs if wanted is None else {key: outputs[key] for key in wanted}
        shapes = tuple((key, array.dtype.str, array.shape) for key, array in chosen.items())
        template = layout.replies.get(shapes)
        if template is not None:
            header, conversions = template
            blobs = [chosen[key].tobytes() if dtype is None else np.ascontiguousarray(chosen[key], dtype=dtype).tobytes()
                     for key, dtype in conversions]  # fmt: skip
            return b"".join([header, *blobs]), BINARY_TYPE, {HEADER_LENGTH: str(len(header))}
        body, content_type, extra = encode_reply(layout.request, slot, outputs, wanted, layout.binary_default)
        if layout.inputs is not None and content_type == BINARY_TYPE and _all_binary(layout, chosen):
            if len(layout.replies) >= MAX_REPLIES:
                layout.replies.clear()
            conversions = tuple((key, _conversion(array.dtype)) for key, array in chosen.items())
            layout.replies[shapes] = (bytes(body[: int(extra[HEADER_LENGTH])]), conversions)
        return body, content_type, extra


def _binary_inputs(request: Mapping[str, Any], feeds: Mapping[str, np.ndarray], header_length: int) -> tuple[BinaryInput, ...] | None:
    """Where each input's bytes lie in a body like this one, when every input came as binary data of a numeric
    datatype in native byte order (``decode_request`` checked the sizes); ``None`` otherwise."""
    layout = []
    offset = header_length
    for tensor in request["inputs"]:
        parameters = tensor.get("parameters") or {}
        size = parameters.get("binary_data_size")
        dtype = DATATYPES.get(tensor.get("datatype"))
        if size is None or dtype is None or not dtype.isnative:
            return None
        name = tensor["name"]
        shape = tuple(feeds[name].shape)
        layout.append(BinaryInput(name, dtype, shape, offset, int(np.prod(shape, dtype=np.int64))))
        offset += size
    return tuple(layout)


def _all_binary(layout: RequestLayout, chosen: Mapping[str, np.ndarray]) -> bool:
    """Every output of the reply went out as binary data, without classification (so its JSON header depends on
    the outputs' names, datatypes and shapes alone)."""
    for key, array in chosen.items():
        binary, classes = (layout.wanted or {}).get(key) or (None, None)
        if classes is not None or oip_bytes.is_bytes(array) or not (binary if binary is not None else layout.binary_default):
            return False
    return True


def _conversion(dtype: np.dtype) -> np.dtype | None:
    """The datatype an output of ``dtype`` is sent as, when its bytes are not sent as they are."""
    target = DATATYPES[datatype_of(dtype)]
    return None if target == dtype else target
