"""Well-known architectures from ``transformers`` (4.57), built from small configs with seeded weights
(nothing is downloaded) and exported to ONNX with PyTorch's TorchScript exporter at opset 17.

Weights are random (``torch.manual_seed(0)``), so the task metric is agreement with the FP32 model's own
decisions, not accuracy on a data set; inputs are seeded smooth images (low-frequency noise, like
natural images, rather than white noise) or token ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgekit.corpus.base import Batch, CorpusModel, Provider, with_reference_labels

#: seeded classifiers: top-1 agreement with FP32's arg-max (the evaluation batches' labels), 95 %
CLASSIFIER_METRIC: dict[str, Any] = {"metric": "top1"}
CLASSIFIER_MIN_TOP1 = 0.95


def smooth_images(seed: int, count: int, batch: int, size: int) -> list[Batch]:
    """Images of upsampled 8x8 noise, normalised like ImageNet inputs."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        coarse = rng.normal(0, 1, size=(batch, 3, 8, 8)).astype(np.float32)
        image = np.repeat(np.repeat(coarse, size // 8, axis=2), size // 8, axis=3)
        image += rng.normal(0, 0.2, size=image.shape).astype(np.float32)
        out.append({"pixel_values": np.ascontiguousarray(image, dtype=np.float32)})
    return out


def _export(module: Any, example: Batch, output_names: list[str], path: Path) -> Path:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(example)
    tensors = tuple(torch.from_numpy(example[n]) for n in names)
    axes = {n: {0: "batch"} for n in [*names, *output_names]}
    with torch.inference_mode():
        torch.onnx.export(module, tensors, str(path), input_names=names, output_names=output_names, dynamic_axes=axes,
                          opset_version=17, dynamo=False)
    return path


class _Logits:  # a module wrapper returning one tensor (transformers models return ModelOutput)
    def __new__(cls, model: Any, field: str = "logits") -> Any:
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, *args: Any) -> Any:
                return getattr(self.model(*args), field)

        return Wrapped().eval()


def _image_model(name: str, make_model: Callable[[], Any], work: Path, size: int, batch: int, scale: float, description: str) -> CorpusModel:
    import torch
    import transformers

    torch.manual_seed(0)
    model = _Logits(make_model().eval())
    calibration = smooth_images(10, max(2, int(16 * scale)), batch, size)
    evaluation = smooth_images(11, max(2, int(12 * scale)), batch, size)
    path = _export(model, evaluation[0], ["logits"], work / name / f"{name}.onnx")
    bench = evaluation[0]
    evaluation = with_reference_labels(path, "logits", evaluation)
    return CorpusModel(name, "classification", path, calibration, evaluation, bench, "logits",
                       f"transformers {transformers.__version__} {description}, seed 0",
                       metric=dict(CLASSIFIER_METRIC), min_value=CLASSIFIER_MIN_TOP1)


def make_resnet(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1], layer_type="basic", num_labels=100)
    return _image_model("resnet", lambda: ResNetForImageClassification(config), work, 128, 4, scale, "ResNet (basic blocks 1-1-2-1, 32..256 wide)")


def make_mobilenet_v2(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    # initializer_range 0.3: at transformers' default 0.02 the activations vanish through the ReLU6 blocks
    # (logits about 1e-24, so every variant's cosine read 0); at 0.3 logits reach about 100.
    config = MobileNetV2Config(depth_multiplier=0.5, image_size=128, num_labels=100, initializer_range=0.3)
    return _image_model("mobilenet-v2", lambda: MobileNetV2ForImageClassification(config), work, 128, 4, scale, "MobileNetV2 0.5x")


def make_convnext(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1], num_labels=100)
    return _image_model("convnext", lambda: ConvNextForImageClassification(config), work, 128, 4, scale, "ConvNeXt (1-1-2-1, 32..256 wide)")


#: class probability a YOLOS detection needs (of 11 softmax classes)
YOLOS_SCORE_THRESHOLD = 0.15


def make_yolos(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    """YOLOS (a ViT detector) with its two heads in one output, as YOLO-style exports write them:
    ``[N, queries, 4 box coordinates (cx, cy, w, h in 0..1) + class probabilities (softmax, the last
    class "no object")]``, ranges that one 8-bit scale cannot serve. Its metric is mAP@0.5 of the
    detections (object classes only) against FP32's."""
    import torch
    import transformers
    from transformers import YolosConfig, YolosForObjectDetection

    config = YolosConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, image_size=[128, 128],
                         patch_size=16, num_detection_tokens=10, num_labels=10)
    torch.manual_seed(0)
    detector = YolosForObjectDetection(config).eval()

    class Detections(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.detector = detector

        def forward(self, pixel_values: Any) -> Any:
            out = self.detector(pixel_values)
            return torch.cat([out.pred_boxes, out.logits.softmax(-1)], dim=-1)

    calibration = smooth_images(12, max(2, int(16 * scale)), 4, 128)
    evaluation = smooth_images(13, max(2, int(12 * scale)), 4, 128)
    path = _export(Detections().eval(), evaluation[0], ["detections"], work / "yolos" / "yolos.onnx")
    classes = config.num_labels
    metric = {"metric": "detection", "detection": {
        "boxes": {"output": "detections", "channels": [0, 4]}, "scores": {"output": "detections", "channels": [4, 4 + classes]},
        "format": "cxcywh", "score_threshold": YOLOS_SCORE_THRESHOLD, "nms_iou": 0.5, "match_iou": 0.5}}
    return CorpusModel("yolos", "detection", path, calibration, evaluation, evaluation[0], "detections",
                       f"transformers {transformers.__version__} YOLOS (2 layers, 64 wide, 10 detection tokens), seed 0",
                       metric=metric, min_value=0.9)


PROVIDERS = (
    Provider("resnet", "classification", None, make_resnet, "ResNet classifier (seeded), 4x3x128x128"),
    Provider("mobilenet-v2", "classification", None, make_mobilenet_v2, "MobileNetV2 0.5x classifier (seeded), 4x3x128x128"),
    Provider("convnext", "classification", None, make_convnext, "ConvNeXt classifier (seeded), 4x3x128x128"),
    Provider("yolos", "detection", None, make_yolos, "YOLOS detector (seeded), boxes and class logits in one output, 4x3x128x128"),
)
