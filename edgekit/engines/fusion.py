"""ONNX Runtime's transformer fusions (Attention, SkipLayerNormalization, BiasGelu) for BERT-like graphs.

The FP32/FP16 ONNX Runtime build applies them for CPU targets, and ``--precision auto`` tries the fused
graph as a variant. On MiniLM (CPU, padded sentences, denormals flushed) the fused FP32 graph ran 86 ms
against 95 ms unfused at batch 8 x 128, and 11.6 against 12.7 ms at batch 1.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

#: Ops between an attention's score MatMul and its Softmax (scale, mask, bias), and between the Softmax
#: and the MatMul with the values (dropout, casts).
_SCORE_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Cast", "Reshape", "Transpose"})
_PROBS_OPS = frozenset({"Dropout", "Cast", "Identity", "Reshape", "Transpose"})
NO_ATTENTION = "no Softmax between two MatMuls (attention) in the graph: nothing the transformer fusions could match"


def attention_softmaxes(model: Any) -> int:
    """How many Softmax nodes sit where attention puts them: fed by a MatMul (through scale/mask ops) and
    feeding a MatMul (through dropout/casts). ONNX Runtime's fusions find nothing to fuse without one,
    and on a CNN their pattern search alone took 29 s (PP-OCRv4 detector, 1.2k nodes)."""
    producer = {output: node for node in model.graph.node for output in node.output}
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def fed_by_matmul(name: str, hops: int) -> bool:
        node = producer.get(name)
        if node is None or hops < 0:
            return False
        if node.op_type in ("MatMul", "Einsum"):
            return True
        return node.op_type in _SCORE_OPS and any(fed_by_matmul(i, hops - 1) for i in node.input[:1] if node.op_type != "Where") or (
            node.op_type == "Where" and len(node.input) == 3 and any(fed_by_matmul(i, hops - 1) for i in node.input[1:]))

    def feeds_matmul(name: str, hops: int) -> bool:
        for node in consumers.get(name, []):
            if node.op_type in ("MatMul", "Einsum"):
                return True
            if hops > 0 and node.op_type in _PROBS_OPS and any(feeds_matmul(o, hops - 1) for o in node.output):
                return True
        return False

    return sum(1 for node in model.graph.node
               if node.op_type == "Softmax" and fed_by_matmul(node.input[0], 4) and feeds_matmul(node.output[0], 2))


#: Fusions done in this process: (source path, size, mtime) -> (fused file, its size and mtime, op counts).
#: ``--precision auto`` fuses the FP32 export for its transformer-fusion candidates and, when it chooses FP32,
#: the engine build fuses the same file again (SegFormer: 0.8 s, a tenth of the whole auto build).
_FUSED: dict[tuple[str, int, int], tuple[Path, tuple[int, int] | None, dict[str, int] | None]] = {}


def _file_key(path: Path) -> tuple[int, int]:
    stat = Path(path).stat()
    return stat.st_size, stat.st_mtime_ns


def transformer_fusion(src: Path, dst: Path) -> dict[str, int] | None:
    """Write ``src`` with ONNX Runtime's BERT fusions applied to ``dst``; returns the fused op counts,
    or ``None`` (nothing written) when no attention block was recognised. A source fused before in this
    process, unchanged since (nor the file fused then), is copied from that result instead of fused again.

    Before fusing, multi-axis ``Unsqueeze`` nodes fed by a graph input (the attention-mask expansion
    ``mask[:, None, None, :]`` the dynamo exporter writes as one node) are split into single-axis ones:
    the pattern ONNX Runtime's attention fusion matches. The mask stays a raw 0/1 mask (no conversion
    to sequence lengths), so left padding keeps its meaning."""
    import shutil

    key = (str(Path(src).resolve()), *_file_key(src))
    if key in _FUSED:
        earlier, written, fused = _FUSED[key]
        if fused is None:
            return None
        if written is not None and earlier.is_file() and _file_key(earlier) == written:
            if Path(dst).resolve() != earlier.resolve():
                shutil.copyfile(earlier, dst)
            return dict(fused)
    fused = _fuse(src, dst)
    _FUSED[key] = (Path(dst), _file_key(dst) if fused is not None and not _has_external_data(dst) else None, fused)
    return fused


def _has_external_data(path: Path) -> bool:
    """A fused model saved with its weights beside it (over 2 GB): not copied from the memo, fused again."""
    path = Path(path)
    return any(other != path for other in path.parent.glob(path.name + "*"))


def _fuse(src: Path, dst: Path) -> dict[str, int] | None:
    import onnx
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    if not attention_softmaxes(onnx.load(str(src), load_external_data=False)):
        log.info("transformer fusion of %s skipped: %s", src, NO_ATTENTION)
        return None
    model = onnx.load(str(src), load_external_data=True)
    _split_input_unsqueezes(model)
    staged = dst.with_name(dst.stem + ".unfused.onnx")
    large = model.ByteSize() > 1_800_000_000
    onnx.save(model, str(staged), save_as_external_data=large, location=staged.name + ".data" if large else None)
    options = FusionOptions("bert")
    options.attention_mask_format = AttentionMaskFormat.AttentionMask
    try:
        with _optimizer_output_to_log():
            optimized = optimize_model(str(staged), model_type="bert", num_heads=0, hidden_size=0, opt_level=0, optimization_options=options)
    except Exception as exc:  # the optimizer's pattern matching raises on graphs it does not understand
        log.info("transformer fusion of %s failed: %s", src, exc)
        return None
    finally:
        for leftover in (staged, staged.with_name(staged.name + ".data")):
            leftover.unlink(missing_ok=True)
    fused = {op: int(count) for op, count in optimized.get_fused_operator_statistics().items() if count}
    if not fused.get("Attention"):
        return None
    optimized.save_model_to_file(str(dst), use_external_data_format=large)
    return fused


class _OptimizerRecordsAsInfo(logging.Filter):
    """Takes the optimizer's own log records (its modules sit under ``onnxruntime/transformers``) off the
    handlers and logs them again through this module at INFO."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.pathname.startswith(self.folder) or record.levelno > logging.WARNING:
            return True
        log.info("ONNX Runtime's transformer optimizer (%s): %s", record.name, record.getMessage())
        return False


@contextlib.contextmanager
def _optimizer_output_to_log() -> Iterator[None]:
    """ONNX Runtime's transformer optimizer prints to stdout (``failed in shape inference``) and warns
    (``symbolic shape inference disabled or failed``) when its symbolic shape inference cannot follow a
    graph (the dynamo exporter's ``Expand`` of the attention mask). What it then leaves unfused
    (SkipLayerNormalization) ONNX Runtime fuses when the session loads, so neither is a problem of the
    build; and stdout is a command's results (``edgekit build --json | jq``). Both go to this module's
    log at INFO while the optimizer runs."""
    import onnxruntime.transformers

    folder = str(Path(onnxruntime.transformers.__file__).resolve().parent)
    demote = _OptimizerRecordsAsInfo(folder)
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(demote)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        for handler in handlers:
            handler.removeFilter(demote)
        for line in printed.getvalue().splitlines():
            if line.strip():
                log.info("ONNX Runtime's transformer optimizer printed: %s", line.strip())


def _split_input_unsqueezes(model: Any) -> int:
    from onnx import helper, numpy_helper

    graph = model.graph
    # the rank of each graph input whose shape is known (None: unknown)
    ranks = {value.name: len(value.type.tensor_type.shape.dim) if value.type.tensor_type.HasField("shape") else None for value in graph.input}
    constants = {tensor.name: tensor for tensor in graph.initializer}
    nodes, split = [], 0
    for node in graph.node:
        axes = numpy_helper.to_array(constants[node.input[1]]).reshape(-1) if node.op_type == "Unsqueeze" and len(node.input) == 2 and node.input[1] in constants else None
        rank_in = ranks.get(node.input[0]) if axes is not None else None
        if axes is None or node.input[0] not in ranks or len(axes) < 2 or (rank_in is None and min(axes) < 0):
            nodes.append(node)
            continue
        # Unsqueeze counts negative axes from the end of its output (rank_in + len(axes) dims): applied one at a time in
        # ascending order, non-negative axes give the same shape, negative ones would count from each step's own end.
        current = node.input[0]
        normalised = [int(a) for a in axes] if rank_in is None else [int(a) % (rank_in + len(axes)) for a in axes]
        for step, axis in enumerate(sorted(normalised)):
            axis_name = f"{node.name}.axis{step}"
            graph.initializer.append(numpy_helper.from_array(np.array([axis], dtype=np.int64), axis_name))
            out = node.output[0] if step == len(axes) - 1 else f"{node.output[0]}.step{step}"
            nodes.append(helper.make_node("Unsqueeze", [current, axis_name], [out], name=f"{node.name}.{step}"))
            current = out
        split += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return split
