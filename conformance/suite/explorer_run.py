"""What a run gives the explorer's cases (``test_explore``, ``test_replay``, ``test_corpus``): the scope of the
implementation within this node's reach, and the corpus directories in force."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from conformance import options
from conformance.explore.corpus import SHIPPED
from conformance.explore.kind import Scope
from conformance.protocol import Declarations


def run_scope(impl: Any, declarations: Declarations, ranks: Any, config: pytest.Config) -> Scope:
    """What the implementation offers the explorer (layers only where megatron-core is importable), within the
    ranks this node hosts and the TP sizes ``--coc-tp`` names."""
    megatron = "" if importlib.util.find_spec("megatron") and importlib.util.find_spec("megatron.core") else \
        "megatron-core is not installed"
    tp_sizes = config.getoption(options.TP)
    return Scope.of(impl, declarations, megatron=megatron, devices=ranks.max_world,
                    tp_sizes=None if tp_sizes is None else frozenset(tp_sizes))


def corpus_directories(config: pytest.Config) -> list[Path]:
    """The corpora this run replays: the shipped one (unless ``--coc-no-shipped-corpus``), then ``--coc-corpus``'s."""
    shipped = [] if config.getoption(options.NO_SHIPPED_CORPUS) else [SHIPPED]
    return shipped + options.corpus_dirs(config)
