"""The corpus, replayed (``docs/DESIGN.md#explorer``): every kept case, an ordinary case of every tier.

Each spec file of the shipped corpus (``conformance/corpus/``) and of every
``--coc-corpus DIR`` (or ini ``coc_corpus``) is one case
``test_corpus[<kind>-<hash>]``, judged by the function ``--coc-replay`` and
the explorer judge with (:func:`conformance.explore.corpus.replay`): the
explorer's findings, once kept, stay found.
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.explore.corpus import read_corpus, replay
from conformance.protocol import Declarations
from conformance.suite.explorer_run import corpus_directories, run_scope

pytestmark = pytest.mark.coc_kind("corpus")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One case per spec of the corpora in force (a malformed one is refused at start-up, naming its file)."""
    if "corpus_spec" in metafunc.fixturenames:
        entries = read_corpus(corpus_directories(metafunc.config))
        metafunc.parametrize("corpus_spec", [e.spec for e in entries], ids=[e.case_id for e in entries])


@pytest.mark.coc_capability("corpus")
@pytest.mark.coc_builds_megatron
def test_corpus(corpus_spec: Any, coc_ranks: Any, verdicts: Any, coc_impl: Any, coc_declarations: Declarations,
                request: pytest.FixtureRequest) -> None:
    """A kept case (an explorer's finding, a boundary of a setting), judged as the explorer judged it."""
    why = replay(coc_ranks, corpus_spec, run_scope(coc_impl, coc_declarations, coc_ranks, request.config), verdicts)
    if why:
        pytest.skip(why)
