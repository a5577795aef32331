"""Inputs and outputs on the execution provider's own device, through ONNX Runtime's IOBinding.

With ``session.run`` ONNX Runtime copies every feed to the GPU and every output back, allocating device
memory for both on each call. :class:`DeviceBinding` keeps one set of device buffers per input shape
instead: a call copies the feeds into them (``OrtValue.update_inplace``), runs the bound session and
copies the outputs back, and :meth:`DeviceBinding.run_resident` skips both copies for callers whose
tensors already live on the device.

CUDA graphs (the CUDA provider's ``enable_cuda_graph`` option) need exactly that: every input and output
at a fixed device address. ONNX Runtime captures one graph per ``gpu_graph_id`` run option, so each
input shape gets its own graph id (up to ``max_cuda_graphs``; later shapes run without a graph, id -1).
The outputs of a captured shape are allocated once, at the shapes a first run without a graph gave.

Nothing here imports a GPU library: device memory is ONNX Runtime's (``OrtValue``), so the same code runs
on the CPU provider too, which is how it is tested without a GPU.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Execution providers whose tensors live on a device other than the host, and that device's name in
#: ONNX Runtime's ``OrtValue`` / IOBinding calls.
DEVICE_OF_PROVIDER: Mapping[str, str] = {
    "CUDAExecutionProvider": "cuda",
    "TensorrtExecutionProvider": "cuda",
}

#: Input shapes whose buffers are kept, per runner, when no CUDA graph pins them (least recently used go).
KEPT_SHAPES = 8
#: CUDA graphs captured per runner by default (ONNX Runtime keeps each for the session's lifetime).
DEFAULT_MAX_CUDA_GRAPHS = 8
#: ``gpu_graph_id`` that tells the CUDA provider to run without capturing or replaying a graph.
NO_GRAPH = -1
#: Graph ids already given out, per session: ONNX Runtime keys its graphs by id within a session, so two
#: bindings over one session must never hand out the same id (the second would replay the first's graph,
#: on the first's buffers: wrong outputs, or an illegal-instruction fault that ends the CUDA context).
_GRAPH_IDS_TAKEN: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


@dataclass
class _ShapeSlot:
    """Device buffers for one set of input shapes, and the binding that points at them."""

    inputs: dict[str, Any]  # name -> OrtValue on the device
    binding: Any
    run_options: Any
    graph_id: int = NO_GRAPH
    outputs: list[Any] = field(default_factory=list)  # fixed output OrtValues (CUDA graph slots only)


def shape_key(feeds: Mapping[str, np.ndarray]) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    return tuple((name, tuple(array.shape), array.dtype.str) for name, array in feeds.items())


class DeviceBinding:
    """One session's runs through IOBinding, with inputs and outputs in ``device`` memory.

    ``run(feeds)`` takes and returns numpy arrays (copies in and out); ``run_resident(values)`` takes
    ``OrtValue`` inputs already on the device and returns the outputs as device ``OrtValue``s.

    One shape's buffers serve one call at a time: ``run`` holds a lock from copying the feeds in until the
    outputs are copied out, so calls from several threads wait for each other rather than overwrite each
    other's inputs or read each other's outputs.
    """

    def __init__(self, ort: Any, session: Any, output_names: Sequence[str], *, device: str, device_id: int = 0,
                 cuda_graph: bool = False, max_cuda_graphs: int = DEFAULT_MAX_CUDA_GRAPHS) -> None:  # fmt: skip
        self._ort = ort
        self._session = session
        self.output_names = list(output_names)
        self.device = device
        self.device_id = device_id
        self.cuda_graph = cuda_graph
        self.max_cuda_graphs = max_cuda_graphs
        self._slots: OrderedDict[tuple[Any, ...], _ShapeSlot] = OrderedDict()
        self.graphs_captured = 0
        self._lock = threading.Lock()  # the slots, and each slot's buffers, belong to one call at a time

    def describe(self) -> dict[str, Any]:
        """What the binding does, for the runner's report (``io_binding`` in a self-check or bench)."""
        return {"device": f"{self.device}:{self.device_id}", "cuda_graph": self.cuda_graph,
                "graphs_captured": self.graphs_captured, "shapes_kept": len(self._slots)}  # fmt: skip

    # -- host arrays in, host arrays out -------------------------------------------------------

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        key = shape_key(feeds)
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                slot = self._new_slot(key, feeds)
            else:
                self._slots.move_to_end(key)
                for name, array in feeds.items():
                    slot.inputs[name].update_inplace(np.ascontiguousarray(array))
            self._session.run_with_iobinding(slot.binding, slot.run_options)
            if slot.outputs:
                return [value.numpy() for value in slot.outputs]
            return list(slot.binding.copy_outputs_to_cpu())

    def resident_call(self, feeds: Mapping[str, np.ndarray]) -> Callable[[], list[Any]]:
        """A no-argument call that runs on ``feeds`` copied once into this shape's device buffers and leaves
        the outputs on the device: what a pipeline whose tensors never leave the GPU pays (with a CUDA
        graph, one replay). For one thread's timing loop: the call itself takes no lock."""
        key = shape_key(feeds)
        with self._lock:
            slot = self._slots.get(key) or self._new_slot(key, feeds)
            for name, array in feeds.items():
                slot.inputs[name].update_inplace(np.ascontiguousarray(array))
        run, binding, options = self._session.run_with_iobinding, slot.binding, slot.run_options

        def call() -> list[Any]:
            run(binding, options)
            return slot.outputs or list(binding.get_outputs())

        return call

    # -- device values in, device values out ---------------------------------------------------

    def to_device(self, array: np.ndarray) -> Any:
        """``array`` copied into a new ``OrtValue`` on this binding's device. On the CPU ``ortvalue_from_numpy``
        wraps the array's own memory, and a slot's later ``update_inplace`` would overwrite the caller's array:
        so the array is copied first there."""
        host = np.array(array, order="C", copy=True) if self.device == "cpu" else np.ascontiguousarray(array)
        return self._ort.OrtValue.ortvalue_from_numpy(host, self.device, self.device_id)

    def run_resident(self, values: Mapping[str, Any]) -> list[Any]:
        """Run on inputs already on the device; the outputs stay there (``OrtValue``s, ``.numpy()`` copies
        one back). Never captured as a CUDA graph: the caller's buffers may move between calls."""
        binding = self._session.io_binding()
        for name, value in values.items():
            binding.bind_ortvalue_input(name, value)
        for name in self.output_names:
            binding.bind_output(name, self.device, self.device_id)
        self._session.run_with_iobinding(binding, self._run_options(NO_GRAPH))
        return list(binding.get_outputs())

    # -- slots -----------------------------------------------------------------------------------

    def _run_options(self, graph_id: int) -> Any:
        options = self._ort.RunOptions()
        if self.cuda_graph:
            options.add_run_config_entry("gpu_graph_id", str(graph_id))
        return options

    def _new_slot(self, key: tuple[Any, ...], feeds: Mapping[str, np.ndarray]) -> _ShapeSlot:
        inputs = {name: self.to_device(array) for name, array in feeds.items()}
        binding = self._session.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        for name in self.output_names:
            binding.bind_output(name, self.device, self.device_id)
        slot = _ShapeSlot(inputs, binding, self._run_options(NO_GRAPH))
        if self.cuda_graph and self.graphs_captured < self.max_cuda_graphs:
            graph_id = _GRAPH_IDS_TAKEN.get(self._session, 0)
            _GRAPH_IDS_TAKEN[self._session] = graph_id + 1
            # A first run without a graph gives the output shapes; the graph's outputs are then fixed buffers.
            self._session.run_with_iobinding(binding, slot.run_options)
            slot.outputs = [self._ort.OrtValue.ortvalue_from_shape_and_type(value.shape(), _numpy_type(value), self.device, self.device_id)
                            for value in binding.get_outputs()]  # fmt: skip
            binding.clear_binding_outputs()
            for name, value in zip(self.output_names, slot.outputs):
                binding.bind_ortvalue_output(name, value)
            slot.graph_id = graph_id
            slot.run_options = self._run_options(slot.graph_id)
            self.graphs_captured += 1
        self._slots[key] = slot
        # Graph slots stay (their graph and buffers are ONNX Runtime's until the session ends); the least recently
        # used of the others go beyond KEPT_SHAPES, with or without CUDA graphs.
        plain = [k for k, kept in self._slots.items() if kept.graph_id == NO_GRAPH]
        for old in plain[: max(0, len(plain) - KEPT_SHAPES)]:
            del self._slots[old]
        return slot


_ORT_ELEMENT_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(int16)": np.int16, "tensor(uint16)": np.uint16,
    "tensor(int32)": np.int32, "tensor(uint32)": np.uint32, "tensor(int64)": np.int64, "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}  # fmt: skip


def _numpy_type(value: Any) -> Any:
    element = value.data_type()
    if element not in _ORT_ELEMENT_TYPES:
        raise TypeError(f"an output of type {element} cannot be kept in a fixed CUDA graph buffer")
    return _ORT_ELEMENT_TYPES[element]
