"""A broken Allure result for every collected case that has none: its worker died, or never ran it."""

from __future__ import annotations

from conformance.record.report_properties import CASE_LABEL, RUN_LABEL
from conformance.reporting.allure.labels import EPIC


def report_lost_case(results_dir: str, nodeid: str, why: str, *, run: str, feature: str) -> None:
    """A broken result for a collected case that has none (its worker died, or never ran it), under ``feature``
    (its kind).

    Written by the controller, so the report lists every lost case under
    "hang / timeout" and its count of results matches the cases collected.
    """
    from allure_commons.logger import AllureFileLogger
    from allure_commons.model2 import Label, Status, StatusDetails, TestResult
    from allure_commons.utils import md5, now, uuid4

    from conformance.caseids import case_id
    from conformance.harness.case_errors import WorkerLost

    module, _, test = nodeid.partition("::")
    full_name = f"{module.removesuffix('.py').replace('/', '.')}#{test.split('[')[0]}"
    moment = now()
    AllureFileLogger(results_dir).report_result(TestResult(
        uuid=uuid4(), name=test, fullName=full_name, testCaseId=md5(full_name), historyId=md5(nodeid),
        status=Status.BROKEN, start=moment, stop=moment,
        statusDetails=StatusDetails(message=f"{WorkerLost.__module__}.{WorkerLost.__name__}: {why}"),
        labels=[Label("epic", EPIC), Label("feature", feature),
                Label("severity", "critical"), Label("framework", "pytest"), Label(RUN_LABEL, run),
                Label(CASE_LABEL, case_id(nodeid))],
    ))
