"""Benchmarks of django-dynlock (run from the repository root: ``python -m bench``; see bench/README.md)."""
