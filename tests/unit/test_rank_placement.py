"""Every rank-task builder places what the implementation receives on the device it is given.

Run with ``meta``, a device no code reaches by default: a builder that leaves
a tensor on the CPU, or lets megatron pick its own device (``torch.cuda``'s
current one), is caught here without an accelerator, as it would fail on a
GPU's or an NPU's collectives there.  The same builders on the CPU give the
same names and shapes (they only place; the numbers are drawn on the CPU).
Megatron's modules need its parallel state (per process), so they are built
on real gloo ranks; the builders without megatron run here.  The op operands
of every layout: ``test_rank_operands.py``.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from coc_shared import megatron
from conformance.cases.groups import TPPlace
from conformance.cases.op_cases import rank_operands
from conformance.cases.perf_cases import KINDS as PERF_OPS
from conformance.cases.pipeline_costs import pipeline_operands
from conformance.cases.quant_cases import rank_quant_operands
from conformance.cases.rank_layers import main_grad_shards, rank_batches, rank_layers, rank_main_grads
from conformance.contract.problems import LayerProblem, layer_weights
from conformance.explore.registry import KINDS

TP = 2
STEPS = 2
LAYER_PROBLEMS = {
    "column-sp": LayerProblem("column", True, 16, 8, "float32", b=2, tokens=(8, 4)),
    "row": LayerProblem("row", False, 16, 8, "float32", tokens=(6,)),
    "mlp-sp-nobias": LayerProblem("mlp", True, 8, 8, "float32", tokens=(4, 8), ffn=16, bias=False),
}


def placed(tensors: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's device type and shape, by name (None left out)."""
    return {name: (t.device.type, tuple(t.shape)) for name, t in tensors.items() if t is not None}


def layer_tensors(rank: int, tp: int, problem: LayerProblem, device: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What a layer task hands the layers on this rank: modules' parameters, micro-batches, main_grad buffers."""
    with megatron.model_parallel(tp, sequence_parallel=problem.sequence_parallel, device=device) as par:
        assert par.device == torch.device(device)
        module, params = rank_layers(problem, layer_weights(problem, 0), device)
        parts = (module.fc1, module.fc2) if problem.layer == "mlp" else (module,)
        tensors: dict[str, Any] = {f"parameter {n}": p for n, p in params.items()}
        for i, part in enumerate(parts):
            tensors.update({f"layer {i} {n}": t for n, t in [*part.named_parameters(), *part.named_buffers()]})
        for step, micro_batches in enumerate(rank_batches(problem, STEPS, par.data_parallel_rank, par.rank, tp,
                                                          device)):
            for i, batch in enumerate(micro_batches):
                tensors.update({f"step {step} micro-batch {i} {n}": t for n, t in batch.items()})
            grads = rank_main_grads(main_grad_shards(problem, step, par.rank, tp), device)
            tensors.update({f"step {step} main_grad {n}": t for n, t in grads.items()})
    return placed(tensors)


def perf_tensors(rank: int, tp: int, op: str, device: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What a perf case times on this rank: the layer's parameters, its input, the costs' buffers."""
    with megatron.model_parallel(tp, sequence_parallel=op != "matmul_all_reduce", device=device) as par, \
            torch.no_grad():
        layer, x, costs = pipeline_operands(op, 8, 4, 6, "float32", group=par.group, rank=rank, device=device)
        tensors = {f"layer {n}": p for n, p in layer.named_parameters()}
        tensors.update(x=x, lhs=costs.lhs, sent=costs.sent, received=costs.received, w_kn=costs.w_kn)
    return placed(tensors)


def assert_on_meta(on_meta: dict[str, tuple[str, tuple[int, ...]]],
                   on_cpu: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    elsewhere = {name: device for name, (device, _) in on_meta.items() if device != "meta"}
    assert not elsewhere, f"not on the device the builder was given (meta): {elsewhere}"
    assert {n: s for n, (_, s) in on_meta.items()} == {n: s for n, (_, s) in on_cpu.items()}


@pytest.mark.parametrize("name", sorted(LAYER_PROBLEMS))
def test_layer_tasks_place_modules_batches_and_main_grads_on_the_device(pools, name: str) -> None:
    pool = pools(TP)
    for on_meta, on_cpu in zip(pool.run(layer_tensors, LAYER_PROBLEMS[name], "meta"),
                               pool.run(layer_tensors, LAYER_PROBLEMS[name], "cpu")):
        assert any(n.startswith("parameter w") for n in on_meta) and any("main_grad" in n for n in on_meta)
        assert_on_meta(on_meta, on_cpu)


@pytest.mark.parametrize("op", sorted(PERF_OPS))
def test_perf_cases_place_the_layer_input_and_buffers_on_the_device(pools, op: str) -> None:
    pool = pools(TP)
    for on_meta, on_cpu in zip(pool.run(perf_tensors, op, "meta"), pool.run(perf_tensors, op, "cpu")):
        assert "layer weight" in on_meta
        assert_on_meta(on_meta, on_cpu)


def drawn_tensors(kind: str, spec: Any, device: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What the last TP rank of ``spec`` builds for the implementation, megatron's modules aside."""
    tensors: dict[str, Any] = {}
    if kind == "op":
        for r, run in enumerate(spec.jobs()):
            place = TPPlace(group=None, tp_rank=run.tp - 1, replica=0, members=tuple(range(run.tp)))
            for p, problem in enumerate(run.problems):
                operands = rank_operands(problem, run.op, place, run.transpose_weight, run.strides, device)
                tensors.update({f"run {r} problem {p} {n}": t for n, t in operands.items()})
    elif kind == "layer":
        job = spec.job()
        for step, micro_batches in enumerate(rank_batches(job.problem, job.steps, 0, job.tp - 1, job.tp, device)):
            for i, batch in enumerate(micro_batches):
                tensors.update({f"step {step} micro-batch {i} {n}": t for n, t in batch.items()})
            if job.main_grad:
                grads = rank_main_grads(main_grad_shards(job.problem, step, job.tp - 1, job.tp), device)
                tensors.update({f"step {step} main_grad {n}": t for n, t in grads.items()})
    elif kind == "w8a16":
        run = spec.run()
        tensors.update(rank_quant_operands(run, run.tp - 1, run.tp, device)[0])
    return placed(tensors)


#: Each explorer kind -> what its rank task hands the implementation (a new kind is added here, with its
#: builder); the configuration kind calls ``configure`` with flags and sizes only: no tensor to place.
DRAWN = {"op": "operands", "layer": "micro-batches and main_grad (the modules: the layer test above)",
         "w8a16": "x, w, scales", "config": None}


def test_every_explorer_kind_is_placed_here() -> None:
    assert {kind.name for kind in KINDS} == set(DRAWN)


@pytest.mark.parametrize("kind", [k for k in KINDS if DRAWN.get(k.name)], ids=lambda k: k.name)
def test_every_explorer_kinds_draws_are_built_on_the_device(kind: Any) -> None:
    rng = random.Random(11)
    for _ in range(6):
        spec = kind.draw(rng)
        on_meta = drawn_tensors(kind.name, spec, "meta")
        assert on_meta, spec.describe()
        assert_on_meta(on_meta, drawn_tensors(kind.name, spec, "cpu"))



class _Runtime:
    """A device runtime's module (``torch.get_device_module``) that records the current device set."""

    def __init__(self) -> None:
        self.current: list[torch.device] = []

    def set_device(self, device: torch.device) -> None:
        self.current.append(device)


#: An NPU as torch sees one without torch_npu (which renames this backend "npu").
NPU_STAND_IN = "privateuseone:3"


@pytest.mark.parametrize("cuda_answers", [True, False], ids=["torch.cuda-answers", "torch.cuda-absent"])
@pytest.mark.parametrize("device", ["cuda:1", NPU_STAND_IN])
def test_megatron_is_asked_for_the_ranks_device(monkeypatch: pytest.MonkeyPatch, device: str,
                                                cuda_answers: bool) -> None:
    """Where ``torch.cuda`` answers, megatron builds on the current device, set to the rank's; elsewhere it
    builds on the CPU (the module is then moved) and its buffers go where ``torch.cuda.current_device()``,
    redirected, says: the rank's device either way, never device 0 or the CPU."""
    runtime = _Runtime()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_answers)
    monkeypatch.setattr(torch, "get_device_module", lambda kind: runtime)
    place = torch.device(device)
    with megatron.megatron_device(device):
        assert runtime.current == [place]
        assert megatron.parallel_config(tp_size=2, sequence_parallel=False).use_cpu_initialization is not cuda_answers
        if not cuda_answers:
            assert torch.cuda.current_device() == place


@pytest.mark.parametrize(("device", "cuda_answers", "seeded"),
                         [("cuda:1", True, [5]), (NPU_STAND_IN, True, [5]), (NPU_STAND_IN, False, []),
                          ("cpu", True, []), ("meta", True, [])])
def test_megatrons_rng_tracker_is_seeded_where_it_draws_the_weights(monkeypatch: pytest.MonkeyPatch, device: str,
                                                                    cuda_answers: bool, seeded: list[int]) -> None:
    """Megatron draws device-built weights under its tracker; CPU-built ones from the CPU generator (no tracker)."""
    import megatron.core.tensor_parallel as tensor_parallel

    from coc_shared.megatron.placement import seed_device_rng

    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_answers)
    monkeypatch.setattr(tensor_parallel, "model_parallel_cuda_manual_seed", calls.append)
    seed_device_rng(torch.device(device), 5)
    assert calls == seeded
