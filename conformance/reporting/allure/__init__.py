"""What a conformance case tells Allure: labels, parameters, attachments and its checks as steps.

The one package that imports ``allure`` (and allure-pytest's ``allure_commons``), one concern a module:
:mod:`~conformance.reporting.allure.recording` (whether results are recorded, what the case described itself),
:mod:`~conformance.reporting.allure.labels` (labels, parameters, tags), :mod:`~conformance.reporting.allure.attachments`
(what the checks recorded: comparisons, texts, timelines, explorations), :mod:`~conformance.reporting.allure.steps`
(a step per check, why a case did not pass, the failure's header) and :mod:`~conformance.reporting.allure.lost_cases`
(a result for every case a dead worker took with it).  The hooks in :mod:`conformance.reporting.hooks` call them;
every function returns at once unless allure-pytest records results (``--alluredir``).
"""
