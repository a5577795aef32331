"""The bundle's human-readable build report (``report.html``) and the model statistics behind it.

Importing this package is cheap: matplotlib, Jinja2 and onnx load only when a report is rendered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgekit.report.html import render_report, write_report
    from edgekit.report.model_stats import model_size_by_op_type, op_type_counts

__all__ = ["model_size_by_op_type", "op_type_counts", "render_report", "write_report"]

_HOMES = {
    "render_report": "edgekit.report.html",
    "write_report": "edgekit.report.html",
    "model_size_by_op_type": "edgekit.report.model_stats",
    "op_type_counts": "edgekit.report.model_stats",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'edgekit.report' has no attribute '{name}'")
