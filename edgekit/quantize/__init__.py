"""Quantization and pruning per target profile."""
