"""Benchmarks: side-by-side comparisons reported as ratios (``python -m benchmarks.<name>``)."""
