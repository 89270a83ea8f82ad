"""Benchmarks of the generated ops: `python -m benchmarks.run` (see the README's "Benchmarks")."""
