"""Benchmarks of the scheduling core: `python -m scheduling.bench {packing,replay,tick} …`."""
