"""The device's random number generator: random ops on ``npu`` draw from it, never from the CPU's.

On a real device, ``torch.randn(..., device="npu")`` or a dropout mask consumes the device's generator
(seeded by ``torch.npu.manual_seed``) and leaves the CPU's stream alone.  The emulator runs those ops on
the CPU, so it hands them a generator of their own: every op with a ``Generator?`` argument gets it when
none is given (:mod:`npu_sim.tensor`), the factories without one run as their ``.generator`` overload,
and ``native_dropout`` (which has no generator argument) draws its mask from it here.
"""

from __future__ import annotations

import torch

#: The seed a device generator starts from (PyTorch's default for device generators).
DEFAULT_SEED = 67280421310721

_GENERATOR: list[torch.Generator] = []


def generator() -> torch.Generator:
    """This process's device generator (one: every tensor is on ``npu:0``)."""
    if not _GENERATOR:
        _GENERATOR.append(torch.Generator().manual_seed(DEFAULT_SEED))
    return _GENERATOR[0]


def manual_seed(seed: int) -> None:
    generator().manual_seed(int(seed))


def seed() -> None:
    generator().seed()


def initial_seed() -> int:
    return generator().initial_seed()


def get_state() -> torch.Tensor:
    return generator().get_state()


def set_state(state: torch.Tensor) -> None:
    generator().set_state(state.cpu() if state.device.type != "cpu" else state)


def _with_generator(overload):
    def handler(func, args, kwargs):
        from npu_sim.tensor import run

        return run(overload, args, {**kwargs, "generator": None})

    return handler


def _native_dropout(func, args, kwargs):
    from npu_sim.tensor import unwrap, wrap

    bound = dict(zip(("input", "p", "train"), args), **kwargs)
    x, p, train = unwrap(bound["input"]), bound["p"], bound.get("train")
    if train is False or p == 0:
        return wrap(x.clone()), wrap(torch.ones_like(x, dtype=torch.bool))
    mask = torch.empty_like(x, dtype=torch.bool).bernoulli_(1 - p, generator=generator())
    scale = 0.0 if p == 1 else 1.0 / (1 - p)
    return wrap(x * mask * scale), wrap(mask)


def handlers() -> dict:
    """Ops whose random draws need the device generator but take none."""
    aten = torch.ops.aten
    return {
        aten.randn.default: _with_generator(aten.randn.generator),
        aten.rand.default: _with_generator(aten.rand.generator),
        aten.randint.default: _with_generator(aten.randint.generator),
        aten.randint.low: _with_generator(aten.randint.low_generator),
        aten.randperm.default: _with_generator(aten.randperm.generator),
        aten.native_dropout.default: _native_dropout,
    }
