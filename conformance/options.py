"""The suite's command-line options (one group, ``coc-conformance``), their ini twins, and what they resolve to.

Every option name is a constant here (as Hypothesis keeps its settings), so a
plugin reads ``config.getoption(options.LAUNCHER)`` and a typo is an import
error, not a silent default.  Bad values are refused at start-up with a usage
error naming the option.  Imports nothing heavy.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

#: The implementation judged when neither ``--coc-impl`` nor ini ``coc_impl`` names one.
DEFAULT_IMPL = "coc_impl.reference:ReferenceCoC"

IMPL = "--coc-impl"
LAUNCHER = "--coc-launcher"
BACKEND = "--coc-backend"
CASE_TIMEOUT = "--coc-case-timeout"
BUDGET_FACTOR = "--coc-budget-factor"
BUDGET_FLOOR = "--coc-budget-floor"
STORM = "--coc-storm"
CPU_SLOTS = "--coc-cpu-slots"
PERF_FIGURES = "--coc-perf-figures"
RANKS_PER_DEVICE = "--coc-ranks-per-device"
MAX_LIVE_RANKS = "--coc-max-live-ranks"
LEASE_DIR = "--coc-lease-dir"
RANK_SERVER = "--coc-rank-server"
TP = "--coc-tp"
GATE = "--coc-gate"
EXPECTATIONS = "--coc-expectations"
SUMMARY = "--coc-summary"
FIGURES = "--coc-figures"
EXPLORE = "--coc-explore"
SEED = "--coc-seed"
REPLAY = "--coc-replay"
EXPLORE_DIR = "--coc-explore-dir"
CORPUS = "--coc-corpus"
NO_SHIPPED_CORPUS = "--coc-no-shipped-corpus"
SAME_THREAD_BACKWARD = "--coc-same-thread-backward"
EMULATE_NPU = "--coc-emulate-npu"

#: ini settings a project can pin in ``pytest.ini`` / ``pyproject.toml`` (the option wins).
INI_IMPL, INI_GATE, INI_EXPECTATIONS = "coc_impl", "coc_gate", "coc_expectations"
INI_CORPUS = "coc_corpus"

LAUNCHERS = ("process", "threaded", "torchrun")
#: ``--coc-figures`` choices: which comparisons get a histogram (and, when failed, a heat-map).
FIGURE_CHOICES = ("failed", "all", "none")

#: Parameter names that hold a case's TP size (``--coc-tp`` filters on them).
TP_PARAMS = ("tp", "world_size")
#: Parameter name of a case's whole world size when its TP group is a proper subgroup.
WORLD_PARAM = "world"


#: The most ranks a case of the suite runs on (TP 8): CPU slots never default below it, so every case runs.
LARGEST_WORLD = 8


def available_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_cpu_slots() -> int:
    """CPU slots by default: the cores this process may run on, and never fewer than :data:`LARGEST_WORLD`."""
    return max(available_cores(), LARGEST_WORLD)


def _positive(kind: type[int] | type[float], *, zero: bool = False) -> object:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < 0 or (value == 0 and not zero):
            raise argparse.ArgumentTypeError(f"expected a {'non-negative' if zero else 'positive'} number, "
                                             f"got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its message
    return parse


def _tp_sizes(text: str) -> frozenset[int]:
    try:
        sizes = frozenset(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated TP sizes such as 2,4, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated TP sizes of at least 1, got {text!r}")
    return sizes


def _replay_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such spec file: {text!r}")
    return path


def _corpus_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"no such corpus directory: {text!r}")
    return path


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("coc-conformance", "CoC conformance suite")
    group.addoption(
        IMPL, default=None, metavar="MODULE:ATTR",
        help=f"CoC implementation under test: an object, class or zero-arg callable "
        f"(default: ini {INI_IMPL}, else {DEFAULT_IMPL}).",
    )
    group.addoption(
        LAUNCHER, default="process", choices=LAUNCHERS,
        help="How ranks run: warm gloo/nccl/hccl process pools (default), threads on torch's "
        "threaded process group (fast CPU numerics, no real overlap), or torchrun (every rank "
        "runs this session; multi-node).",
    )
    group.addoption(
        BACKEND, default=None, choices=("gloo", "nccl", "hccl"),
        help="Collective backend for process ranks (default: hccl on NPU, nccl on CUDA, gloo on CPU).",
    )
    group.addoption(
        CASE_TIMEOUT, type=_positive(float), default=120.0, metavar="SECONDS",
        help="Ceiling of any case: one not finished on every rank by then fails as a hang (default 120). "
        "Cases declare a tighter budget from their own measured serial time.",
    )
    group.addoption(
        BUDGET_FACTOR, type=_positive(float), default=20.0, metavar="F",
        help=f"A case's budget: F times the serial path's time on the live ranks, plus {BUDGET_FLOOR} "
        "(default 20). Once it is spent, a case runs on (up to "
        f"{CASE_TIMEOUT}) only while some rank progresses and none is stalled, each rank judged on its own "
        "evidence: collectives completing, its stack changing, device work, its task thread's CPU time.",
    )
    group.addoption(
        BUDGET_FLOOR, type=_positive(float), default=10.0, metavar="SECONDS",
        help="The least budget a case gets for the implementation's calls (default 10).",
    )
    group.addoption(
        STORM, type=_positive(int, zero=True), default=3, metavar="N",
        help="After N hangs or crashes in a row of one capability, its remaining cases fail at once "
        "without running (default 3; 0 disables).",
    )
    group.addoption(
        CPU_SLOTS, type=_positive(int), default=default_cpu_slots(), metavar="N",
        help="CPU ranks allowed to run at once across all xdist workers of this machine (default: the cores "
        f"this process may use, at least {LARGEST_WORLD}, the largest world of the suite's cases; here "
        f"{default_cpu_slots()}).",
    )
    group.addoption(
        PERF_FIGURES, action="store_true",
        help="Run the perf cases whose gate is not enforced on this node (a profile with enforce: false, or "
        "the figures-only profile of a node no profile names) for their figures; by default they are skipped, "
        "not judged, and hold no devices.",
    )
    group.addoption(
        RANKS_PER_DEVICE, type=_positive(int), default=1, metavar="N",
        help="Ranks that share one accelerator (default 1): N > 1 runs TP cases of up to N times the "
        "devices on gloo with device tensors, e.g. TP 2 on one GPU. CUDA only; refused elsewhere, saying why.",
    )
    group.addoption(
        SAME_THREAD_BACKWARD, action="store_true", default=False,
        help="Run a CPU rank's backward on the thread that called it, as torch does for CPU tensors. By default it "
        "runs on the rank's one long-lived device thread, carrying the caller's thread-local state (grad mode, "
        "autocast, dispatch modes), as the autograd engine runs every accelerator's backward, so code that breaks "
        "there fails on CPU too.",
    )
    group.addoption(
        EMULATE_NPU, action="store_true", default=False,
        help="Run on the emulated Ascend NPU node (npu-sim, installed beside the suite): an 8-card node on the CPU "
        "with the npu device, hccl and torch_npu's MC2 kernels, in this process, the rank processes and every "
        "process they start (NPU_SIM=1). Refused where npu-sim is not installed or a real torch_npu is.",
    )
    group.addoption(
        MAX_LIVE_RANKS, type=_positive(int), default=None, metavar="N",
        help="Warm rank processes the session keeps, idle and running, for all xdist workers together (default: "
        "three per device or CPU slot, within half the machine's memory).",
    )
    group.addoption(
        RANK_SERVER, default=None, metavar="SOCKET",
        help="Run the cases on the rank server of another session (its socket), on pools of their own, where it "
        "runs this session's code on the same devices; else (saying why) on ranks of this session's own. Its "
        f"live-rank budget ({MAX_LIVE_RANKS}) is the server's.",
    )
    group.addoption(
        LEASE_DIR, default=None, metavar="DIR",
        help="Directory of device lease locks shared by all workers (default: a per-user directory in /dev/shm, else "
        "in the temp dir).",
    )
    group.addoption(
        TP, type=_tp_sizes, default=None, metavar="SIZES",
        help="Comma-separated TP sizes to run (default: every size the case lists).",
    )
    group.addoption(
        GATE, default=None, metavar="LEVELS",
        help="Requirement levels whose failures fail the run: comma-separated MUST, SHOULD, STRUCTURE "
        f"or 'all' (default: ini {INI_GATE}, else all). Failures of other levels are reported as "
        "expected failures.",
    )
    group.addoption(
        EXPECTATIONS, default=None, metavar="FILE",
        help="TOML file of known outcomes (fail / skip / hang) per case-id pattern; a known failure is "
        f"reported as known, an unexpected pass fails (default: ini {INI_EXPECTATIONS}).",
    )
    group.addoption(
        SUMMARY, default=None, metavar="FILE",
        help="Write the compact JSON summary of the run here (default: next to --alluredir, if given).",
    )
    group.addoption(
        FIGURES, default="failed", choices=FIGURE_CHOICES,
        help="Error-distribution figures in the Allure results: for failed comparisons only (default; "
        "each figure costs tens of milliseconds, thousands per run), for every comparison, or none. "
        "Every comparison gets its statistics table either way.",
    )
    group.addoption(
        EXPLORE, type=_positive(float), default=None, metavar="SECONDS",
        help="Run only the explorer, for this long: it draws cases from the whole space, judges them with the "
        f"suite's checks, shrinks each failure to a minimal case and writes it to {EXPLORE_DIR}.",
    )
    group.addoption(
        SEED, type=_positive(int, zero=True), default=0, metavar="N",
        help=f"Seed of {EXPLORE}: the same seed draws the same cases (default 0).",
    )
    group.addoption(
        REPLAY, type=_replay_file, default=None, metavar="FILE",
        help=f"Run only the case of a spec {EXPLORE} wrote (JSON), judged as an ordinary test.",
    )
    group.addoption(
        EXPLORE_DIR, default="reports/explore", metavar="DIR",
        help=f"Where {EXPLORE} writes each minimal failing case as a replayable spec (default reports/explore).",
    )
    group.addoption(
        CORPUS, action="append", type=_corpus_dir, default=None, metavar="DIR",
        help="A directory of spec files (the corpus): each replayed as a case test_corpus[<kind>-<hash>], "
        f"judged as {EXPLORE} judges it, beside the shipped corpus; {EXPLORE} replays it first and mutates it. "
        f"Repeatable (default: ini {INI_CORPUS}).",
    )
    group.addoption(
        NO_SHIPPED_CORPUS, action="store_true", default=False,
        help="Leave the corpus the suite ships out of the replay and the exploration (the explorer's own draws "
        "measured alone).",
    )
    parser.addini(INI_IMPL, "Default CoC implementation under test (MODULE:ATTR).", default=None)
    parser.addini(INI_GATE, f"Default requirement levels that fail the run ({GATE}).", default=None)
    parser.addini(INI_EXPECTATIONS, f"Default known-outcomes file ({EXPECTATIONS}), relative to the rootdir.",
                  default=None)
    parser.addini(INI_CORPUS, f"Default corpus directories ({CORPUS}), relative to the rootdir.", type="paths",
                  default=[])


def impl_spec(config: pytest.Config) -> str:
    """The ``--coc-impl`` in force (option, then ini, then the reference)."""
    return config.getoption(IMPL) or config.getini(INI_IMPL) or DEFAULT_IMPL


def gate_spec(config: pytest.Config) -> str:
    """The ``--coc-gate`` in force (option, then ini, then every level)."""
    return config.getoption(GATE) or config.getini(INI_GATE) or "all"


def expectations_path(config: pytest.Config) -> Path | None:
    """The ``--coc-expectations`` file in force (option, then ini relative to the rootdir), if any."""
    given = config.getoption(EXPECTATIONS)
    if given:
        return Path(given)
    pinned = config.getini(INI_EXPECTATIONS)
    return config.rootpath / pinned if pinned else None


def corpus_dirs(config: pytest.Config) -> list[Path]:
    """The ``--coc-corpus`` directories in force (the options, else ini ``coc_corpus``), the shipped one aside."""
    given = config.getoption(CORPUS)
    return list(given) if given else [Path(p) for p in config.getini(INI_CORPUS)]
