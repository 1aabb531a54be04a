"""Every named check of the suite has a fault that proves it, or a stated reason why not."""

from __future__ import annotations

from tests.support import faulty_impls
from tests.support.proofs import FAULT_TABLE, UNPROVEN, proofs_of, suite_checks


def test_every_check_has_a_proving_fault_or_a_reason() -> None:
    checks = list(suite_checks())
    assert len(checks) > 30, checks
    missing = [check for check in checks if not proofs_of(*check) and check not in UNPROVEN]
    assert not missing, f"checks no fault proves and UNPROVEN does not excuse: {missing}"


def test_no_reason_outlives_its_check() -> None:
    checks = set(suite_checks())
    stale = [key for key in UNPROVEN if key not in checks or proofs_of(*key)]
    assert not stale, f"UNPROVEN entries for checks that are gone or now proven: {stale}"


def test_every_row_names_a_fault_and_a_check_of_the_suite() -> None:
    checks = set(suite_checks())
    for proof in FAULT_TABLE:
        fault = getattr(faulty_impls, proof.fault, None)
        assert isinstance(fault, type) and fault.__module__.startswith(f"{faulty_impls.__name__}."), \
            f"{proof.id}: no fault {proof.fault!r} defined in tests/support/faulty_impls/"
        assert any(proof in proofs_of(module, name) for module, name in checks), f"{proof.id}: no such check"
