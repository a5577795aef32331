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


def _torch_batches(batches: list[Batch]) -> list[dict[str, Any]]:
    import torch

    return [{k: torch.from_numpy(v) for k, v in b.items()} for b in batches]


def seeded_weights(model: Any, batches: list[Batch], head: Any, call: Callable[[Any, dict[str, Any]], Any] | None = None) -> Any:
    """Make seeded weights behave like trained ones in the ways a task metric sees (call under a seed):

    - convolutions He-initialised (fan-out, as torchvision does), so activations neither vanish nor
      explode through deep ReLU stacks (transformers' N(0, 0.02) gave MobileNetV2 logits of 1e-24);
    - batch-norm statistics measured on ``batches`` (a cumulative average in train mode), as training
      leaves them: every normalised activation has zero mean and unit variance on the data;
    - the ``head`` (the last Linear or 1x1 Conv) centred: its bias cancels the mean of its input over
      ``batches``, so the classes compete on what differs between inputs instead of one class winning
      every input on a shared offset (the seeded MobileNetV2 predicted 3 classes for 24 images).
    """
    import torch

    call = call or (lambda m, b: m(**b))
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d)) and module is not head:
            torch.nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None  # cumulative average over the batches
        model.train()
        with torch.no_grad():
            for batch in _torch_batches(batches):
                call(model, batch)
    model.eval()
    return centre_head(model, head, batches, call)


def centre_head(model: Any, head: Any, batches: list[Batch], call: Callable[[Any, dict[str, Any]], Any], std: float | None = None) -> Any:
    """Set ``head``'s bias (a Linear or 1x1 Conv) to cancel the mean of its input over ``batches``, and with
    ``std`` scale its weight so that its outputs have that standard deviation there."""
    import torch

    inputs: list[Any] = []
    hook = head.register_forward_hook(lambda module, args, out: inputs.append(args[0].detach()))
    with torch.no_grad():
        for batch in _torch_batches(batches):
            call(model.eval(), batch)
    hook.remove()
    channel_axis = -1 if isinstance(head, torch.nn.Linear) else 1
    features = torch.cat([torch.movedim(x, channel_axis, -1).reshape(-1, x.shape[channel_axis]) for x in inputs])
    weight = head.weight.detach().reshape(head.weight.shape[0], -1)
    with torch.no_grad():
        if std is not None:
            spread = float((features @ weight.T).std())
            head.weight *= std / max(spread, 1e-12)
            weight = head.weight.detach().reshape(head.weight.shape[0], -1)
        if head.bias is None:
            head.bias = torch.nn.Parameter(torch.zeros(weight.shape[0]))
        head.bias.copy_(-(weight @ features.mean(0)))
    return model


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


def _image_model(name: str, make_model: Callable[[], Any], head: Callable[[Any], Any], work: Path, size: int, batch: int, scale: float,
                 description: str) -> CorpusModel:
    import torch
    import transformers

    torch.manual_seed(0)
    classifier = make_model()
    seeded_weights(classifier, smooth_images(9, 4, batch, size), head(classifier), lambda m, b: m(**b))
    model = _Logits(classifier)
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

    config = ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1], layer_type="basic", num_labels=10)
    return _image_model("resnet", lambda: ResNetForImageClassification(config), lambda m: m.classifier[-1], work, 128, 4, scale, "ResNet (basic blocks 1-1-2-1, 32..256 wide)")


def make_mobilenet_v2(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    # transformers' N(0, 0.02) init makes the activations vanish through the ReLU6 blocks (logits about
    # 1e-24): seeded_weights gives He init, measured batch-norm statistics and a centred classifier
    config = MobileNetV2Config(depth_multiplier=0.5, image_size=128, num_labels=10)
    return _image_model("mobilenet-v2", lambda: MobileNetV2ForImageClassification(config), lambda m: m.classifier, work, 128, 4, scale, "MobileNetV2 0.5x")


def make_convnext(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1], num_labels=10)
    return _image_model("convnext", lambda: ConvNextForImageClassification(config), lambda m: m.classifier, work, 128, 4, scale, "ConvNeXt (1-1-2-1, 32..256 wide)")


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
    # transformers' N(0, 0.02) heads give every query the same box (0.5, 0.5, 0.5, 0.5) and flat class
    # scores: PyTorch's default Linear init in the heads, outputs centred and spread (box centres and sizes
    # across the image, class logits with a standard deviation of 2)
    for mlp in (detector.class_labels_classifier, detector.bbox_predictor):
        for layer in mlp.modules():
            if isinstance(layer, torch.nn.Linear):
                layer.reset_parameters()
    warmup = smooth_images(14, 4, 4, 128)
    centre_head(detector, detector.class_labels_classifier.layers[-1], warmup, lambda m, b: m(**b), std=2.0)
    centre_head(detector, detector.bbox_predictor.layers[-1], warmup, lambda m, b: m(**b), std=2.0)

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




# ---------------------------------------------------------------- segmentation and audio CTC


def make_segformer(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    """SegFormer (a hierarchical transformer encoder with efficient attention and an all-MLP decoder),
    logits [N, 8 classes, H/4, W/4]; the metric is the mean IoU of the arg-max class masks with FP32's."""
    import torch
    import transformers
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    config = SegformerConfig(num_channels=3, num_encoder_blocks=4, depths=[1, 1, 1, 1], sr_ratios=[8, 4, 2, 1], hidden_sizes=[16, 32, 64, 128],
                             num_attention_heads=[1, 1, 2, 4], decoder_hidden_size=64, num_labels=8)
    torch.manual_seed(0)
    segmenter = SegformerForSemanticSegmentation(config)
    # decoder batch norm measured on images, classifier centred: the classes split each image into regions
    # instead of one class covering every pixel
    seeded_weights(segmenter, smooth_images(15, 4, 4, 128), segmenter.decode_head.classifier)
    calibration = smooth_images(16, max(2, int(16 * scale)), 4, 128)
    evaluation = smooth_images(17, max(2, int(12 * scale)), 4, 128)
    path = _export(_Logits(segmenter), evaluation[0], ["logits"], work / "segformer" / "segformer.onnx")
    metric = {"metric": "segmentation", "segmentation": {"class_axis": 1}}
    return CorpusModel("segformer", "segmentation", path, calibration, evaluation, evaluation[0], "logits",
                       f"transformers {transformers.__version__} SegFormer (4 stages 16..128 wide, 8 classes), seed 0",
                       metric=metric, min_value=0.9)


#: raw 16 kHz audio per example: one second
WAV2VEC2_SAMPLES = 16000
#: CTC frames the seeded head leaves blank (a trained CTC model emits blanks between sparse characters;
#: 0.8 of 49 frames a second leaves about 10 characters a second, a speaking rate)
WAV2VEC2_BLANK_FRACTION = 0.8
#: transcripts exactly as FP32's: 4 in 5. A seeded head's frame decisions are closer than a trained one's
#: (logits with 1 % noise already change 1 line in 3 at 0.6 blank), so the budget is looser than ppocr-rec's
WAV2VEC2_MIN_LINES = 0.8


def speech_batches(seed: int, count: int, batch: int) -> list[Batch]:
    from edgekit.corpus.audio import speech_like

    rng = np.random.default_rng(seed)
    return [{"input_values": np.stack([speech_like(rng, WAV2VEC2_SAMPLES) for _ in range(batch)])} for _ in range(count)]


def make_wav2vec2(work: Path, wheel_dir: Path | None, scale: float = 1.0) -> CorpusModel:
    """wav2vec 2.0 with a CTC head: a convolutional feature encoder over raw audio (stride 320: 49 frames
    a second), a transformer with a convolutional position embedding, 32 CTC classes (blank 0). The
    metric is exact agreement of the greedy CTC transcripts with FP32's."""
    import torch
    import transformers
    from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

    config = Wav2Vec2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                            conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, pad_token_id=0,
                            feat_extract_norm="group", do_stable_layer_norm=False, apply_spec_augment=False)
    torch.manual_seed(0)
    recogniser = Wav2Vec2ForCTC(config).eval()
    warmup = speech_batches(30, 2, 4)
    seeded_weights(recogniser, warmup, recogniser.lm_head)
    centre_head(recogniser, recogniser.lm_head, warmup, lambda m, b: m(**b), std=3.0)
    _blank_bias(recogniser, warmup)
    calibration = speech_batches(31, max(2, int(16 * scale)), 4)
    evaluation = speech_batches(32, max(2, int(12 * scale)), 4)
    path = _export(_Logits(recogniser), evaluation[0], ["logits"], work / "wav2vec2-ctc" / "wav2vec2-ctc.onnx")
    metric = {"metric": "ctc_text", "ctc_text": {"blank": 0, "time_axis": 1, "class_axis": -1, "report": "line_agreement"}}
    return CorpusModel("wav2vec2-ctc", "ctc_text", path, calibration, evaluation, evaluation[0], "logits",
                       f"transformers {transformers.__version__} Wav2Vec2ForCTC (7 conv layers 32 wide, 2 layers 64 wide, 32 classes), seed 0",
                       ("TorchScript exporter, opset 17 (torch.export is not needed): the weight-normed positional convolution "
                        "is constant-folded into one Conv weight, the feature encoder's GroupNorm exports as InstanceNormalization",),
                       metric=metric, min_value=WAV2VEC2_MIN_LINES)


def _blank_bias(model: Any, batches: list[Batch]) -> None:
    """Raise the blank logit until it wins about :data:`WAV2VEC2_BLANK_FRACTION` of the frames."""
    import torch

    with torch.no_grad():
        logits = torch.cat([model(**b).logits.reshape(-1, model.config.vocab_size) for b in _torch_batches(batches)])
        others = logits[:, 1:].max(1).values - logits[:, 0]
        model.lm_head.bias[0] += float(torch.quantile(others, WAV2VEC2_BLANK_FRACTION))


PROVIDERS = (
    Provider("resnet", "classification", None, make_resnet, "ResNet classifier (seeded), 4x3x128x128"),
    Provider("mobilenet-v2", "classification", None, make_mobilenet_v2, "MobileNetV2 0.5x classifier (seeded), 4x3x128x128"),
    Provider("convnext", "classification", None, make_convnext, "ConvNeXt classifier (seeded), 4x3x128x128"),
    Provider("yolos", "detection", None, make_yolos, "YOLOS detector (seeded), boxes and class logits in one output, 4x3x128x128"),
    Provider("segformer", "segmentation", None, make_segformer, "SegFormer semantic segmentation (seeded), 4x3x128x128"),
    Provider("wav2vec2-ctc", "ctc_text", None, make_wav2vec2, "wav2vec 2.0 CTC speech recogniser (seeded), 4x16000 samples"),
)
