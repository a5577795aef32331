"""Tests of the device runtime (edgekit_runtime)."""
