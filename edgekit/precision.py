"""The names of numeric precisions and backends, shared by recipes, targets and the pipeline."""

from __future__ import annotations

from enum import Enum


class Precision(str, Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"
    INT8_DYNAMIC = "int8-dynamic"
    FP8 = "fp8"
    INT4 = "int4"
    MXFP8 = "mxfp8"
    MXFP4 = "mxfp4"
    NVFP4 = "nvfp4"

    def __str__(self) -> str:
        return self.value

    @property
    def needs_calibration(self) -> bool:
        """Static int8 and fp8 scale activations by calibrated ranges; nvfp4 its activations' FP32 tensor scales."""
        return self in (Precision.INT8, Precision.FP8, Precision.NVFP4)


class Backend(str, Enum):
    ONNXRUNTIME = "onnxruntime"
    TENSORRT = "tensorrt"
    OPENVINO = "openvino"

    def __str__(self) -> str:
        return self.value
