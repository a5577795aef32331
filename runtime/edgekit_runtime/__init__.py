"""edgekit-runtime: what ships to an edge device. Reads and verifies bundles, runs them, times them.

Never imports torch, ONNX export tooling or optimum.
"""

__version__ = "0.1.0"
