"""The judging of a w8A16 ``matmul_all_reduce``: its numbers against the dequantised float64 truth, or its refusal
of an invalid argument.

The fixed suite (``conformance/suite/test_ops.py``) and the explorer
(``conformance/explore/quant_calls.py``) both judge with these functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conformance.contract.jobs import QuantRun
from conformance.contract.layouts import OPERAND_SPLITS
from conformance.contract.results import OpCallResults
from conformance.judge import checks, numerics
from conformance.judge import ops as judge
from conformance.judge.assembly import assemble, copies
from conformance.protocol import Declarations
from conformance.record.evidence import CaseEvidence
from conformance.record.failures import WrongError
from conformance.record.levels import Level
from conformance.record.verdicts import Verdicts

#: What each refusal's message must name.
BAD_QUANT_NAMES = {"scale-shape": "scale", "offset-shape": "offset", "offset-without-scale": "offset",
                   "group-not-multiple-of-32": "group", "group-rows-wrong": "scale|group",
                   "group-not-below-k": "group", "float32-activations": "float32|dtype|x",
                   "int8-without-scale": "scale|int8"}


#: A w8A16 run's global inputs (the present ones), its group size (0: none) and its activation dtype, as
#: ``conformance.cases.quant_cases.quant_inputs`` gives them.
QuantInputs = tuple[Mapping[str, Any], int, Any]


def quant_truth(quant: QuantInputs) -> Any:
    """The float64 ``y`` of the inputs with the dequantised weight (every rank holds all of it)."""
    from golden import serial

    inputs, group_size, _ = quant
    t = {name: v.double() for name, v in inputs.items()}
    return serial.quant_matmul_all_reduce(t["x"], t["w"], t["scale"], t.get("offset"), t.get("bias"),
                                          group_size or None).numpy()


def check_w8a16(outcomes: Sequence[OpCallResults], run: QuantRun, quant: QuantInputs, y: Any, *,
                evidence: CaseEvidence) -> None:
    """MUST: every rank's w8A16 result within the bound of the float64 ``y`` of the dequantised weight."""
    from golden import serial

    errors = [o.error for o in outcomes]
    checks.require_offered(errors)
    raised = [(r, e) for r, e in enumerate(errors) if e is not None]
    if raised:
        raise WrongError(f"rank(s) {[r for r, _ in raised]} raised {raised[0][1].describe()}")
    inputs, group_size, dtype = quant
    f64 = {name: t.double() for name, t in inputs.items()}
    wf = serial.dequantize(f64["w"], f64["scale"], f64.get("offset"), group_size or None).numpy()
    bias = f64.get("bias")
    envelope = (numerics.magnitude(f64["x"].numpy(), wf) + (0 if bias is None else np.abs(bias.numpy())),
                wf.shape[0])
    split = OPERAND_SPLITS["matmul_all_reduce"]["y"]
    serial_y = assemble([o.serial for o in outcomes], split)
    for holders, out in copies([o.results[0] for o in outcomes], split):
        # The dequantised weight is rounded to the activation dtype once more.
        checks.check_close(", ".join(filter(None, ("y", holders))), out, y, serial_y, envelope, dtype,
                           roundings=judge.roundings(run.tp) + 1, evidence=evidence)


def judge_bad_argument(verdicts: Verdicts, outcomes: Sequence[OpCallResults], change: str,
                       declared: Declarations) -> None:
    """An invalid w8A16 argument (``change``): refused on every rank naming it (MUST), the declared error (SHOULD)."""
    errors = [o.error for o in outcomes]
    with verdicts.check("refused, naming the argument", Level.MUST):
        checks.check_refused_on_every_rank(errors, what=f"w8A16 {change}", patterns=[BAD_QUANT_NAMES[change]])
    if errors[0] is not None:
        with verdicts.check("declared error type", Level.SHOULD):
            checks.check_declared_error(errors[0], declared.error_type("argument"), kind="argument",
                                        what=f"w8A16 {change}")
