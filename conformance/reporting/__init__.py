"""What a run tells its readers: Allure labels and attachments, run files, figures, the offline report.

``allure`` is the one module that imports allure-pytest; ``build`` makes the
single-file HTML report with npm's ``allure`` (pinned in ``npm/``).
"""
