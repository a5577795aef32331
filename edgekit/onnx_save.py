"""Saving an ONNX graph that may be past protobuf's 2 GiB limit, one way for every stage that writes one.

A protobuf message cannot reach 2 GiB, so neither ``onnx.save`` nor the checker can take such a graph whole: past
:data:`EXTERNAL_DATA_BYTES` its tensors go to ``<file>.data`` beside it (and the checker is given the file's path).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: A graph over this many bytes is saved with its tensors as external data (``<file>.data``).
EXTERNAL_DATA_BYTES = 1_800_000_000
#: Tensors under this many bytes stay inside the graph file of an external-data model (onnx.save's own default).
EXTERNAL_TENSOR_MIN_BYTES = 1024


def save_onnx(model: Any, path: Path, *, external: bool, size_threshold: int = EXTERNAL_TENSOR_MIN_BYTES) -> None:
    """Save ``model`` at ``path``; with ``external``, its tensors of ``size_threshold`` bytes or more go to
    ``<path>.data`` (an old one is removed first: onnx appends to an existing data file)."""
    import onnx

    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)
    onnx.save(model, str(path), save_as_external_data=external, all_tensors_to_one_file=True,
              location=data.name if external else None, size_threshold=size_threshold)  # fmt: skip


__all__ = ["EXTERNAL_DATA_BYTES", "EXTERNAL_TENSOR_MIN_BYTES", "save_onnx"]
