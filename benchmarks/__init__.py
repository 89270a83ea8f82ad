"""Benchmarks of the generated ops: `python -m benchmarks.run` (see docs/benchmarks.md)."""
