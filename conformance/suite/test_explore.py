"""The explorer and the replay of what it found (``docs/DESIGN.md#explorer``); collected, run only when asked.

``--coc-explore SECONDS`` runs only :func:`test_explore`: cases drawn from the
whole space (``conformance/explore/space.py``), judged with the suite's own
checks, each new way of failing shrunk to a minimal case and saved as a spec
file with the command that replays it.  ``--coc-replay FILE`` runs only
:func:`test_replay`: that case, judged the same way.  Without either option
both are deselected (``conformance/plugins/exploring.py``).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from conformance import options
from conformance.explore.corpus import read_corpus, replay
from conformance.explore.exploration import Exploration
from conformance.explore.explorer import Explorer
from conformance.explore.finding import load_finding, write_finding
from conformance.explore.kind import record
from conformance.protocol import Declarations
from conformance.record import report_properties
from conformance.record.levels import Level
from conformance.record.verdicts import NotOffered
from conformance.suite.explorer_run import corpus_directories, run_scope

pytestmark = pytest.mark.coc_kind("explore")


def _replay_command(impl: str, path: Path) -> str:
    return shlex.join(["pytest", "--pyargs", "conformance.suite", options.IMPL, impl, options.REPLAY, str(path)])


@pytest.mark.coc_capability("explorer")
@pytest.mark.coc_builds_megatron
def test_explore(coc_ranks: Any, verdicts: Any, coc_impl: Any, coc_declarations: Declarations,
                 request: pytest.FixtureRequest) -> None:
    """Explore for ``--coc-explore`` seconds; every minimal failing case fails its check here."""
    config = request.config
    explorer = Explorer(coc_ranks, seed=config.getoption(options.SEED), budget_s=config.getoption(options.EXPLORE),
                        scope=run_scope(coc_impl, coc_declarations, coc_ranks, config),
                        storm=config.getoption(options.STORM),
                        corpus=[entry.spec for entry in read_corpus(corpus_directories(config))])
    if not explorer.kinds:
        raise NotOffered(f"the implementation offers no kind of case: {explorer.report.not_offered}")
    report = explorer.explore()
    directory, impl = Path(config.getoption(options.EXPLORE_DIR)), options.impl_spec(config)
    for finding in report.findings:
        path = write_finding(finding, directory, implementation=impl, command=lambda p: _replay_command(impl, p),
                             seed=report.seed, budget_s=report.budget_s)
        record(verdicts, finding.key, f"{finding.spec.describe()} ({finding.proof}; found after "
                                      f"{finding.found_after_s:.1f} s, {finding.cases_before} case(s)): "
                                      f"{finding.message}\nreplay: {finding.command}  (spec {path})")
    _record_judged(verdicts, report)
    request.node.user_properties.append((report_properties.EXPLORE, report.as_dict()))


def _record_judged(verdicts: Any, report: Exploration) -> None:
    """Every check the exploration judged and never saw fail, as passed; nothing judged, as not judged (never as
    a pass): every case drawn skipped, was out of reach or needed a mode not offered."""
    failed = {name.split(": ", 1)[1] for name in report.failing_cases}
    for name, level in sorted({(name, level) for _, name, level in report.judged_checks}):
        if name not in failed:
            with verdicts.check(name, level):
                pass
    if not report.judged_cases and not report.findings:
        verdicts.not_judged("the exploration judged a case", Level.MUST,
                            f"no case drawn was judged: {report.cases} case(s) run, skipped "
                            f"{dict(report.skipped)}; out of reach {dict(report.outside)}; not offered "
                            f"{report.not_offered}")


@pytest.mark.coc_capability("explorer")
@pytest.mark.coc_builds_megatron
def test_replay(coc_ranks: Any, verdicts: Any, coc_impl: Any, coc_declarations: Declarations,
                request: pytest.FixtureRequest) -> None:
    """The case of a spec file ``--coc-explore`` wrote, judged as the explorer judged it."""
    spec, _ = load_finding(request.config.getoption(options.REPLAY))
    why = replay(coc_ranks, spec, run_scope(coc_impl, coc_declarations, coc_ranks, request.config), verdicts)
    if why:
        pytest.skip(why)
