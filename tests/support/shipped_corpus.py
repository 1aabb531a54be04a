"""What the shipped corpus (``conformance/corpus/``) holds, built with the kinds' own spec classes.

* the minimal case of every explorer-only fault (:data:`FAULT_CASES`, one per
  row of :data:`tests.support.explorer_faults.EXPLORER_FAULTS`): the case its
  shrink ends on, every one-step-simpler neighbour passing (the row layer's
  and the w8A16 cases are what explorations of their faults shrank bigger
  cases to; an exploration of each fault given its case alone as the corpus
  finds it minimal in 0 steps);
* the boundary values of every configuration setting (:data:`BOUNDARIES`):
  chunk counts 0, -1, 1, the largest (8), beyond it (9, 16), between (3),
  words and empty, ``auto``; TP sizes 0, 1 and 8; the fused kernel at the
  chunk counts' ends; each incompatible model setting; ``customized_coc``
  counts 0, 3 and 16 and a malformed key; layers at chunk counts 1 and 8 (8
  leaving a rank fewer rows than chunks);
* the cases a correct implementation once failed through a flaw of the
  suite's own (:data:`SUITE_FLAWS`), so that the flaw stays fixed.

``python -m tests.support.shipped_corpus`` rewrites the directory from these;
``tests/unit/test_corpus_parts.py`` holds the directory to them, and
``tests/suite_runs/test_corpus_runs.py`` proves each fault fails its case and
the reference passes them all.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from conformance.contract.config_rules import INCOMPATIBLE
from conformance.explore import finding
from conformance.explore.config_settings import ConfigSpec
from conformance.explore.corpus import SHIPPED, corpus_file_name, read_entry
from conformance.explore.finding import Provenance, document
from conformance.explore.layer_training import LayerSpec
from conformance.explore.op_spec import Call, OpSpec
from conformance.explore.quant_calls import NUMBERS, QuantSpec
from conformance.explore.spec import Spec

#: Explorer-only fault -> its minimal case.
FAULT_CASES: dict[str, Spec] = {
    "LongOddRowsTail": OpSpec((Call(1001, 1, 1, bias=False),), tp=1),
    "UnalignedKBias": OpSpec((Call(1, 1, 1),), tp=1),
    "ThirdCallOfAShape": OpSpec((Call(1, 1, 1, bias=False),) * 3, tp=1),
    "WrongAtTp3": OpSpec((Call(1, 3, 1, bias=False),), tp=3),
    "SlicedOddKReadsContiguous": OpSpec((Call(2, 1, 1, bias=False),), tp=1, strides="sliced"),
    "ScatterOutputReusedByAllReduce": OpSpec((Call(1, 1, 1, bias=False, op="matmul_reduce_scatter"),
                                              Call(1, 1, 1, bias=False)), tp=1),
    "ClampsChunkCountBelowOne": ConfigSpec(chunks="0"),
    "RowOutputSizedByFirstCall": LayerSpec("row", False, 2, 2, 1, (2, 4), chunks=2),
    "ScaleCacheOfFourGroups": QuantSpec(1, 160, 1, 1, offset=True, bias=False),
}

#: The boundary values of every configuration setting, and what each guards.
BOUNDARIES: tuple[tuple[Spec, str], ...] = (
    *((ConfigSpec(chunks=c), f"chunk count {c!r}")
      for c in ("0", "-1", "1", "8", "9", "16", "3", "", "many", "auto")),
    *((ConfigSpec(tp_size=tp), f"TP size {tp}") for tp in (0, 1, 8)),
    *((ConfigSpec(chunks=c, fused=True), f"the fused kernel at chunk count {c}") for c in ("1", "8")),
    *((ConfigSpec(incompatible=name), f"the incompatible setting {name}") for name in INCOMPATIBLE),
    *((ConfigSpec(customized=name), f"customized_coc {name}") for name in ("count-0", "count-3", "count-16",
                                                                             "key-two")),
    (LayerSpec("column", True, 2, 8, 8, (8,), chunks=1), "a layer at chunk count 1"),
    (LayerSpec("row", True, 2, 8, 8, (8,), chunks=8), "a layer at chunk count 8, fewer rows a rank than chunks"),
)

#: Cases a correct implementation once failed through a flaw of the suite's own (kept so it stays fixed).
SUITE_FLAWS: tuple[tuple[Spec, str], ...] = (
    (OpSpec((Call(842, 9, 347, dtype="bfloat16", seed=42144),), tp=3),
     "the reference 1.01 times its error bound, whose R left out the roundings of summing TP partials in "
     "bfloat16 (a 600 s exploration, seed 0)"),
)


def _document(spec: Spec, check: str, origin: str, implementation: str) -> dict[str, Any]:
    return document(spec, Provenance(None, "2026-11-26", implementation, origin), check=check)


def documents() -> list[dict[str, Any]]:
    """Every shipped corpus file's content."""
    from tests.support.explorer_faults import EXPLORER_FAULTS

    checks = {row.fault: row.check for row in EXPLORER_FAULTS}
    assert checks["ScaleCacheOfFourGroups"] == NUMBERS
    found = [_document(FAULT_CASES[fault], check, "the minimal case of an explorer-only fault",
                       f"tests.support.faulty_impls:{fault}") for fault, check in checks.items()]
    return found + [_document(spec, "", f"boundary: {what}", "") for spec, what in BOUNDARIES
                    if spec not in FAULT_CASES.values()] + [  # chunk count 0 is a fault's case too
        _document(spec, "", f"a flaw of the suite: {what}", "coc_impl.reference:ReferenceCoC")
        for spec, what in SUITE_FLAWS]


def write(directory: Path = SHIPPED) -> list[Path]:
    """Rewrite ``directory`` from :func:`documents`; the files."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.json"):
        old.unlink()
    written = []
    for doc in documents():
        path = finding.write(directory / "new.json", doc)
        target = directory / corpus_file_name(read_entry(path))
        path.rename(target)
        written.append(target)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else SHIPPED):
        print(path)
