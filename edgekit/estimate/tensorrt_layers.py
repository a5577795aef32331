"""The graph as TensorRT runs it: ONNX nodes grouped into the fused layers a TensorRT engine launches, each
costed once (``max(ops / peak, bytes / bandwidth) / efficiency[layer class] + launch cost``) instead of a
roofline and an overhead per ONNX node.

The fusions follow what TensorRT's builder documents (Developer Guide, "Layer Fusion"; ``trtexec
--dumpLayerInfo`` shows them) and NVIDIA's MLPerf engines use:

* **conv / GEMM epilogues**: bias, BatchNorm, activations (Relu, Sigmoid, SiLU's Sigmoid + Mul, GELU's
  Div / Erf / Add / Mul chain), a residual Add and any pointwise chain after a Convolution or MatMul run in
  its kernel: one layer, which reads its inputs (a residual too) and weights once and writes only what
  leaves it;
* **pointwise chains** with no conv / GEMM before them (LayerNorm's reductions and arithmetic, a Softmax)
  fuse into one pointwise layer, or into the layer that produced their input;
* **attention**: a MatMul of two activations (Q x K^T), its scale, mask and Softmax and the MatMul with V
  are one fused multi-head-attention layer (the scores never reach memory);
* **Q/DQ** pairs fold into the INT8 kernels around them; views (Reshape, Squeeze, Flatten...) and Concat
  (TensorRT writes each input into the output buffer) move nothing; Split and Slice are copy layers of their
  own; a Transpose beside a GEMM folds into its operand layout, elsewhere it is a reformat layer (a memory pass);
* pooling and resize layers run on their own, and so do InstanceNorm and GroupNorm (their statistics span the whole
  volume of a channel, so no conv tile can apply them), with the pointwise ops after them fused in; constant
  subgraphs are folded when the engine is built; a ``Loop`` / ``Scan`` is a layer of its own carrying its body's
  work over the iterations counted (:mod:`edgekit.estimate.loop_work`).

Tensor-core kernels work in tiles: a conv / GEMM layer whose output channels or reduction do not fill a
:data:`TILE_N` x :data:`TILE_K` tile, or whose tiles (:data:`TILE_MN` square) leave SMs idle in the last wave (128 CUDA
cores an SM on Ampere and Hopper), computes at that share of the peak; a depthwise convolution runs on the CUDA
cores (the FP32 figure, twice that for FP16 / INT8 packed math).

Precision: TensorRT builds allow TF32 by default (``BuilderFlag::kTF32``), so an FP32 conv / GEMM layer on a
GPU with FP16 tensor cores is timed at the TF32 rate (half the dense FP16 figure) when that beats the CUDA
cores' FP32 figure.

The result is a :class:`~edgekit.estimate.roofline.Roofline` whose "nodes" are layers (named after their
first node, ``op_type`` the fused ops joined by '+'), so the factors, ``edgekit fleet calibrate`` and the
energy figures work on it unchanged: ``node_overhead_us`` is the per-LAYER launch cost there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from edgekit.estimate.graph_cost import VIEW_OPS, GraphCost, NodeCost
from edgekit.estimate.hardware import Hardware
from edgekit.estimate.node_times import NodeTime, Roofline

#: layer classes a conv / GEMM / attention layer is named after; pointwise members join them
ANCHOR_CLASSES = ("conv", "matmul", "attention")
#: node classes that fuse into the layer producing their input (or form a pointwise layer of their own)
POINTWISE_CLASSES = ("elementwise", "normalization")
#: reductions join pointwise chains (LayerNorm's ReduceMean); pooling ops proper are layers of their own
POINTWISE_REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2")
#: normalisations whose statistics span a channel's whole spatial extent: no conv tile holds them, so they run as a
#: layer of their own after the conv (NVIDIA's MLPerf 3D-UNet: the INSTNORM3D plugin, with the activation fused in)
WHOLE_TENSOR_NORMS = ("InstanceNormalization", "GroupNormalization")
#: data movement the engine does without a kernel of its own
FREE_MOVES = ("Concat", "Expand", "Cast", "CastLike")
#: control flow whose body runs as layers each iteration: a layer of its own carrying the body's work
LOOP_OPS = ("Loop", "Scan")
#: the output-channel and reduction tile of a tensor-core kernel, and the output tile (rows x channels) one SM
#: computes (CUTLASS's Ampere implicit-GEMM threadblock tiles: 64 to 256 channels wide, K steps of 32)
TILE_N = 64
TILE_K = 32
TILE_MN = 128
CUDA_CORES_PER_SM = 128


@dataclass
class Layer:
    """One fused layer: its class, its member nodes (graph order) and the tensors it produces."""

    op_class: str
    members: list[NodeCost] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.members[0].name

    @property
    def anchor(self) -> NodeCost | None:
        return next((m for m in self.members if m.op_class in ANCHOR_CLASSES), None)


def _role(node: NodeCost) -> str:
    """'constant', 'free', 'anchor', 'pointwise' or 'own' (a layer of its own: pooling, resize, reformat...)."""
    if not node.inputs and not node.subgraph_calls:
        return "constant"  # computed from constants only: folded at build time
    if node.op_type in LOOP_OPS:
        return "own"  # a loop runs its body's layers each iteration: its work (loop_work), on no other layer
    if node.op_type in VIEW_OPS or node.op_type in FREE_MOVES or node.op_class == "quantize" or node.subgraph_calls:
        return "free"
    if node.op_type == "Transpose":
        return "transpose"  # free beside a GEMM, a reformat layer elsewhere
    if node.op_class in ANCHOR_CLASSES:
        return "anchor"
    if node.op_type in WHOLE_TENSOR_NORMS:
        return "own"
    if node.op_class in POINTWISE_CLASSES or node.op_type in POINTWISE_REDUCTIONS:
        return "pointwise"
    return "own"


def fuse_layers(cost: GraphCost) -> list[Layer]:
    """The layers of ``cost``'s graph as TensorRT fuses them (see the module docstring)."""
    layers: list[Layer] = []
    origin: dict[str, int] = {}  # tensor -> the layer whose value it carries (through free nodes)
    producer: dict[str, NodeCost] = {out: n for n in cost.nodes for out in n.outputs}
    for node in cost.nodes:
        role = _role(node)
        if role == "constant":
            continue
        came_from = [origin[t] for t in node.inputs if t in origin]
        latest = max(came_from) if came_from else None
        if role == "transpose" and _beside_gemm(node, producer, cost):
            role = "free"
        elif role == "transpose":
            role = "own"
        if role == "free":
            if latest is not None:
                origin.update(dict.fromkeys(node.outputs, latest))
            continue
        if role == "anchor" and _second_attention_gemm(node, latest, layers):
            index = latest
            layers[index].op_class = "attention"
            layers[index].members.append(node)
        elif role == "anchor" and node.op_class == "matmul" and len(node.inputs) >= 2:
            layers.append(Layer("attention", [node]))  # Q x K^T: the start of a fused attention layer
            index = len(layers) - 1
        elif role == "anchor":
            layers.append(Layer(node.op_class, [node]))
            index = len(layers) - 1
        elif role == "pointwise" and latest is not None:
            index = latest
            layers[index].members.append(node)
        else:  # a pointwise chain with nothing to fuse into; a pooling, resize, slice, gather or reformat layer
            layers.append(Layer("elementwise" if role == "pointwise" else node.op_class, [node]))
            index = len(layers) - 1
        origin.update(dict.fromkeys(node.outputs, index))
    return [layer for layer in layers if layer.members]


def _beside_gemm(node: NodeCost, producer: Mapping[str, NodeCost], cost: GraphCost) -> bool:
    """A Transpose whose input comes from, or whose output goes to, a MatMul (possibly through views)."""
    source = producer.get(node.inputs[0]) if node.inputs else None
    while source is not None and (source.op_type in VIEW_OPS or source.op_type in FREE_MOVES):
        source = producer.get(source.inputs[0]) if source.inputs else None
    if source is not None and source.op_class == "matmul":
        return True
    frontier, seen = list(node.outputs), set()
    while frontier:
        tensor = frontier.pop()
        for reader in (n for n in cost.nodes if tensor in n.inputs):
            if reader.op_class == "matmul":
                return True
            if (reader.op_type in VIEW_OPS or reader.op_type in FREE_MOVES) and reader.name not in seen:
                seen.add(reader.name)
                frontier.extend(reader.outputs)
    return False


def _second_attention_gemm(node: NodeCost, latest: int | None, layers: list[Layer]) -> bool:
    """A MatMul of two activations whose input comes from an attention layer holding one GEMM (scores x V)."""
    if latest is None or node.op_class != "matmul" or len(node.inputs) < 2:
        return False
    layer = layers[latest]
    gemms = [m for m in layer.members if m.op_class == "matmul"]
    return layer.op_class == "attention" and len(gemms) == 1


def layer_bytes(layer: Layer, members_of: Mapping[str, int], index: int, readers: Mapping[str, list[str]],
                tensor_bytes: Mapping[str, float], origin_free: Mapping[str, set[int]]) -> float:  # fmt: skip
    """Bytes a layer moves: activations it reads from outside, its weights, and what it writes for others."""
    total = 0.0
    read: set[str] = set()
    for member in layer.members:
        total += member.weight_bytes + member.body_bytes  # a Loop / Scan: what its body moves over the iterations
        for tensor in member.inputs:
            inside = tensor in members_of and members_of[tensor] == index or origin_free.get(tensor) == {index}
            if not inside and tensor not in read:
                read.add(tensor)
                total += tensor_bytes.get(tensor, 0.0)
        for tensor in member.outputs:
            outside = [r for r in readers.get(tensor, []) if r != index]
            if outside or not readers.get(tensor):
                total += tensor_bytes.get(tensor, 0.0)
    return total


def _layer_readers(cost: GraphCost, layers: list[Layer]) -> tuple[dict[str, int], dict[str, list[int]], dict[str, set[int]]]:
    """(tensor -> the layer that computes it, tensor -> the layers that read it (through free nodes), tensor made by
    free nodes -> the layers whose values it carries)."""
    member_layer = {m.name: i for i, layer in enumerate(layers) for m in layer.members}
    members_of = {t: member_layer[m.name] for layer in layers for m in layer.members for t in m.outputs}
    readers: dict[str, list[int]] = {}
    via_free: dict[str, set[int]] = {}
    free = [n for n in cost.nodes if _role(n) in ("free", "transpose") and n.name not in member_layer]
    for node in free:  # graph order: a free node's outputs carry the layers of its inputs
        carried: set[int] = set()
        for t in node.inputs:
            carried |= {members_of[t]} if t in members_of else via_free.get(t, set())
        for out in node.outputs:
            via_free[out] = carried
    consumers: dict[str, list[NodeCost]] = {}
    for node in cost.nodes:
        for t in node.inputs:
            consumers.setdefault(t, []).append(node)

    def final_readers(tensor: str, depth: int = 0) -> list[int]:
        found: list[int] = []
        for reader in consumers.get(tensor, []):
            if reader.name in member_layer:
                found.append(member_layer[reader.name])
            elif depth < 64 and _role(reader) in ("free", "transpose"):
                for out in reader.outputs:
                    found.extend(final_readers(out, depth + 1))
        return found

    for tensor in members_of:
        readers[tensor] = final_readers(tensor)
    return members_of, readers, via_free


def tf32_peak(hardware: Hardware) -> float | None:
    """TensorRT's default TF32 rate for FP32 convs / GEMMs: half the dense FP16 tensor figure, when higher than FP32."""
    fp16, fp32 = hardware.peak_ops.get("fp16"), hardware.peak_ops.get("fp32")
    if fp16 and (not fp32 or fp16 / 2 > fp32):
        return fp16 / 2
    return None


def tile_share(anchor: NodeCost, hardware: Hardware) -> float:
    """The share of the tensor-core peak a conv / GEMM reaches for its shape: tile fill of N and K, times the last
    wave's fill of the SMs (1 when the GEMM dims or the SM count are unknown)."""
    if len(anchor.gemm_mnk) != 3:
        return 1.0
    m, n, k = anchor.gemm_mnk
    if min(m, n, k) <= 0:
        return 1.0
    share = n / (-(-n // TILE_N) * TILE_N) * (k / (-(-k // TILE_K) * TILE_K))
    sms = (hardware.gpu_cuda_cores or 0) // CUDA_CORES_PER_SM
    if sms:
        tiles = -(-m // TILE_MN) * -(-n // TILE_MN)
        waves = -(-tiles // sms)
        share *= tiles / (waves * sms)
    return share


def layer_work_s(layer: Layer, moved: float, hardware: Hardware) -> tuple[float, float, str]:
    """(compute seconds at the peak, memory seconds at the full bandwidth, the precision whose peak its GEMM used)."""
    anchor = layer.anchor
    precision = anchor.precision if anchor is not None else layer.members[0].precision
    peak, used, _ = hardware.resolve(precision)
    if anchor is not None and precision == "fp32" and (tf32 := tf32_peak(hardware)) is not None:
        peak, used = tf32, "tf32"
    pointwise_peak = hardware.resolve("fp32")[0]
    anchor_ops = sum(m.ops for m in layer.members if m.op_class in ANCHOR_CLASSES)
    other_ops = sum(m.ops for m in layer.members if m.op_class not in ANCHOR_CLASSES)
    if anchor is not None and anchor.kind.startswith("conv-depthwise"):
        peak, used = pointwise_peak * (1 if precision == "fp32" else 2), f"{precision} on CUDA cores"
    elif anchor is not None:
        peak *= tile_share(anchor, hardware)
    compute_s = anchor_ops / peak + other_ops / pointwise_peak
    memory_s = moved / hardware.bandwidth_bytes_s if hardware.bandwidth_bytes_s else 0.0
    return compute_s, memory_s, used


@dataclass(frozen=True)
class LayerWork:
    """One fused layer's work: what it computes, how long at peak and at full bandwidth."""

    name: str
    op_type: str
    op_class: str
    precision: str  # its GEMM's precision ("tf32" for an FP32 GEMM TensorRT runs as TF32)
    compute_s: float
    memory_s: float


def layer_work(cost: GraphCost, hardware: Hardware) -> list[LayerWork]:
    """Every TensorRT layer of ``cost`` with its compute and memory time at efficiency 1."""
    layers = fuse_layers(cost)
    members_of, readers, via_free = _layer_readers(cost, layers)
    out = []
    for index, layer in enumerate(layers):
        moved = layer_bytes(layer, members_of, index, readers, cost.tensor_bytes, via_free)
        compute_s, memory_s, used = layer_work_s(layer, moved, hardware)
        op_type = "+".join(dict.fromkeys(m.op_type for m in layer.members))
        out.append(LayerWork(layer.name, op_type, layer.op_class, used, compute_s, memory_s))
    return out


def tensorrt_roofline(cost: GraphCost, hardware: Hardware) -> Roofline:
    """The roofline of ``cost`` as TensorRT layers. A layer streams its bytes at :data:`TENSORRT_MEMORY_SHARE` of the
    bandwidth whatever its class, and computes at its class's efficiency: its time with the prior factors is
    ``max(compute / e_class, memory / memory_share)``. It is given as ``roofline_ms`` = that time x the class's prior,
    so the factors divide it as any node's (fitted factors scale it, the prior ones give exactly that time)."""
    from edgekit.estimate.node_times import TENSORRT_EFFICIENCY, TENSORRT_MEMORY_SHARE

    work = layer_work(cost, hardware)
    times = []
    for layer in work:
        prior = TENSORRT_EFFICIENCY.get(layer.op_class, 1.0)
        seconds = max(layer.compute_s / prior, layer.memory_s / TENSORRT_MEMORY_SHARE)
        bound = "compute" if layer.compute_s / prior >= layer.memory_s / TENSORRT_MEMORY_SHARE else "memory"
        times.append(NodeTime(layer.name, layer.op_type, layer.op_class, layer.precision, seconds * prior * 1e3, bound, 0.0))
    nodes = sum(1 for n in cost.nodes if _role(n) != "constant")
    notes = [f"TensorRT-shaped layers: {nodes} ONNX nodes run as {len(work)} fused layers (conv/GEMM epilogues, pointwise "
             f"chains, fused attention, Q/DQ folded, views and concats free); a layer streams memory at "
             f"{TENSORRT_MEMORY_SHARE:g} of the bandwidth"]  # fmt: skip
    if any(layer.precision == "tf32" for layer in work):
        notes.append("FP32 conv / GEMM layers at the TF32 rate (half the dense FP16 tensor figure): TensorRT enables TF32 by default")
    return Roofline(tuple(times), len(times), tuple(notes))
