"""Benchmarks that print figures (``python -m conformance.bench {overhead,coc,bounds,hangs,device,schedule}``).

Speed targets live here, not in timed unit tests: each benchmark prints a
human-readable table and, as its last line, one JSON object with every figure.
"""
