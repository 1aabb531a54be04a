"""Training-step conformance (``docs/DESIGN.md#training-steps``): layers as a training loop uses them.

Bug classes that escape single-call tests, each a MUST:

* several optimizer steps on the same layers, weights updated in place in
  between (a CoC path that caches a weight, or a transposed copy of it, goes
  stale);
* micro-batches of different token counts run forward back to back, their
  outputs kept, then every backward (saved tensors and reused buffers must
  not be shared between calls);
* gradient-accumulation fusion: each weight carries a pre-filled fp32
  ``main_grad`` that the backward accumulates into, as Megatron's DDP sets up
  -- the gradient lands there once, and not in ``.grad`` as well;
* column -> gelu -> row stacked as an MLP block, SP and not;
* TP groups that are proper subgroups of the world, set up by Megatron's
  own ``initialize_model_parallel`` with DP > 1, each replica with its data;
* stragglers: one rank, or random ranks, late at every collective, forward
  and backward;
* corners: ``h_out`` (per rank) = 43, TP 1, and float32 parameters under
  ``torch.autocast`` to bfloat16 (judged with bfloat16's bound against the
  float64 truth).

Every output, input gradient, weight and bias gradient of every step,
micro-batch and replica is compared with the float64 replay of the same
training (the unpatched layers are the serial reference).
"""

from __future__ import annotations

from typing import Any

import pytest

from conformance.cases.groups import SUBGROUP_SIZES
from conformance.cases.layer_cases import AUTOCAST_LAYERS, layer_task
from conformance.contract.jobs import LayerJob, coc_argv
from conformance.contract.problems import LAYER_KINDS, LayerProblem
from conformance.judge.layer_verdicts import judge_training, sort_layer_attempts

pytestmark = [pytest.mark.coc_requires("patch_megatron"), pytest.mark.coc_kind("training")]

CHUNKS = 2


def _problem(layer: str, sp: bool, tp: int, *, dtype: str = "float32", seed: int = 0) -> LayerProblem:
    """Two micro-batches of different lengths (16 and 8 tokens per rank), b = 2."""
    tokens = (16 * tp, 8 * tp) if sp else (16, 8)
    return LayerProblem(layer, sp, 32, 32, dtype, b=2, tokens=tokens, ffn=64 if layer == "mlp" else None, seed=seed)


def _params(tps: tuple[int, ...] = (2, 8)) -> list[Any]:
    return [pytest.param(layer, sp, tp, id=f"{layer}-{'sp' if sp else 'nosp'}-tp{tp}")
            for layer in LAYER_KINDS for sp in (False, True) for tp in tps]


def _check(coc_ranks: Any, verdicts: Any, job: LayerJob, *, world: int | None = None) -> None:
    """The training job on its ranks; every output and gradient that came back judged, whatever else raised."""
    outcomes = coc_ranks.run(layer_task, world or job.tp, job=job)
    sort_layer_attempts(verdicts, outcomes, what=f"{job.problem.layer} layer training")
    judge_training(verdicts, job, outcomes, chunks=CHUNKS)


@pytest.mark.parametrize("layer, sp, tp", _params())
def test_training_steps(coc_ranks: Any, verdicts: Any, layer: str, sp: bool, tp: int) -> None:
    """Three steps, two micro-batches each (kept, then backward), weights updated in place in between."""
    job = LayerJob(_problem(layer, sp, tp, dtype="bfloat16", seed=1), tp, tuple(coc_argv(CHUNKS)), steps=3)
    _check(coc_ranks, verdicts, job)


@pytest.mark.parametrize("layer, sp, tp", _params())
def test_gradient_accumulation_fusion(coc_ranks: Any, verdicts: Any, layer: str, sp: bool, tp: int) -> None:
    """Micro-batch gradients accumulate into each weight's pre-filled fp32 ``main_grad``, once; biases too."""
    job = LayerJob(_problem(layer, sp, tp, seed=2), tp, tuple(coc_argv(CHUNKS)), steps=2, main_grad=True)
    _check(coc_ranks, verdicts, job)


#: (world, tp): TP 2 x DP 2, TP 2 x DP 4, TP 4 x DP 2 -- Megatron's contiguous TP groups.


@pytest.mark.parametrize("world, tp", SUBGROUP_SIZES, ids=[f"world{w}-tp{t}" for w, t in SUBGROUP_SIZES])
@pytest.mark.parametrize("layer, sp", [(layer, sp) for layer in LAYER_KINDS for sp in (False, True)],
                         ids=[f"{layer}-{'sp' if sp else 'nosp'}" for layer in LAYER_KINDS for sp in (False, True)])
def test_layers_on_tp_subgroup(coc_ranks: Any, verdicts: Any, layer: str, sp: bool, world: int, tp: int) -> None:
    """DP > 1 through Megatron's ``initialize_model_parallel``; every replica trains on its own data."""
    job = LayerJob(_problem(layer, sp, tp, seed=3), tp, tuple(coc_argv(CHUNKS)))
    _check(coc_ranks, verdicts, job, world=world)


@pytest.mark.parametrize("who", ["rank1", "random"])
@pytest.mark.parametrize("layer, sp, tp", _params((4,)))
def test_layer_stragglers(coc_ranks: Any, verdicts: Any, layer: str, sp: bool, tp: int, who: str) -> None:
    """A late rank at every collective of the forward and the backward (and at the call itself)."""
    job = LayerJob(_problem(layer, sp, tp, seed=4), tp, tuple(coc_argv(CHUNKS)), straggler_s=0.01,
                   straggler_rank=1 if who == "rank1" else None)
    _check(coc_ranks, verdicts, job)


# --- corners of the case space: where real patches change behaviour (docs/DESIGN.md#training-steps) -----------

#: An output width with a tail no tile of 8 or 16 columns covers (per rank, for the column layer's shard).
ODD_H_OUT = 43


def _corner_params(tp: int) -> list[Any]:
    return [pytest.param(layer, sp, tp, id=f"{layer}-{'sp' if sp else 'nosp'}-tp{tp}")
            for layer, sp in (("column", True), ("row", False), ("mlp", True))]


@pytest.mark.parametrize("layer, sp, tp", _corner_params(2))
def test_corner_h_out_not_multiple_of_8(coc_ranks: Any, verdicts: Any, layer: str, sp: bool, tp: int) -> None:
    """``h_out`` (per rank) = 43: the layers' matmuls write every column of the tail."""
    h_out = ODD_H_OUT * tp if layer == "column" else ODD_H_OUT
    tokens = (16 * tp,) if sp else (16,)
    problem = LayerProblem(layer, sp, 32, h_out, "float32", b=2, tokens=tokens, ffn=64 if layer == "mlp" else None,
                           seed=5)
    _check(coc_ranks, verdicts, LayerJob(problem, tp, tuple(coc_argv(CHUNKS))))


@pytest.mark.parametrize("layer, sp, tp", [pytest.param(layer, False, 1, id=f"{layer}-nosp-tp1")
                                           for layer in LAYER_KINDS])  # megatron refuses SP without TP
def test_corner_tp1_layers(coc_ranks: Any, verdicts: Any, layer: str, sp: bool, tp: int) -> None:
    """TP 1: the patch is applied at any TP size, a group of one rank included."""
    _check(coc_ranks, verdicts, LayerJob(_problem(layer, sp, tp, seed=6), tp, tuple(coc_argv(CHUNKS))))


@pytest.mark.parametrize("layer, sp, tp", [pytest.param(layer, sp, 2, id=f"{layer}-{'sp' if sp else 'nosp'}-tp2")
                                           for layer, sp in AUTOCAST_LAYERS])
def test_corner_autocast(coc_ranks: Any, verdicts: Any, layer: str, sp: bool, tp: int) -> None:
    """float32 parameters under ``torch.autocast`` to bfloat16, two steps: the truth stays float64.

    Activations, gradients and parameters then have different dtypes: a
    buffer sized or typed from the input's dtype instead of the computed
    tensor's is wrong here only.
    """
    job = LayerJob(_problem(layer, sp, tp, seed=7), tp, tuple(coc_argv(CHUNKS)), steps=2, autocast="bfloat16")
    _check(coc_ranks, verdicts, job)
