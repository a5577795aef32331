"""The interface every model source implements, and what loading one produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:  # torch is imported lazily by the loaders that need it
    import torch

    from edgekit.recipe import Recipe


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for export and parity checking.

    ``module`` is the PyTorch reference (None for an ONNX-file source, which has no PyTorch twin).
    ``onnx_path`` is set when the source already produced an ONNX graph (ONNX file, Optimum export):
    the export stage is then skipped and ``exporter`` says who made the graph.
    """

    kind: str
    description: str
    module: "torch.nn.Module | None" = None
    onnx_path: Path | None = None
    exporter: str | None = None
    file_sha256: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


class SourceLoader(Protocol):
    def __call__(self, spec: Any, recipe: "Recipe", workdir: Path) -> LoadedModel: ...


LoaderFn = Callable[[Any, "Recipe", Path], LoadedModel]
