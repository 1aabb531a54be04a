"""The suite's command-line options (one group, ``coc-conformance``) and what they resolve to.

Imported by the plugin and by every sub-plugin that reads an option, so no
plugin module needs another one for its settings.  Imports nothing heavy.
"""

from __future__ import annotations

import pytest

#: The implementation judged when neither ``--coc-impl`` nor ini ``coc_impl`` names one.
DEFAULT_IMPL = "coc_impl.reference:ReferenceCoC"

#: Parameter names that hold a case's TP size (``--coc-tp`` filters on them).
TP_PARAMS = ("tp", "world_size")
#: Parameter name of a case's whole world size when its TP group is a proper subgroup.
WORLD_PARAM = "world"


#: ``--coc-figures`` choices: which comparisons get a histogram (and, when failed, a heat-map).
FIGURES = ("failed", "all", "none")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("coc-conformance", "CoC conformance suite")
    group.addoption(
        "--coc-impl", default=None, metavar="MODULE:ATTR",
        help=f"CoC implementation under test: an object, class or zero-arg callable "
        f"(default: ini coc_impl, else {DEFAULT_IMPL}).",
    )
    group.addoption(
        "--coc-launcher", default="process", choices=("process", "threaded", "torchrun"),
        help="How ranks run: warm gloo/nccl/hccl process pools (default), threads on torch's "
        "threaded process group (fast CPU numerics, no real overlap), or torchrun (every rank "
        "runs this session; multi-node).",
    )
    group.addoption(
        "--coc-backend", default=None,
        help="Collective backend for process ranks (default: hccl on NPU, nccl on CUDA, gloo on CPU).",
    )
    group.addoption(
        "--coc-case-timeout", type=float, default=120.0, metavar="SECONDS",
        help="Ceiling of any case: one not finished on every rank by then fails as a hang (default 120). "
        "Cases declare a tighter budget from their own measured serial time.",
    )
    group.addoption(
        "--coc-budget-factor", type=float, default=20.0, metavar="F",
        help="A case's budget: F times the serial path's time on the live ranks, plus --coc-budget-floor "
        "(default 20).",
    )
    group.addoption(
        "--coc-budget-floor", type=float, default=10.0, metavar="SECONDS",
        help="The least budget a case gets for the implementation's calls (default 10).",
    )
    group.addoption(
        "--coc-storm", type=int, default=3, metavar="N",
        help="After N hangs or crashes in a row of one capability, its remaining cases fail at once "
        "without running (default 3; 0 disables).",
    )
    group.addoption(
        "--coc-cpu-slots", type=int, default=8, metavar="N",
        help="CPU ranks allowed to run at once across all xdist workers of this machine (default 8).",
    )
    group.addoption(
        "--coc-max-live-ranks", type=int, default=None, metavar="N",
        help="Idle warm rank processes one pytest worker may keep (default: what fits in half "
        "the machine's memory shared by the xdist workers, at most 16).",
    )
    group.addoption(
        "--coc-lease-dir", default=None, metavar="DIR",
        help="Directory of device lease locks shared by all workers (default: per-user temp dir).",
    )
    group.addoption(
        "--coc-tp", default=None, metavar="SIZES",
        help="Comma-separated TP sizes to run (default: every size the case lists).",
    )
    group.addoption(
        "--coc-gate", default="all", metavar="LEVELS",
        help="Requirement levels whose failures fail the run: comma-separated MUST, SHOULD, STRUCTURE "
        "or 'all' (default). Failures of other levels are reported as expected failures.",
    )
    group.addoption(
        "--coc-expectations", default=None, metavar="FILE",
        help="TOML file of known outcomes (fail / skip / hang) per case-id pattern; a known failure is "
        "reported as known, an unexpected pass fails.",
    )
    group.addoption(
        "--coc-summary", default=None, metavar="FILE",
        help="Write the compact JSON summary of the run here (default: next to --alluredir, if given).",
    )
    group.addoption(
        "--coc-figures", default="failed", choices=FIGURES,
        help="Error-distribution figures in the Allure results: for failed comparisons only (default; "
        "each figure costs tens of milliseconds, thousands per run), for every comparison, or none. "
        "Every comparison gets its statistics table either way.",
    )
    parser.addini("coc_impl", "Default CoC implementation under test (MODULE:ATTR).", default=None)


def impl_spec(config: pytest.Config) -> str:
    """The ``--coc-impl`` in force (option, then ini, then the reference)."""
    return config.getoption("--coc-impl") or config.getini("coc_impl") or DEFAULT_IMPL
