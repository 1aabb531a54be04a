"""The smoke tier as kept (``conformance/smoke_tier.json``): every case of it is one the suite collects, and its kill
table names, for every row of the proof table, cases of the tier that catch the row's fault.

``tests/suite_runs/test_suite_bites.py`` runs each row's fault on exactly those cases; here, without running any,
a row the tier no longer catches (a case removed from the tier, a new row or fault not yet chosen for) fails, and
says to run ``python -m conformance.bench tiers``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conformance.caseids import matches
from conformance.tiers import CORPUS, HELD, smoke_tier
from tests.support import ROOT
from tests.support.proofs import FAULT_TABLE

CHOOSE = "run `python -m conformance.bench tiers` and commit conformance/smoke_tier.json"


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The suite's case ids as a plain collection sees them."""
    from conformance.caseids import case_id

    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "conformance.plugin", "-p", "no:cacheprovider",
                           "--collect-only", "-q", "--pyargs", "conformance.suite", "--rootdir", str(ROOT),
                           "-c", str(ROOT / "pyproject.toml")], cwd=tmp_path_factory.mktemp("collect"),
                          capture_output=True, text=True)
    cases = [case_id(line) for line in done.stdout.splitlines() if "::" in line]
    assert len(cases) > 100, done.stdout[-2000:] + done.stderr[-2000:]
    return cases


def test_every_case_of_the_tier_is_collected(collected: list[str]) -> None:
    """A renamed test or parameter would silently leave the per-change tier; each held pattern (the corpus, the
    fused kernels' goldens) matches cases, and the chosen tier holds those cases."""
    gone = sorted(smoke_tier().cases - set(collected))
    assert not gone, f"smoke tier cases the suite no longer has: {gone}; {CHOOSE}"
    for pattern in HELD:
        held = [case for case in collected if matches(case, pattern)]
        assert held, f"no case matches the held pattern {pattern!r}"
        assert pattern == CORPUS or set(held) <= smoke_tier().cases, f"{pattern!r} cases not chosen; {CHOOSE}"


def test_every_row_of_the_proof_table_is_caught_by_cases_of_the_tier() -> None:
    """So every fault the table names is caught, at every check it proves."""
    tier = smoke_tier()
    rows = [p for p in FAULT_TABLE if p.node == "cpu"]  # the others are proved on their node's held cases
    missing = [p.key for p in rows if not tier.kills.get(p.key)]
    assert not missing, f"proof rows no case of the smoke tier catches: {missing}; {CHOOSE}"
    outside = {p.key: out for p in rows if (out := sorted(set(tier.kills[p.key]) - tier.cases))}
    assert not outside, f"kill table cases the tier does not hold: {outside}"
    elsewhere = {p.key: out for p in rows
                 if (out := [c for c in tier.kills[p.key] if not c.startswith(f"{p.module}.py::")])}
    assert not elsewhere, f"kill table cases outside their row's module: {elsewhere}"
    stale = sorted(set(tier.kills) - {p.key for p in rows})
    assert not stale, f"kill table rows the proof table no longer has: {stale}; {CHOOSE}"


def test_the_tier_is_its_cases_and_the_corpus() -> None:
    """``in_smoke`` reads the kept tier: its cases and the whole corpus are in, nothing else."""
    from conformance.tiers import in_smoke

    case = sorted(smoke_tier().cases)[0]
    assert in_smoke(case) and in_smoke("test_corpus.py::test_corpus[anything]")
    assert not in_smoke(case + "-not-a-case")
