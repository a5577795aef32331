"""PP-OCR models as ``rapidocr-onnxruntime`` ships them (Paddle2ONNX, opset 11-12): the DBNet text
detector, the CTC text recognizer and the 0/180 degree direction classifier, fed rendered text.

The images are drawn with Pillow and a DejaVu font (words of letters and digits on a light, noisy
background, a quarter of the crops turned by 180 degrees), normalised as rapidocr does:
``(pixel / 255 - 0.5) / 0.5``. Shapes follow rapidocr's config: recognizer crops 3x48x320, classifier
crops 3x48x192; the detector sees 320x320 pages (rapidocr resizes to a side of 736; smaller keeps the
corpus quick on two shared cores).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgekit.corpus.base import Batch, CorpusModel, Provider, extract_member, find_wheel, upgrade_opset, with_reference_labels

PACKAGE = "rapidocr-onnxruntime"
MODELS = {
    "ppocr-det": "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
    "ppocr-rec": "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
    "ppocr-cls": "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
}
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def _font(size: int):  # type: ignore[no-untyped-def]
    from PIL import ImageFont

    for name in ("DejaVuSans.ttf", "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"):
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    return ImageFont.load_default(size)


def _word(rng: np.random.Generator, low: int, high: int) -> str:
    return "".join(rng.choice(list(_ALPHABET), size=int(rng.integers(low, high))))


def _normalise(image: np.ndarray) -> np.ndarray:
    return ((image.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)


def text_crop(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """One line of text filling a height x width crop (HWC uint8), like a detector's box."""
    from PIL import Image, ImageDraw

    background = tuple(int(v) for v in rng.integers(190, 256, size=3))
    image = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(image)
    ink = tuple(int(v) for v in rng.integers(0, 80, size=3))
    draw.text((int(rng.integers(2, 12)), int(rng.integers(4, 10))), _word(rng, 4, 14), fill=ink, font=_font(int(rng.integers(26, 34))))
    pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, 6, size=(height, width, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def text_page(rng: np.random.Generator, size: int) -> np.ndarray:
    """A size x size page with a few lines of words at random places and sizes (HWC uint8)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), tuple(int(v) for v in rng.integers(200, 256, size=3)))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 7))):
        ink = tuple(int(v) for v in rng.integers(0, 90, size=3))
        x, y = int(rng.integers(0, size // 2)), int(rng.integers(0, size - 30))
        draw.text((x, y), " ".join(_word(rng, 3, 9) for _ in range(int(rng.integers(1, 3)))), fill=ink, font=_font(int(rng.integers(14, 30))))
    pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, 5, size=(size, size, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def crop_batches(seed: int, count: int, batch: int, height: int, width: int, flip_fraction: float = 0.0) -> list[Batch]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        crops = []
        for _ in range(batch):
            crop = text_crop(rng, height, width)
            if rng.random() < flip_fraction:
                crop = crop[::-1, ::-1]
            crops.append(_normalise(crop))
        out.append({"x": np.ascontiguousarray(np.stack(crops))})
    return out


def page_batches(seed: int, count: int, size: int) -> list[Batch]:
    rng = np.random.default_rng(seed)
    return [{"x": np.ascontiguousarray(_normalise(text_page(rng, size))[None])} for _ in range(count)]


#: each model's task metric (a recipe's evaluation section without budget) and the budget a plan must meet
METRICS: dict[str, tuple[dict[str, object], float]] = {
    # DBNet's probability map binarised at 0.3 (rapidocr's det thresh): IoU of the text pixels with FP32's
    "ppocr-det": ({"metric": "segmentation", "segmentation": {"threshold": 0.3, "ignore_classes": [0]}}, 0.9),
    # greedy CTC over [batch, time, classes] softmax (blank 0): 9 lines in 10 read exactly as FP32 reads them
    "ppocr-rec": ({"metric": "ctc_text", "ctc_text": {"blank": 0, "time_axis": 1, "class_axis": -1, "report": "line_agreement"}}, 0.9),
    # 0/180 degree softmax: the direction FP32 picks (labels: FP32's arg-max), 98 %
    "ppocr-cls": ({"metric": "top1"}, 0.98),
}


def _model(name: str, task: str, work: Path, wheel_dir: Path | None, calibration: list[Batch], evaluation: list[Batch]) -> CorpusModel:
    import onnx

    wheel = find_wheel(wheel_dir, PACKAGE)
    original = extract_member(wheel, MODELS[name], work / name)
    path, opset = upgrade_opset(original)
    output = onnx.load(str(path), load_external_data=False).graph.output[0].name
    notes = (f"opset {opset} converted to 13 with onnx.version_converter",) if path != original else ()
    metric, min_value = METRICS[name]
    bench = evaluation[0]
    if metric["metric"] == "top1":
        evaluation = with_reference_labels(path, output, evaluation)
    return CorpusModel(name, task, path, calibration, evaluation, bench, output,
                       f"{wheel.name}: {MODELS[name].split('/')[-1]}", notes, {"original_opset": opset}, metric=dict(metric), min_value=min_value)


def make_det(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    return _model("ppocr-det", "text_map", work, wheel_dir, page_batches(1, max(2, int(16 * scale)), 320),
                  page_batches(2, max(2, int(12 * scale)), 320))


def make_rec(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    return _model("ppocr-rec", "ctc_text", work, wheel_dir, crop_batches(3, max(2, int(16 * scale)), 8, 48, 320),
                  crop_batches(4, max(2, int(12 * scale)), 8, 48, 320))


def make_cls(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    return _model("ppocr-cls", "binary_decision", work, wheel_dir, crop_batches(5, max(2, int(16 * scale)), 8, 48, 192, 0.25),
                  crop_batches(6, max(2, int(12 * scale)), 8, 48, 192, 0.5))


PROVIDERS = (
    Provider("ppocr-det", "text_map", PACKAGE, make_det, "PP-OCRv4 DBNet text detector (probability map), 1x3x320x320"),
    Provider("ppocr-rec", "ctc_text", PACKAGE, make_rec, "PP-OCRv4 CTC text recognizer, 8x3x48x320"),
    Provider("ppocr-cls", "binary_decision", PACKAGE, make_cls, "PP-OCR mobile v2 direction classifier (0/180), 8x3x48x192"),
)
