"""The rank-to-judge contract: what rank tasks are given, and the typed values they return.

Both sides import it and neither imports the other: ``cases`` (rank side)
builds from it, ``judge`` (verdict side) reads it.  It holds the jobs
(:mod:`~conformance.contract.jobs`), the seeded problems
(:mod:`~conformance.contract.problems`), how each tensor is split over the TP
ranks (:mod:`~conformance.contract.layouts`), bitwise comparison of values
(:mod:`~conformance.contract.equality`), the perf items' names
(:mod:`~conformance.contract.perf_items`) and the results
(:mod:`~conformance.contract.results`).
"""
