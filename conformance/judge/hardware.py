"""Hardware profiles: which perf gates hold on which machine (``docs/DESIGN.md#perf-gates``).

A profile (``conformance/profiles/<name>.json``) names the hardware it is for
(device kind, a pattern of the device's name, collective backend, TP sizes),
the measurement settings, and its cases: a matmul + collective pipeline per
case with the minimum gain each CoC variant must exceed there.  Gates are
data, so a new machine gets gates by adding a file, not code.

Cases are written either directly (``cases``: op and per-rank shape) or as
the TP linear layers of real models (``models`` x ``layers``), expanded by
:func:`layer_pipeline` into the one pipeline CoC overlaps in each layer
(``docs/DESIGN.md#layouts``):

=============  ======================  =========================================
layer, mode    overlapped pipeline     per-rank matmul ``[m, k] @ [k, n]``
=============  ======================  =========================================
column, no SP  backward ``dx`` +       ``m = seq, k = out/tp, n = in``
               all-reduce
column, SP     all-gather + forward    ``m = seq (gathered), k = in, n = out/tp``
row, no SP     forward + all-reduce    ``m = seq, k = in/tp, n = out``
row, SP        forward +               ``m = seq, k = in/tp, n = out``
               reduce-scatter
=============  ======================  =========================================

QKV and fc1 are column-parallel, proj and fc2 row-parallel; QKV's width is
``(heads + 2*kv_heads) * head_dim``, a gated MLP's fc1 is twice ``ffn``.

Schema 1::

    {"schema": 1, "name": ..., "description": ...,
     "match": {"device": "npu"|"cuda"|"cpu"|"any", "name": REGEX, "backend": ..., "tp": [8]},
     "large": bool,                       # shapes too big for a CPU run
     "enforce": bool,                     # default true; false: gates report only
     "dtype": "float16", "protocol": {"warmup": 5, "repeats": 20},
     "cases": [{"id", "op", "m", "k", "n", "tp"?: [..], "gates": {VARIANT: MIN_GAIN|null},
                "source"?}],
     "models"?: {NAME: {"hidden", "ffn", "heads", "kv_heads", "seq", "gated", ...}},
     "layers"?: {"names": [...], "sequence_parallel": [...], "gates": {...}, "source"?}}

A profile runs only where its identity matches (:func:`why_not_here`).  The
one for ``"device": "any"`` (``unprofiled``) measures, never gates, on a node
no other profile names, so such a node still reports its gains as figures.

Variants: ``fused`` (the implementation's op), ``scripted-P`` (P chunks),
``auto`` (``--coc-parallel-num auto``).  A gate passes when the measured gain
*exceeds* its minimum; ``null`` reports the figures without a gate.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from coc_shared.json_file import read_json
from coc_shared.timeline import Order

PROFILE_DIR = Path(__file__).resolve().parents[1] / "profiles"
SCHEMA = 1
#: The fused ops a perf case can time, each one matmul + collective pipeline.
PROFILE_OPS = ("matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul")
PROFILE_LAYERS = {"qkv": "column", "fc1": "column", "proj": "row", "fc2": "row"}
DTYPE_SIZES = {"float16": 2, "bfloat16": 2, "float32": 4}
#: ``match.device`` of a profile for any node that no other profile matches (figures only, never gated).
ANY_DEVICE = "any"
_VARIANT = re.compile(r"^(fused|auto|scripted-(2|4|8))$")


class ProfileError(ValueError):
    """A profile file is malformed (names the file and the key)."""


@dataclass(frozen=True)
class Match:
    """The hardware a profile is for."""

    device: str
    name: str = ""  # regular expression searched in the device name, case-insensitive
    backend: str | None = None
    tp: tuple[int, ...] = ()

    @property
    def anywhere(self) -> bool:
        """A figures-only profile for nodes no other profile is for (``"device": "any"``)."""
        return self.device == ANY_DEVICE

    def matches(self, device: str, name: str, tp: int, backend: str | None = None) -> bool:
        return (
            (device == self.device or self.anywhere)
            and re.search(self.name, name, re.IGNORECASE) is not None
            and (self.backend is None or backend is None or backend == self.backend)
            and tp in self.tp
        )

    def mismatch(self, device: str, name: str, tp: int, backend: str | None = None) -> str:
        """Why this machine is not the profile's (empty when it is)."""
        wanted = [(device == self.device or self.anywhere, f"device {self.device}"),
                  (re.search(self.name, name, re.IGNORECASE) is not None, f"name ~ {self.name!r}"),
                  (self.backend is None or backend is None or backend == self.backend,
                   f"backend {self.backend}"),
                  (tp in self.tp, f"TP in {list(self.tp)}")]
        missed = [what for ok, what in wanted if not ok]
        if not missed:
            return ""
        return f"needs {', '.join(missed)}; this is {device} {name!r} ({backend}), TP {tp}"


@dataclass(frozen=True)
class PerfCase:
    """One matmul + collective pipeline at one TP size, with its gates."""

    profile: str
    id: str
    op: str
    m: int  # matmul rows on a rank (after the all-gather, before the reduce-scatter)
    k: int
    n: int
    tp: int
    dtype: str
    gates: Mapping[str, float | None]
    source: str = ""
    large: bool = False

    @property
    def name(self) -> str:
        return f"{self.profile}/{self.id}-tp{self.tp}"

    @property
    def order(self) -> Order:
        """Lane order of the pipeline model: the all-gather precedes its matmul."""
        return "comm_first" if self.op == "all_gather_matmul" else "compute_first"

    def shape(self) -> dict[str, Any]:
        return {"op": self.op, "m": self.m, "k": self.k, "n": self.n, "dtype": self.dtype}


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    match: Match
    dtype: str
    warmup: int
    repeats: int
    large: bool
    cases: tuple[PerfCase, ...] = field(default=())
    #: False: even on matching hardware the gates only report (noisy shared machines).
    enforce: bool = True


def layer_pipeline(model: Mapping[str, Any], layer: str, sequence_parallel: bool,
                   tp: int) -> tuple[str, int, int, int]:
    """``(op, m, k, n)`` of the pipeline CoC overlaps in ``layer`` of ``model`` (module table)."""
    h, seq = model["hidden"], model["seq"]
    head_dim = h // model["heads"]
    width = {
        "qkv": (h, (model["heads"] + 2 * model["kv_heads"]) * head_dim),
        "proj": (h, h),
        "fc1": (h, model["ffn"] * (2 if model.get("gated") else 1)),
        "fc2": (model["ffn"], h),
    }
    if layer not in width:
        raise ProfileError(f"unknown layer {layer!r}; known: {sorted(width)}")
    fan_in, fan_out = width[layer]
    if PROFILE_LAYERS[layer] == "column":
        if sequence_parallel:
            return "all_gather_matmul", seq, fan_in, fan_out // tp
        return "matmul_all_reduce", seq, fan_out // tp, fan_in
    op = "matmul_reduce_scatter" if sequence_parallel else "matmul_all_reduce"
    return op, seq, fan_in // tp, fan_out


def parse(doc: Mapping[str, Any], where: str = "profile") -> Profile:
    """A validated :class:`Profile`; any defect raises :class:`ProfileError` naming ``where``."""

    def need(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], at: str) -> Any:
        if key not in obj or not isinstance(obj[key], kind) or isinstance(obj[key], bool) and kind is int:
            raise ProfileError(f"{where}: {at}{key!r} must be {getattr(kind, '__name__', kind)}")
        return obj[key]

    if doc.get("schema") != SCHEMA:
        raise ProfileError(f"{where}: schema must be {SCHEMA}, got {doc.get('schema')!r}")
    name = need(doc, "name", str, "")
    raw_match = need(doc, "match", dict, "")
    tps = tuple(need(raw_match, "tp", list, "match."))
    match = Match(need(raw_match, "device", str, "match."), raw_match.get("name", ""),
                  raw_match.get("backend"), tps)
    dtype = need(doc, "dtype", str, "")
    if dtype not in DTYPE_SIZES:
        raise ProfileError(f"{where}: dtype must be one of {sorted(DTYPE_SIZES)}, got {dtype!r}")
    protocol = doc.get("protocol", {})
    large = bool(doc.get("large", False))

    def case(case_id: str, op: str, m: int, k: int, n: int, tp: int, gates: Mapping[str, Any],
             source: str) -> PerfCase:
        if op not in PROFILE_OPS:
            raise ProfileError(f"{where}: case {case_id!r}: op must be one of {list(PROFILE_OPS)}, got {op!r}")
        for variant, minimum in gates.items():
            if not _VARIANT.match(variant):
                raise ProfileError(f"{where}: case {case_id!r}: unknown variant {variant!r}")
            if minimum is not None and (isinstance(minimum, bool) or not isinstance(minimum, (int, float))):
                raise ProfileError(f"{where}: case {case_id!r}: gate {variant!r} must be a number or null")
        if min(m, k, n) < 1 or (op != "matmul_all_reduce" and m % tp):
            raise ProfileError(f"{where}: case {case_id!r}: shape m={m}, k={k}, n={n} does not fit TP {tp}")
        return PerfCase(name, case_id, op, m, k, n, tp, dtype, dict(gates), source, large)

    cases: list[PerfCase] = []
    for raw in doc.get("cases", []):
        for tp in raw.get("tp", tps):
            cases.append(case(need(raw, "id", str, "case "), need(raw, "op", str, "case "),
                              need(raw, "m", int, "case "), need(raw, "k", int, "case "),
                              need(raw, "n", int, "case "), tp, need(raw, "gates", dict, "case "),
                              raw.get("source", "")))
    layers = doc.get("layers")
    for model_name, model in doc.get("models", {}).items():
        if layers is None:
            raise ProfileError(f"{where}: 'models' needs a 'layers' section")
        for layer in layers["names"]:
            for sp in layers["sequence_parallel"]:
                for tp in tps:
                    op, m, k, n = layer_pipeline(model, layer, sp, tp)
                    case_id = f"{model_name}-{layer}-{'sp' if sp else 'nosp'}"
                    source = "; ".join(s for s in (model.get("anchor", ""), layers.get("source", "")) if s)
                    cases.append(case(case_id, op, m, k, n, tp, layers["gates"], source))
    return Profile(name, doc.get("description", ""), match, dtype, int(protocol.get("warmup", 2)),
                   int(protocol.get("repeats", 8)), large, tuple(cases), bool(doc.get("enforce", True)))


def load(path: str | Path) -> Profile:
    path = Path(path)
    return parse(read_json(path, ProfileError, "profile"), where=str(path.name))


@cache
def shipped() -> tuple[Profile, ...]:
    """The profiles in ``conformance/profiles``, by name."""
    return tuple(load(p) for p in sorted(PROFILE_DIR.glob("*.json")))


def by_name(name: str, profiles: Iterable[Profile] | None = None) -> Profile:
    for profile in shipped() if profiles is None else profiles:
        if profile.name == name:
            return profile
    raise KeyError(f"no hardware profile named {name!r}")


def matching_profile(device: str, name: str, tp: int, backend: str | None = None,
           profiles: Sequence[Profile] | None = None) -> Profile | None:
    """The profile naming this hardware (device kind, device name, backend, TP), if any; the figures-only
    profile for any device names none."""
    for profile in shipped() if profiles is None else profiles:
        if not profile.match.anywhere and profile.match.matches(device, name, tp, backend):
            return profile
    return None


def why_not_here(profile: Profile, identity: Mapping[str, Any], tp: int,
                 profiles: Sequence[Profile] | None = None) -> str:
    """Why ``profile``'s case at ``tp`` does not run on the node ``identity`` (device, name, backend)
    describes; empty when it runs (``docs/DESIGN.md#profiles-by-identity``).

    A profile runs only where its identity matches.  The figures-only profile
    (``"device": "any"``) runs only on a node that no other profile names at
    any TP, so a node with a profile of its own is never measured twice.
    """
    mismatch = profile.match.mismatch(identity["device"], identity["name"], tp, identity.get("backend"))
    if mismatch:
        return f"profile {profile.name} is not this node's: {mismatch}"
    if profile.match.anywhere:
        owner = node_profile(identity, profiles)
        if owner is not None:
            return f"profile {profile.name} is for nodes without a profile, and this node has {owner.name}"
    return ""


def node_profile(identity: Mapping[str, Any], profiles: Sequence[Profile] | None = None) -> Profile | None:
    """The profile naming this node's device (at any of its TP sizes), if any; figures-only ones aside."""
    for profile in shipped() if profiles is None else profiles:
        if not profile.match.anywhere and any(
                profile.match.matches(identity["device"], identity["name"], tp, identity.get("backend"))
                for tp in profile.match.tp):
            return profile
    return None
