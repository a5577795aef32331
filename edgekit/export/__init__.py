"""ONNX export of PyTorch models, and the parity check of the exported graph against PyTorch."""

from edgekit.export.onnx_export import ExportResult, check_and_infer, export_onnx
from edgekit.export.parity import ParityReport, check_parity

__all__ = ["ExportResult", "ParityReport", "check_and_infer", "check_parity", "export_onnx"]
