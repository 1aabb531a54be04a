"""Judging: error bounds, layouts, bitwise and error checks, requirement levels, perf figures and gates."""
