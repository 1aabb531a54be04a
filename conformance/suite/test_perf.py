"""Perf gates (``docs/DESIGN.md#perf-gates``): CoC against serial, per hardware profile.

One test per profile case: serial and every gated variant timed side by side
by the :mod:`conformance.judge.perf` protocol on an exclusive lease of the node,
judged on the median paired gain (each serial / CoC pair ran back to back).
A gate is *enforced* only when the ranks' hardware (device kind, device
name, backend, TP), as the ranks report it, matches the case's profile and
the profile enforces.  A profile with ``enforce: false`` (the shipped CPU one,
the figures-only one) is not run at all by default: its case is skipped as not
judged, holding no devices (an exclusive lease stops every other case), unless
``--coc-perf-figures`` asks for its figures.  A case measured but not enforced
(figures asked for, or ranks that saw other hardware than the node showed)
reports its figures, its check is recorded as *not judged* (never as passed),
and it says so: the result carries the user property ``perf_gate`` and the
Allure parameter ``gate`` (:data:`~conformance.judge.report_properties.GATE_ENFORCED`,
``GATE_REPORTED``, or ``GATE_NOT_RUN`` for a skipped one) and prints one
``PERF`` line with the reason.
An enforced miss is measured once more and judged again on the rounds of
both measurements pooled (a shared machine may have been busy during one
short measurement; a real regression still misses with twice the rounds); it
then fails as :class:`~conformance.errors.PerfRegression` with both tables.

A profile's cases run only on a node its identity matches (device kind,
device name, backend, TP: ``docs/DESIGN.md#profiles-by-identity``); elsewhere
they are skipped naming the profile and what did not match, never measured
(an NPU profile's shapes take hours on a CPU) nor gated.  A node that no
profile names runs the figures-only ``unprofiled`` profile instead, which
reports its gains and gates nothing.  Under the threaded launcher
(synchronous collectives, nothing overlaps) the cases are skipped with that
reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from coc_shared import chunk_efficiency
from conformance import options
from conformance.cases.perf_cases import pipeline_perf_case
from conformance.contract import perf_items
from conformance.harness.launchers.devices import detect_device_kind, node_identity
from conformance.judge import hardware, perf, perf_samples
from conformance.record import report_properties
from conformance.record.evidence import CaseEvidence
from conformance.record.failures import PerfRegression
from conformance.record.verdicts import NotJudged

pytestmark = pytest.mark.coc_kind("perf")

#: This node as a profile sees it, with the backend its device kind defaults to (``--coc-backend`` is
#: checked again when a case runs).
NODE = node_identity(detect_device_kind())


def _params() -> list[Any]:
    """Every profile's cases; those of a profile that is not this node's skip, naming the profile and what
    did not match, and the figures-only profile's are collected only on a node that no profile names."""
    params = []
    for profile in hardware.shipped():
        marks: list[Any] = [pytest.mark.perf]
        if profile.large:
            marks.append(pytest.mark.large)
        for case in profile.cases:
            why_not = hardware.why_not_here(profile, NODE, case.tp)
            if why_not and profile.match.anywhere:
                continue
            skip = [pytest.mark.skip(reason=why_not)] if why_not else []
            params.append(pytest.param(case, id=case.name, marks=marks + skip))
    return params


def _measure(coc_ranks: Any, case: hardware.PerfCase, profile: hardware.Profile) -> dict[str, Any]:
    return coc_ranks.run(
        pipeline_perf_case, case.tp,  # exclusive: a perf case holds the whole node (caseids.needs)
        op=case.op, m=case.m, k=case.k, n=case.n, dtype=case.dtype, variants=list(case.gates),
        warmup=profile.warmup, repeats=profile.repeats,
    )[0]


def _verdicts(result: Mapping[str, Any], case: hardware.PerfCase, profile: hardware.Profile
              ) -> tuple[perf.Measurement, dict[str, perf.Verdict]]:
    measurement = perf.summarize(result["samples"], result["blocks"], rows=case.m, order=case.order,
                                 cpu=perf.cpu_demand(result))
    identity = result["identity"]
    matched = hardware.matching_profile(**identity)
    matches = matched is not None and matched.name == profile.name and profile.enforce
    why_not = profile.match.mismatch(**identity) or (
        f"this machine matches profile {matched.name}" if matched is not None and matched.name != profile.name
        else f"profile {profile.name} only reports (enforce: false)")
    verdicts = {
        variant: perf.judge(figures.paired_gains.median, case.gates[variant], profile_matches=matches,
                            why_not=why_not)
        for variant, figures in measurement.variants.items()
    }
    return measurement, verdicts


def _report(case: hardware.PerfCase, result: Mapping[str, Any], measurement: perf.Measurement,
            verdicts: Mapping[str, perf.Verdict], record_property: Any, case_evidence: CaseEvidence, title: str
            ) -> str:
    enforced = any(v.enforced for v in verdicts.values())
    label = report_properties.GATE_ENFORCED if enforced else report_properties.GATE_REPORTED
    identity = result["identity"]
    text = (f"{case.name}: {case.op} m={case.m} k={case.k} n={case.n} {case.dtype}, TP {case.tp} on "
            f"{identity['device']} {identity['name']!r} ({identity['backend']})\n"
            + perf.table(measurement, verdicts))
    for variant, reason in result["skipped"].items():
        text += f"\n{variant}: not measured: {reason}"
    record_property(report_properties.PERF_GATE, label)
    record_property(report_properties.PERF_FIGURES, json.dumps(measurement.as_dict()))
    case_evidence.describe(feature="perf", story=case.op, title=f"Perf gate [{case.name}]",
                            gate=label, profile=case.profile, tp=case.tp,
                            shape=(case.m, case.k, case.n), dtype=case.dtype, device=identity["name"])
    case_evidence.text(text, title)
    efficiency = chunk_efficiency.configured()  # the device check's table (COC_CHUNK_EFFICIENCY), if given
    if efficiency is not None:
        case_evidence.text(efficiency.text(), "chunked-GEMM efficiency (device check)")
    for variant, figures in measurement.variants.items():
        if figures.predicted is not None:  # the model's costs are measured in ms; beside it, the calls measured
            calls = {"call": [figures.time.median], "serial call": [measurement.serial.median]}
            case_evidence.timeline(figures.predicted, calls, f"{variant}: pipeline model", unit="ms")
    print(f"PERF {case.name}: {label}")
    print(text)
    return text


@pytest.mark.coc_capability("perf")
@pytest.mark.parametrize("case", _params())
def test_coc_gain_meets_profile(coc_ranks: Any, case: hardware.PerfCase, record_property: Any,
                                case_evidence: CaseEvidence, pytestconfig: pytest.Config) -> None:
    """CoC against serial, timed side by side; judged only on hardware matching the case's profile, else
    reported and not judged."""
    if pytestconfig.getoption(options.LAUNCHER) == "threaded":
        pytest.skip("the threaded launcher's collectives are synchronous: there is no overlap to measure")
    profile = hardware.by_name(case.profile)
    here = node_identity(detect_device_kind(backend=pytestconfig.getoption(options.BACKEND)))
    why_not = hardware.why_not_here(profile, here, case.tp)
    if why_not:  # the backend chosen for this run is not the profile's: never measured against it
        pytest.skip(why_not)
    if not profile.enforce and not pytestconfig.getoption(options.PERF_FIGURES):
        record_property(report_properties.PERF_GATE, report_properties.GATE_NOT_RUN)
        pytest.skip(f"not judged: profile {profile.name} only reports (enforce: false), so its case holds no "
                    f"devices here; {options.PERF_FIGURES} measures it for its figures")
    result = _measure(coc_ranks, case, profile)
    if not result["samples"].keys() - {perf_items.SERIAL, perf_items.MM, perf_items.COMM}:
        pytest.skip(f"no variant of {sorted(case.gates)} can run: {result['skipped']}")
    measurement, verdicts = _verdicts(result, case, profile)
    text = _report(case, result, measurement, verdicts, record_property, case_evidence, "perf figures")
    if not any(v.enforced for v in verdicts.values()):
        reasons = sorted({v.reason.rpartition("; ")[2] for v in verdicts.values()})
        raise NotJudged(f"{case.name}: gate not enforced on this machine ({'; '.join(reasons)}): figures reported")
    if not any(v.failed for v in verdicts.values()):
        return
    retry = _measure(coc_ranks, case, profile)
    both = {**retry, "samples": perf_samples.pooled(result["samples"], retry["samples"]), "blocks": result["blocks"]}
    measurement, verdicts = _verdicts(both, case, profile)
    again = _report(case, both, measurement, verdicts, record_property, case_evidence,
                    "perf figures (both measurements)")
    missed = [f"{name} ({v.reason})" for name, v in verdicts.items() if v.failed]
    if missed:
        raise PerfRegression(f"{case.name}: gate missed on {2 * profile.repeats} rounds: {', '.join(missed)}\n"
                             f"first measurement:\n{text}\nboth measurements:\n{again}")
