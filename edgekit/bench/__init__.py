"""Host-side benchmarking of bundles, optionally side by side with PyTorch eager on the same inputs."""

from edgekit.bench.compare import BenchReport, bench_bundle, parse_dims

__all__ = ["BenchReport", "bench_bundle", "parse_dims"]
