"""The corpora a run replays are read at start-up: a malformed spec file is a usage error naming it.

Only where ``--coc-corpus`` (or ini ``coc_corpus``) names one: reading specs
imports the kinds of case (torch), which a plain run of the plugin does not.
The shipped corpus is held valid by the unit tests.
"""

from __future__ import annotations

import pytest

from conformance import options


def pytest_configure(config: pytest.Config) -> None:
    directories = options.corpus_dirs(config)
    if not directories:
        return
    from conformance.explore.corpus import read_corpus
    from conformance.explore.spec import SpecError

    try:
        read_corpus(directories)
    except SpecError as exc:
        raise pytest.UsageError(f"{options.CORPUS}: {exc}") from None
