"""Judging rank results: error bounds, assembly, checks, overlap structure, determinism, perf figures and gates."""
