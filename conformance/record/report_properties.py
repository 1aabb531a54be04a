"""The names under which a case's report carries the suite's data (``user_properties``), and how to read one.

Plugins write them on the worker; the JSON summary, the level tally, the
time breakdown and the Allure hooks read them on the controller (xdist moves
``user_properties`` with the report).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the report builder reads these names where pytest is not installed
    import pytest

#: Every named check of the case, each ``{name, level, passed, message, category}``.
CHECKS = "coc_checks"
#: Where the case's time went (:class:`~conformance.harness.runner.CaseTimings` as a dict).
TIMINGS = "coc_timings"
#: Which of torch_npu's fused kernels (MC²) the implementation's calls reached: calls by kernel, the most any rank
#: made, summed over the case's runs (absent: none).
FUSED_KERNELS = "coc_fused_kernels"
#: The op or layer kind a case on ranks exercises (``op:matmul_all_reduce``, ``layer:column`` ...): what its fused
#: kernel calls are counted under per fused op.
CAPABILITY = "coc_capability"
#: When and where every case ran: its worker, when that worker's process and the case began, the worker's CPU time
#: for it (the schedule simulation's input, ``conformance.bench.schedule``).
CLOCK = "coc_clock"
#: What failed, as data: category, exception type, message.
FAILURE = "coc_failure"
#: The levels of the failed checks that did not gate (the case then reports as an expected failure).
NOT_GATED = "coc_not_gated"
#: A bug of the suite itself (its message): the case is reported as an error, not as a failed check.
SUITE_ERROR = "coc_suite_error"
#: A bug of the suite that stopped a case after a check of a gating level failed (its message): the case is that
#: failure (the worse verdict), the suite's error recorded beside it.
SUITE_ERROR_BESIDE = "coc_suite_error_beside"
#: Each deterministic result's digest and what it depends on of the case (``judge/determinism.digests``).
DIGESTS = "coc_digests"
#: The expectations entry the case matched.
EXPECTATION = "coc_expectation"
#: A perf case's measured figures (JSON) and whether its gate was enforced here.
PERF_FIGURES = "perf_figures"
PERF_GATE = "perf_gate"
#: The values of :data:`PERF_GATE`: judged, measured for its figures only, or not run at all (not enforced here).
GATE_ENFORCED, GATE_REPORTED, GATE_NOT_RUN = "enforced", "reported, not gated", "not run, not gated"
#: What an exploration did: cases per dimension, cases per second, where the time went, minimal failing cases.
EXPLORE = "coc_explore"
#: Allure labels every result carries for the report build (hidden in the report): the session's run id, which
#: the JSON summary carries too, and the case id, the summary's key of the case.
RUN_LABEL, CASE_LABEL = "coc_run", "coc_case"


def property_of(report: pytest.TestReport, name: str) -> Any:
    """The value the report carries under ``name`` (None when it carries none)."""
    for key, value in report.user_properties:
        if key == name:
            return value
    return None
