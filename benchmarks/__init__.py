"""Benchmarks; run them from the repository root (see ``docs/performance.rst``)."""
