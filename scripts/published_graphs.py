"""The graphs scripts/estimate_published.py estimates, built offline: transformers configs (ResNet-50 v1.5,
BERT-large) and a hand-written YOLOv8n, seeded weights, exported to ONNX; nothing is downloaded (latency does
not depend on the weights' values). :data:`GRAPHS` maps the ``graph`` field of docs/benchmarks/published_jetson.yaml
to its builder, which writes the ONNX file and returns how it was made."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edgekit.errors import EdgekitError


class PublishedFiguresError(EdgekitError):
    """The published-figures file is malformed (names the row, the field and the fix), or a graph cannot be built."""


def _export(module: Any, example: dict[str, Any], output_names: list[str], path: Path, dynamic: dict[str, dict[int, str]]) -> Path:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    with torch.inference_mode():
        torch.onnx.export(module.eval(), tuple(example.values()), str(tmp), input_names=list(example), output_names=output_names,
                          dynamic_axes=dynamic, opset_version=17, dynamo=False)  # fmt: skip
    tmp.replace(path)
    return path


class _First:  # a wrapper returning one tensor of a transformers ModelOutput
    def __new__(cls, model: Any, fields: Sequence[str]) -> Any:
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args: Any) -> Any:
                out = self.model(*args)
                return tuple(getattr(out, f) for f in fields) if len(fields) > 1 else getattr(out, fields[0])

        return Wrapped()


def build_resnet50(path: Path) -> str:
    """ResNet-50 v1.5 (transformers' default ResNetConfig: bottleneck 3-4-6-3, 256..2048 wide, stride on the 3x3),
    1000 classes, 224x224, seed 0."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    model = _First(ResNetForImageClassification(ResNetConfig(num_labels=1000)).eval(), ["logits"])
    _export(model, {"pixel_values": torch.zeros(1, 3, 224, 224)}, ["logits"], path,
            {"pixel_values": {0: "batch"}, "logits": {0: "batch"}})  # fmt: skip
    return "transformers ResNetConfig() (ResNet-50 v1.5), 1000 classes, seed 0, 224x224"


def build_bert_large(path: Path, seq: int = 384) -> str:
    """BERT-large for SQuAD question answering (MLPerf's bert-99 model): 24 layers, 1024 hidden, 16 heads,
    4096 FFN, 30522-token vocabulary, start/end logits, ``seq`` tokens (384: MLPerf's padded length). Inputs: token, segment and position ids, no padding
    mask (NVIDIA's harness runs each sequence at its own length instead of masking padding; a mask's elementwise
    work is small beside the GEMMs). Only the batch is dynamic, and the weights are stored beside the graph
    (``bert-large.onnx.data``): with a dynamic sequence, a mask or position ids sliced from the model's buffer, ONNX
    shape inference loses the shapes of the embeddings (at batch 1) and of the mask nodes, and the estimate would run the whole graph on ONNX Runtime at the benchmark batch to
    learn them (tens of GB at batch 256 x 384 tokens); with the weights inline it would copy 1.3 GB several times."""
    import onnx
    import torch
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    bert = BertForQuestionAnswering(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, token_type_ids: Any, position_ids: Any) -> Any:
            out = self.bert(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids)
            return out.start_logits, out.end_logits

    if not 1 <= seq <= config.max_position_embeddings:
        raise PublishedFiguresError(f"BERT-large cannot run {seq} tokens", hint=f"a length from 1 to {config.max_position_embeddings}")
    ids = torch.zeros(1, seq, dtype=torch.int64)
    example = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "position_ids": torch.arange(seq).unsqueeze(0)}
    inline = path.with_name(path.stem + ".inline.onnx")
    _export(Logits(), example, ["start_logits", "end_logits"], inline,
            {name: {0: "batch"} for name in [*example, "start_logits", "end_logits"]})  # fmt: skip
    model = _without_padding_mask(onnx.load(str(inline)))
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=path.name + ".data")
    inline.unlink()
    return ("transformers BertConfig (BERT-large: 24 layers, 1024 hidden, 16 heads, 4096 FFN) + QA head, seed 0, "
            f"{seq} tokens, the all-ones padding mask folded to 0")  # fmt: skip


def _without_padding_mask(model: Any) -> Any:
    """The BERT graph with its additive attention mask (built from an all-ones mask: zeros) replaced by a constant 0.
    Its Expand / Where chain takes shapes that ONNX shape inference cannot follow at batch 1, which would leave every
    attention Add, Softmax and score-value MatMul without a shape (and uncounted)."""
    import numpy as np
    from onnx import numpy_helper

    consumers = {name: [n for n in model.graph.node if name in n.input] for n in model.graph.node for name in n.output}
    masks = [out for node in model.graph.node if node.op_type == "Where" for out in node.output
             if sum("attention/self/Add" in c.name for c in consumers.get(out, [])) == 24]  # fmt: skip
    if len(masks) != 1:
        raise PublishedFiguresError(f"expected one attention-mask tensor feeding the 24 attention Adds, found {len(masks)}",
                                    hint="the transformers export changed: update _without_padding_mask")  # fmt: skip
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), "zero_attention_mask"))
    for node in consumers[masks[0]]:
        node.input[list(node.input).index(masks[0])] = "zero_attention_mask"
    while True:  # drop the nodes nothing reads any more
        used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
        dead = [n for n in model.graph.node if not any(o in used for o in n.output)]
        if not dead:
            return model
        for node in dead:
            model.graph.node.remove(node)


def _yolo_parts() -> Any:
    """The Ultralytics building blocks both YOLO graphs use: Conv = Conv2d + BatchNorm + SiLU (groups for the
    depthwise DWConv), Bottleneck, C2f, SPPF and the anchor-free decoupled Detect head with a 16-bin DFL box
    decoder (``depthwise_cls``: YOLO11's class branch, DWConv + 1x1 Conv pairs); output [batch, 4 + classes, anchors]."""
    import torch
    from torch import nn

    class Conv(nn.Module):
        def __init__(self, c_in: int, c_out: int, k: int = 1, s: int = 1, g: int = 1, act: bool = True) -> None:
            super().__init__()
            self.conv = nn.Conv2d(c_in, c_out, k, s, k // 2, groups=g, bias=False)
            self.bn = nn.BatchNorm2d(c_out, eps=1e-3)
            self.act = nn.SiLU() if act else nn.Identity()

        def forward(self, x: Any) -> Any:
            return self.act(self.bn(self.conv(x)))

    class Bottleneck(nn.Module):
        def __init__(self, c: int, shortcut: bool, e: float = 1.0) -> None:
            super().__init__()
            self.cv1, self.cv2, self.add = Conv(c, int(c * e), 3), Conv(int(c * e), c, 3), shortcut

        def forward(self, x: Any) -> Any:
            y = self.cv2(self.cv1(x))
            return x + y if self.add else y

    class C2f(nn.Module):
        def __init__(self, c_in: int, c_out: int, n: int, shortcut: bool) -> None:
            super().__init__()
            self.c = c_out // 2
            self.cv1 = Conv(c_in, 2 * self.c, 1)
            self.cv2 = Conv((2 + n) * self.c, c_out, 1)
            self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

        def forward(self, x: Any) -> Any:
            parts = list(self.cv1(x).split((self.c, self.c), 1))
            for block in self.m:
                parts.append(block(parts[-1]))
            return self.cv2(torch.cat(parts, 1))

    class SPPF(nn.Module):
        def __init__(self, c_in: int, c_out: int) -> None:
            super().__init__()
            hidden = c_in // 2
            self.cv1, self.cv2 = Conv(c_in, hidden, 1), Conv(hidden * 4, c_out, 1)
            self.m = nn.MaxPool2d(5, 1, 2)

        def forward(self, x: Any) -> Any:
            y = [self.cv1(x)]
            for _ in range(3):
                y.append(self.m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class Detect(nn.Module):
        def __init__(self, channels: tuple[int, ...], classes: int = 80, bins: int = 16, depthwise_cls: bool = False) -> None:
            super().__init__()
            self.classes, self.bins, self.strides = classes, bins, (8, 16, 32)
            box_c, cls_c = max(16, channels[0] // 4, 4 * bins), max(channels[0], min(classes, 100))
            self.box = nn.ModuleList(nn.Sequential(Conv(c, box_c, 3), Conv(box_c, box_c, 3), nn.Conv2d(box_c, 4 * bins, 1)) for c in channels)
            if depthwise_cls:
                self.cls = nn.ModuleList(nn.Sequential(Conv(c, c, 3, g=c), Conv(c, cls_c, 1), Conv(cls_c, cls_c, 3, g=cls_c), Conv(cls_c, cls_c, 1),
                                                       nn.Conv2d(cls_c, classes, 1)) for c in channels)  # fmt: skip
            else:
                self.cls = nn.ModuleList(nn.Sequential(Conv(c, cls_c, 3), Conv(cls_c, cls_c, 3), nn.Conv2d(cls_c, classes, 1)) for c in channels)
            self.dfl = nn.Conv2d(bins, 1, 1, bias=False).requires_grad_(False)
            self.dfl.weight.data[:] = torch.arange(bins, dtype=torch.float32).view(1, bins, 1, 1)

        def forward(self, features: list[Any]) -> Any:
            batch = features[0].shape[0]
            outs, anchors, strides = [], [], []
            for i, x in enumerate(features):
                outs.append(torch.cat((self.box[i](x), self.cls[i](x)), 1).view(batch, 4 * self.bins + self.classes, -1))
                h, w = x.shape[2], x.shape[3]
                ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
                anchors.append(torch.stack((xs, ys), -1).view(-1, 2))
                strides.append(torch.full((h * w, 1), float(self.strides[i])))
            out = torch.cat(outs, 2)
            box, cls = out.split((4 * self.bins, self.classes), 1)
            anchor = torch.cat(anchors).transpose(0, 1).unsqueeze(0)
            stride = torch.cat(strides).transpose(0, 1)
            dist = self.dfl(box.view(batch, 4, self.bins, -1).transpose(2, 1).softmax(1)).view(batch, 4, -1)
            lt, rb = dist.chunk(2, 1)
            x1y1, x2y2 = anchor - lt, anchor + rb
            boxes = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * stride
            return torch.cat((boxes, cls.sigmoid()), 1)

    from types import SimpleNamespace

    return SimpleNamespace(Conv=Conv, Bottleneck=Bottleneck, C2f=C2f, SPPF=SPPF, Detect=Detect, torch=torch, nn=nn)


def _yolov8n_module() -> Any:
    """YOLOv8n as Ultralytics describes it (yolov8.yaml at depth 0.33, width 0.25): C2f blocks, SPPF, a PAN neck
    and the Detect head, 80 classes; output [batch, 84, anchors] (boxes in pixels, class probabilities)."""
    p = _yolo_parts()
    torch, nn, Conv, C2f, SPPF, Detect = p.torch, p.nn, p.Conv, p.C2f, p.SPPF, p.Detect

    class YOLOv8n(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.b0, self.b1, self.b2 = Conv(3, 16, 3, 2), Conv(16, 32, 3, 2), C2f(32, 32, 1, True)
            self.b3, self.b4 = Conv(32, 64, 3, 2), C2f(64, 64, 2, True)
            self.b5, self.b6 = Conv(64, 128, 3, 2), C2f(128, 128, 2, True)
            self.b7, self.b8, self.b9 = Conv(128, 256, 3, 2), C2f(256, 256, 1, True), SPPF(256, 256)
            self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
            self.h12, self.h15 = C2f(384, 128, 1, False), C2f(192, 64, 1, False)
            self.h16, self.h18 = Conv(64, 64, 3, 2), C2f(192, 128, 1, False)
            self.h19, self.h21 = Conv(128, 128, 3, 2), C2f(384, 256, 1, False)
            self.detect = Detect((64, 128, 256))

        def forward(self, x: Any) -> Any:
            p3 = self.b4(self.b3(self.b2(self.b1(self.b0(x)))))
            p4 = self.b6(self.b5(p3))
            p5 = self.b9(self.b8(self.b7(p4)))
            n4 = self.h12(torch.cat((self.up(p5), p4), 1))
            o3 = self.h15(torch.cat((self.up(n4), p3), 1))
            o4 = self.h18(torch.cat((self.h16(o3), n4), 1))
            o5 = self.h21(torch.cat((self.h19(o4), p5), 1))
            return self.detect([o3, o4, o5])

    return YOLOv8n()


#: YOLO11 scales as Ultralytics' yolo11.yaml gives them: (depth, width, max channels)
YOLO11_SCALES = {"n": (0.50, 0.25, 1024), "s": (0.50, 0.50, 1024), "m": (0.50, 1.00, 512), "l": (1.00, 1.00, 512), "x": (1.00, 1.50, 512)}


def _yolo11_module(scale: str) -> Any:
    """YOLO11 at ``scale`` as Ultralytics' yolo11.yaml describes it: C3k2 blocks (C3k inside at m/l/x), SPPF, C2PSA
    (position-sensitive attention, heads of 64 channels), the PAN neck and the Detect head with YOLO11's depthwise
    class branch, 80 classes, 640x640."""
    p = _yolo_parts()
    torch, nn, Conv, Bottleneck, SPPF, Detect = p.torch, p.nn, p.Conv, p.Bottleneck, p.SPPF, p.Detect
    depth, width, max_c = YOLO11_SCALES[scale]
    c3k_everywhere = scale in "mlx"

    def ch(c: int) -> int:
        return int(-(-min(c, max_c) * width // 8) * 8)

    def reps(n: int) -> int:
        return max(round(n * depth), 1) if n > 1 else n

    class C3k(nn.Module):
        def __init__(self, c_in: int, c_out: int, n: int, shortcut: bool) -> None:
            super().__init__()
            hidden = c_out // 2
            self.cv1, self.cv2, self.cv3 = Conv(c_in, hidden, 1), Conv(c_in, hidden, 1), Conv(2 * hidden, c_out, 1)
            self.m = nn.Sequential(*(Bottleneck(hidden, shortcut) for _ in range(n)))

        def forward(self, x: Any) -> Any:
            return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))

    class C3k2(nn.Module):
        def __init__(self, c_in: int, c_out: int, n: int, c3k: bool, e: float = 0.5, shortcut: bool = True) -> None:
            super().__init__()
            self.c = int(c_out * e)
            self.cv1, self.cv2 = Conv(c_in, 2 * self.c, 1), Conv((2 + n) * self.c, c_out, 1)
            c3k = c3k or c3k_everywhere
            self.m = nn.ModuleList(C3k(self.c, self.c, 2, shortcut) if c3k else Bottleneck(self.c, shortcut, 0.5) for _ in range(n))

        def forward(self, x: Any) -> Any:
            parts = list(self.cv1(x).split((self.c, self.c), 1))
            for block in self.m:
                parts.append(block(parts[-1]))
            return self.cv2(torch.cat(parts, 1))

    class Attention(nn.Module):
        def __init__(self, dim: int, heads: int) -> None:
            super().__init__()
            self.heads, self.head_dim = heads, dim // heads
            self.key_dim = int(self.head_dim * 0.5)
            self.scale = self.key_dim**-0.5
            self.qkv = Conv(dim, dim + 2 * self.key_dim * heads, 1, act=False)
            self.proj, self.pe = Conv(dim, dim, 1, act=False), Conv(dim, dim, 3, g=dim, act=False)

        def forward(self, x: Any) -> Any:
            b, c, h, w = x.shape
            q, k, v = self.qkv(x).view(b, self.heads, 2 * self.key_dim + self.head_dim, h * w).split((self.key_dim, self.key_dim, self.head_dim), 2)
            attn = ((q.transpose(-2, -1) @ k) * self.scale).softmax(-1)
            y = (v @ attn.transpose(-2, -1)).view(b, c, h, w) + self.pe(v.reshape(b, c, h, w))
            return self.proj(y)

    class PSABlock(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.attn = Attention(c, max(c // 64, 1))
            self.ffn = nn.Sequential(Conv(c, 2 * c, 1), Conv(2 * c, c, 1, act=False))

        def forward(self, x: Any) -> Any:
            x = x + self.attn(x)
            return x + self.ffn(x)

    class C2PSA(nn.Module):
        def __init__(self, c_io: int, n: int) -> None:
            super().__init__()
            self.c = c_io // 2
            self.cv1, self.cv2 = Conv(c_io, 2 * self.c, 1), Conv(2 * self.c, c_io, 1)
            self.m = nn.Sequential(*(PSABlock(self.c) for _ in range(n)))

        def forward(self, x: Any) -> Any:
            a, b = self.cv1(x).split((self.c, self.c), 1)
            return self.cv2(torch.cat((a, self.m(b)), 1))

    c64, c128, c256, c512, c1024 = ch(64), ch(128), ch(256), ch(512), ch(1024)

    class YOLO11(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.b0, self.b1, self.b2 = Conv(3, c64, 3, 2), Conv(c64, c128, 3, 2), C3k2(c128, c256, reps(2), False, 0.25)
            self.b3, self.b4 = Conv(c256, c256, 3, 2), C3k2(c256, c512, reps(2), False, 0.25)
            self.b5, self.b6 = Conv(c512, c512, 3, 2), C3k2(c512, c512, reps(2), True)
            self.b7, self.b8 = Conv(c512, c1024, 3, 2), C3k2(c1024, c1024, reps(2), True)
            self.b9, self.b10 = SPPF(c1024, c1024), C2PSA(c1024, reps(2))
            self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
            self.h13 = C3k2(c1024 + c512, c512, reps(2), False)
            self.h16 = C3k2(c512 + c512, c256, reps(2), False)
            self.h17, self.h19 = Conv(c256, c256, 3, 2), C3k2(c256 + c512, c512, reps(2), False)
            self.h20, self.h22 = Conv(c512, c512, 3, 2), C3k2(c512 + c1024, c1024, reps(2), True)
            self.detect = Detect((c256, c512, c1024), depthwise_cls=True)

        def forward(self, x: Any) -> Any:
            p3 = self.b4(self.b3(self.b2(self.b1(self.b0(x)))))
            p4 = self.b6(self.b5(p3))
            p5 = self.b10(self.b9(self.b8(self.b7(p4))))
            n4 = self.h13(torch.cat((self.up(p5), p4), 1))
            o3 = self.h16(torch.cat((self.up(n4), p3), 1))
            o4 = self.h19(torch.cat((self.h17(o3), n4), 1))
            o5 = self.h22(torch.cat((self.h20(o4), p5), 1))
            return self.detect([o3, o4, o5])

    return YOLO11()


def _yolo11_builder(scale: str) -> Callable[[Path], str]:
    def build(path: Path) -> str:
        import torch

        torch.manual_seed(0)
        module = _yolo11_module(scale).eval()
        params = sum(p.numel() for p in module.parameters())
        _export(module, {"images": torch.zeros(1, 3, 640, 640)}, ["output0"], path, {"images": {0: "batch"}, "output0": {0: "batch"}})
        depth, width, max_c = YOLO11_SCALES[scale]
        return (f"hand-written YOLO11{scale} (Ultralytics yolo11.yaml at depth {depth} / width {width} / max channels {max_c}, "
                f"80 classes, {params / 1e6:.2f} M parameters with BatchNorm), seed 0, 640x640")  # fmt: skip

    build.__name__ = f"build_yolo11{scale}"
    return build


def build_yolov8n(path: Path) -> str:
    import torch

    torch.manual_seed(0)
    _export(_yolov8n_module().eval(), {"images": torch.zeros(1, 3, 640, 640)}, ["output0"], path,
            {"images": {0: "batch"}, "output0": {0: "batch"}})  # fmt: skip
    return "hand-written YOLOv8n (Ultralytics yolov8.yaml at depth 0.33 / width 0.25, 80 classes), seed 0, 640x640"


def _retinanet_module(classes: int = 264, anchors: int = 9) -> Any:
    """RetinaNet as MLPerf's object-detection benchmark defines it (torchvision's retinanet with a ResNeXt-50 32x4d
    backbone, FPN P3-P7 of 256 channels, 4-conv class and box heads shared over the levels, 264 OpenImages classes,
    9 anchors a location), written out here because torchvision is not installed. NMS is not part of the graph."""
    import torch
    from torch import nn

    def conv_bn(c_in: int, c_out: int, k: int, s: int = 1, g: int = 1, act: bool = True) -> nn.Sequential:
        layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, k, s, k // 2, groups=g, bias=False), nn.BatchNorm2d(c_out)]
        return nn.Sequential(*layers, nn.ReLU()) if act else nn.Sequential(*layers)

    class Bottleneck(nn.Module):  # ResNeXt 32x4d: width = planes x 2, 32 groups, expansion 4
        def __init__(self, c_in: int, planes: int, stride: int) -> None:
            super().__init__()
            width, out = planes * 2, planes * 4
            self.body = nn.Sequential(conv_bn(c_in, width, 1), conv_bn(width, width, 3, stride, 32), conv_bn(width, out, 1, act=False))
            self.down = conv_bn(c_in, out, 1, stride, act=False) if stride != 1 or c_in != out else nn.Identity()

        def forward(self, x: Any) -> Any:
            return torch.relu(self.body(x) + self.down(x))

    def stage(c_in: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
        return nn.Sequential(Bottleneck(c_in, planes, stride), *[Bottleneck(planes * 4, planes, 1) for _ in range(blocks - 1)])

    def head(out: int) -> nn.Sequential:
        return nn.Sequential(*[m for _ in range(4) for m in (nn.Conv2d(256, 256, 3, 1, 1), nn.ReLU())], nn.Conv2d(256, out, 3, 1, 1))

    class RetinaNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
            self.c2, self.c3 = stage(64, 64, 3, 1), stage(256, 128, 4, 2)
            self.c4, self.c5 = stage(512, 256, 6, 2), stage(1024, 512, 3, 2)
            self.lateral = nn.ModuleList(nn.Conv2d(c, 256, 1) for c in (512, 1024, 2048))
            self.smooth = nn.ModuleList(nn.Conv2d(256, 256, 3, 1, 1) for _ in range(3))
            self.p6, self.p7 = nn.Conv2d(256, 256, 3, 2, 1), nn.Conv2d(256, 256, 3, 2, 1)
            self.cls, self.box = head(anchors * classes), head(anchors * 4)

        def forward(self, x: Any) -> Any:
            c3 = self.c3(self.c2(self.stem(x)))
            c4 = self.c4(c3)
            c5 = self.c5(c4)
            p5 = self.lateral[2](c5)
            p4 = self.lateral[1](c4) + nn.functional.interpolate(p5, size=c4.shape[-2:], mode="nearest")
            p3 = self.lateral[0](c3) + nn.functional.interpolate(p4, size=c3.shape[-2:], mode="nearest")
            p3, p4, p5 = self.smooth[0](p3), self.smooth[1](p4), self.smooth[2](p5)
            p6 = self.p6(p5)
            p7 = self.p7(torch.relu(p6))
            levels = (p3, p4, p5, p6, p7)
            n = x.shape[0]
            cls = torch.cat([self.cls(p).permute(0, 2, 3, 1).reshape(n, -1, classes) for p in levels], 1)
            box = torch.cat([self.box(p).permute(0, 2, 3, 1).reshape(n, -1, 4) for p in levels], 1)
            return cls, box

    return RetinaNet()


def build_retinanet(path: Path) -> str:
    import torch

    torch.manual_seed(0)
    module = _retinanet_module().eval()
    params = sum(p.numel() for p in module.parameters())
    _export(module, {"images": torch.zeros(1, 3, 800, 800)}, ["cls_logits", "bbox_regression"], path,
            {"images": {0: "batch"}, "cls_logits": {0: "batch"}, "bbox_regression": {0: "batch"}})  # fmt: skip
    return (f"hand-written RetinaNet (MLPerf's: ResNeXt-50 32x4d, FPN P3-P7 256 wide, 4-conv heads, 264 classes, 9 anchors; "
            f"{params / 1e6:.1f} M parameters with BatchNorm; NMS not in the graph), seed 0, 800x800")  # fmt: skip



def _unet3d_module(filters: Sequence[int] = (32, 64, 128, 256, 320), classes: int = 3) -> Any:
    """MLPerf's 3D-UNet for KiTS19 (mlcommons/training image_segmentation/pytorch/model/unet3d.py and layers.py, the
    model MLPerf Inference's 3d-unet-kits19 benchmark exports): an input block of two 3x3x3 convolutions, four
    stride-2 downsampling blocks (32..320 wide), a stride-2 bottleneck, five upsampling blocks (a 2x2x2 stride-2
    ConvTranspose3d with bias, a concat with the skip, two convolutions) and a 1x1x1 output convolution to 3 classes;
    every convolution but the last two kinds is bias-free and followed by InstanceNorm3d(affine) and ReLU. 23 Conv,
    5 ConvTranspose, 22 InstanceNormalization, 22 Relu and 5 Concat nodes, as the published ONNX counts them."""
    import torch
    from torch import nn

    def block(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
        return nn.Sequential(nn.Conv3d(c_in, c_out, 3, stride, 1, bias=False), nn.InstanceNorm3d(c_out, affine=True), nn.ReLU())

    class Up(nn.Module):
        def __init__(self, c_in: int, c_out: int) -> None:
            super().__init__()
            self.up = nn.ConvTranspose3d(c_in, c_out, 2, 2)
            self.convs = nn.Sequential(block(2 * c_out, c_out), block(c_out, c_out))

        def forward(self, x: Any, skip: Any) -> Any:
            return self.convs(torch.cat((self.up(x), skip), dim=1))

    class UNet3D(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Sequential(block(1, filters[0]), block(filters[0], filters[0]))
            self.down = nn.ModuleList(nn.Sequential(block(i, o, 2), block(o, o)) for i, o in zip(filters[:-1], filters[1:]))
            self.bottleneck = nn.Sequential(block(filters[-1], filters[-1], 2), block(filters[-1], filters[-1]))
            ups = [(filters[-1], filters[-1])] + list(zip(reversed(filters[1:]), reversed(filters[:-1])))
            self.up = nn.ModuleList(Up(i, o) for i, o in ups)
            self.out = nn.Conv3d(filters[0], classes, 1)

        def forward(self, x: Any) -> Any:
            x = self.inp(x)
            skips = [x]
            for down in self.down:
                x = down(x)
                skips.append(x)
            x = self.bottleneck(x)
            for up, skip in zip(self.up, reversed(skips)):
                x = up(x, skip)
            return self.out(x)

    return UNet3D()


def build_unet3d(path: Path) -> str:
    """MLPerf's 3D-UNet (KiTS19), traced at 1x1x64x64x64 (at 32^3 the bottleneck is 1 voxel, which InstanceNorm refuses) with the batch and the three spatial dims dynamic (``depth``,
    ``height``, ``width``): estimate it at MLPerf's 128x128x128 sub-volume with ``{batch: 1, depth: 128, height: 128,
    width: 128}`` (tracing at 128^3 would run a ~1 TFLOP forward on the host)."""
    import torch

    torch.manual_seed(0)
    module = _unet3d_module().eval()
    params = sum(p.numel() for p in module.parameters())
    spatial = {0: "batch", 2: "depth", 3: "height", 4: "width"}
    _export(module, {"image": torch.zeros(1, 1, 64, 64, 64)}, ["logits"], path, {"image": spatial, "logits": spatial})
    return (f"hand-written 3D-UNet (MLPerf KiTS19: 32..320 wide, InstanceNorm, ConvTranspose3d upsampling, 3 classes; "
            f"{params / 1e6:.1f} M parameters), seed 0, estimated per 128x128x128 sub-volume")  # fmt: skip


#: graph name -> builder writing the ONNX file and returning how it was made
GRAPHS: dict[str, Callable[[Path], str]] = {"resnet50": build_resnet50, "bert-large": build_bert_large, "yolov8n": build_yolov8n,
                                            "retinanet": build_retinanet, "unet3d": build_unet3d,
                                            **{f"yolo11{scale}": _yolo11_builder(scale) for scale in YOLO11_SCALES}}  # fmt: skip
#: graphs that can be built at another sequence length: name -> builder(path, seq) (a row's ``sequence_length``)
SEQUENCE_GRAPHS: dict[str, Callable[[Path, int], str]] = {"bert-large": build_bert_large}
