"""edgekit: take a trained PyTorch model to a fleet of edge devices.

The host pipeline: recipe + target profile -> exported, checked, benchmarked bundle.
"""

__version__ = "0.1.0"
