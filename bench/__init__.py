"""Benchmarks of django-dynlock (run from the repository root: ``python -m bench.engine``)."""
