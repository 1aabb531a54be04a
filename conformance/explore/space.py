"""The space the explorer draws from: each dimension once, with how to draw it and how to make it simpler.

A dimension is one line of :data:`SPEC_DIMENSIONS` (a field of the spec) or
:data:`CALL_DIMENSIONS` (a field of each call): a draw from a seeded
``random.Random`` and the one-step-simpler values of a value, simplest
first.  Drawing and shrinking read the same lines, so a new dimension (a new
job field) is one line here and one field of the spec.

Small shapes most of the time (cases per second), big ones sometimes (where
kernels switch algorithm), odd and prime sizes often (tail tiles).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from conformance.cases.groups import GROUP_LAYOUTS
from conformance.explore.spec import Call, OpSpec
from conformance.protocol import FUSED_OPS
from golden.catalogue import DTYPES


def _weighted(values: Sequence[Any], weights: Sequence[float]) -> Callable[[random.Random], Any]:
    return lambda rng: rng.choices(values, weights)[0]


def _size(small: int, medium: int, large: int) -> Callable[[random.Random], int]:
    """Mostly ``1..small``, sometimes up to ``medium``, rarely up to ``large``."""
    def draw(rng: random.Random) -> int:
        top = rng.choices((small, medium, large), (80, 16, 4))[0]
        return rng.randint(1, top)
    return draw


def smaller_ints(value: int) -> list[int]:
    """Smaller values, simplest first: 1, then ``value`` minus halving steps (odd and even steps, so parity is kept)."""
    steps: set[int] = set()
    step = value - 1
    while step >= 1:
        steps.update((step, step - 1) if step > 1 else (step,))
        step //= 2
    return sorted({value - s for s in steps if 0 < value - s < value})


def _towards(*simplest: Any) -> Callable[[Any], list[Any]]:
    """A value's simpler ones: those of ``simplest`` (in order) listed before it."""
    return lambda value: list(simplest[:simplest.index(value)]) if value in simplest else list(simplest)


@dataclass(frozen=True)
class Dimension:
    """One field of a spec or a call: how it is drawn, its simpler values, how a report buckets it."""

    name: str
    draw: Callable[[random.Random], Any]
    simpler: Callable[[Any], list[Any]]
    bucket: Callable[[Any], str] = str


def _size_bucket(value: int) -> str:
    return next(f"<={top}" for top in (16, 128, 1024, 1 << 62) if value <= top).replace(str(1 << 62), "inf")


#: Fields of the spec.  ``tp`` weights favour 2 and 4, with 1 and 3 drawn too (sizes the fixed suite lacks).
SPEC_DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("op", _weighted(FUSED_OPS, (1,) * len(FUSED_OPS)), lambda op: []),
    Dimension("tp", _weighted((1, 2, 3, 4), (1, 5, 2, 4)), lambda tp: [t for t in (1, 2, 3, 4) if t < tp]),
    Dimension("replicas", _weighted((1, 2), (4, 1)), lambda r: [1] if r > 1 else []),
    Dimension("layout", _weighted(GROUP_LAYOUTS, (1, 1)), _towards(*GROUP_LAYOUTS)),
    Dimension("transpose_weight", _weighted((False, True), (1, 1)), _towards(False, True)),
    Dimension("runs", _weighted((1, 2), (5, 1)), lambda r: [1] if r > 1 else []),
    Dimension("straggler_s", _weighted((0.0, 0.002), (6, 1)), lambda s: [0.0] if s else []),
)
#: Fields of each call.
CALL_DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("m", _size(48, 400, 2400), smaller_ints, _size_bucket),
    Dimension("k", _size(80, 320, 1024), smaller_ints, _size_bucket),
    Dimension("n", _size(80, 320, 1024), smaller_ints, _size_bucket),
    Dimension("dtype", _weighted(DTYPES, (1,) * len(DTYPES)), _towards(*DTYPES)),
    Dimension("bias", _weighted((False, True), (1, 1)), _towards(False, True)),
)
#: How many calls a case makes back to back, and how often a call repeats the last one's shape (new data).
CALLS = _weighted((1, 2, 3, 4, 5), (4, 2, 2, 1, 1))
REPEAT_SHAPE = 0.5
#: The largest world a drawn case uses: pools of 1 to 4 ranks stay warm together (10 ranks); TP 8 is the fixed
#: suite's, where a pool of 8 would evict the others at every draw.
MAX_WORLD = 4


def fit(spec: OpSpec, up: bool) -> OpSpec:
    """``spec`` with every size the op splits over the TP ranks rounded to a multiple of ``tp`` (up or down)."""
    def rounded(value: int) -> int:
        return max(spec.tp, -(-value // spec.tp) * spec.tp if up else value // spec.tp * spec.tp)

    calls = []
    for call in spec.calls:
        sizes: dict[str, Any] = {name: rounded(getattr(call, name)) for name in spec.split_sizes}
        calls.append(replace(call, **sizes))
    layout = spec.layout if spec.replicas > 1 else GROUP_LAYOUTS[0]
    return replace(spec, calls=tuple(calls), layout=layout)


def draw(rng: random.Random, ops: Sequence[str] = FUSED_OPS) -> OpSpec:
    """One case from the space (only ``ops``), valid by construction."""
    values = {d.name: d.draw(rng) for d in SPEC_DIMENSIONS}
    values["op"] = values["op"] if values["op"] in ops else rng.choice(tuple(ops))
    while values["tp"] * values["replicas"] > MAX_WORLD:
        values["replicas"] = 1
    calls: list[Call] = []
    for _ in range(CALLS(rng)):
        seed = rng.randrange(1 << 16)
        if calls and rng.random() < REPEAT_SHAPE:
            calls.append(replace(calls[-1], seed=seed))
        else:
            calls.append(Call(**{d.name: d.draw(rng) for d in CALL_DIMENSIONS}, seed=seed))
    return fit(OpSpec(calls=tuple(calls), **values), up=True)


def neighbours(spec: OpSpec) -> Iterator[OpSpec]:
    """Every valid one-step-simpler spec: a call fewer, or one dimension of the spec, of the calls sharing a value,
    or of one call simpler."""
    seen = {spec}
    for candidate in _steps(spec):
        candidate = fit(candidate, up=False)
        if candidate not in seen and not candidate.invalid():
            seen.add(candidate)
            yield candidate


def _steps(spec: OpSpec) -> Iterable[OpSpec]:
    for i in range(len(spec.calls)):
        if len(spec.calls) > 1:
            yield replace(spec, calls=spec.calls[:i] + spec.calls[i + 1:])
    for d in SPEC_DIMENSIONS:
        for value in d.simpler(getattr(spec, d.name)):
            yield replace(spec, **{d.name: value})
    for d in CALL_DIMENSIONS:  # a value several calls share, simpler in all of them (keeps a repeated shape)
        shared = Counter(getattr(c, d.name) for c in spec.calls)
        for value in (v for v, count in shared.items() if count > 1):
            for simpler in d.simpler(value):
                yield replace(spec, calls=tuple(replace(c, **{d.name: simpler}) if getattr(c, d.name) == value else c
                                                for c in spec.calls))
    for i, call in enumerate(spec.calls):
        for d in CALL_DIMENSIONS:
            for value in d.simpler(getattr(call, d.name)):
                yield replace(spec, calls=spec.calls[:i] + (replace(call, **{d.name: value}),) + spec.calls[i + 1:])


def tags(spec: OpSpec) -> list[str]:
    """``dimension=bucket`` of each dimension of ``spec`` (the explored counts per dimension)."""
    found = [f"{d.name}={d.bucket(getattr(spec, d.name))}" for d in SPEC_DIMENSIONS]
    found.append(f"calls={len(spec.calls)}")
    for call in spec.calls:
        found.extend(f"{d.name}={d.bucket(getattr(call, d.name))}" for d in CALL_DIMENSIONS)
    return found

