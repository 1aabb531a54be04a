"""The corpus: minimal cases kept as spec files, replayed by every tier and explored from first.

A finding the explorer wrote (``--coc-explore-dir``) is a spec file; a corpus
is a directory of such files, in the same form (``conformance/explore/finding.py``).
The suite ships one (``conformance/corpus/``: the minimal case of every fault
only the explorer finds, and the boundary values of every configuration
setting), and a repository keeps its own
(``coc-corpus add``, :mod:`conformance.explore.corpus_cli`).  Every spec of
both is replayed as a case ``test_corpus[<kind>-<hash>]`` and judged by
:func:`replay`, the function ``--coc-replay`` judges with too, through its
kind's own judging sequence -- the explorer's -- so a finding, once kept,
fails every later run of the tier it is replayed in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from conformance.explore.finding import kept, load_finding, write
from conformance.explore.kind import Ranks, Scope
from conformance.explore.registry import kind_of
from conformance.explore.spec import Spec, SpecError, spec_key
from conformance.record.verdicts import NotOffered, Verdicts

#: The corpus the package ships (package data).
SHIPPED = Path(__file__).resolve().parent.parent / "corpus"


@dataclass(frozen=True)
class Entry:
    """One spec file of a corpus: its spec and the whole document."""

    path: Path
    spec: Spec
    doc: Mapping[str, Any]

    @property
    def case_id(self) -> str:
        """Its id among the corpus cases: ``<kind>-<hash of the spec>``."""
        return f"{kind_of(self.spec).name}-{spec_key(self.spec)}"

    @property
    def key(self) -> tuple[str, str, str]:
        """What makes it new: (kind, check, minimal spec)."""
        return kind_of(self.spec).name, str(self.doc.get("check", "")), json.dumps(self.spec.as_dict(),
                                                                                  sort_keys=True)


def read_entry(path: Path) -> Entry:
    """The entry of one spec file; a :class:`SpecError` naming the file when it is not one."""
    try:
        spec, doc = load_finding(path)
    except SpecError as exc:
        raise SpecError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None
    return Entry(path, spec, doc)


def read_corpus(directories: Iterable[Path]) -> list[Entry]:
    """Every spec file (``*.json``) of ``directories``, in order, each spec once (its first file kept)."""
    entries: dict[str, Entry] = {}
    for directory in directories:
        if not Path(directory).is_dir():
            raise SpecError(f"{directory}: no such corpus directory")
        for path in sorted(Path(directory).glob("*.json")):
            entry = read_entry(path)
            entries.setdefault(entry.case_id, entry)
    return list(entries.values())


def replay(ranks: Ranks, spec: Spec, scope: Scope, verdicts: Verdicts) -> str:
    """Judge ``spec`` as the explorer judges it, into ``verdicts``; why it was not judged ("" when it was).

    A kind, or a mode of it, the implementation does not offer raises
    :class:`~conformance.record.verdicts.NotOffered` (after recording what the
    rest of the case judged: a failure recorded stays one); a case out of
    this run's reach (more ranks than the node hosts, a TP size ``--coc-tp``
    leaves out) is not run either.
    """
    kind = kind_of(spec)
    why = kind.offered(scope)
    if why:
        raise NotOffered(f"not offered: {why}")
    why = scope.outside(spec)
    if why:
        return f"out of reach: {why}"
    judged = kind.judge(ranks, spec, scope, verdicts)
    subject = kind.subject(spec)  # named as the explorer names them: what each check is about
    verdicts.results[:] = [replace(r, name=f"{subject}: {r.name}") if subject else r for r in verdicts.results]
    if judged.not_offered:
        raise NotOffered(f"not offered: {', '.join(sorted(judged.not_offered))} ({judged.skipped})")
    return judged.skipped


def corpus_file_name(entry: Entry) -> str:
    """The file name of ``entry`` in a corpus: its case id and what it fails."""
    check = "".join(c if c.isalnum() else "-" for c in str(entry.doc.get("check", "")).lower()).strip("-")
    return f"{entry.case_id}{'-' + check[:40].strip('-') if check else ''}.json"


@dataclass(frozen=True)
class Added:
    """What ``coc-corpus add`` did: the files written, and the findings the corpus already held."""

    written: tuple[Path, ...]
    known: tuple[Path, ...]


def add_findings(findings: Iterable[Path], corpus: Path) -> Added:
    """Copy each finding new to ``corpus`` by (kind, check, minimal spec) into it, with its provenance
    (:func:`~conformance.explore.finding.kept`)."""
    corpus.mkdir(parents=True, exist_ok=True)
    held = {read_entry(path).key for path in sorted(corpus.glob("*.json"))}
    written, known = [], []
    for path in findings:
        entry = read_entry(Path(path))
        if entry.key in held:
            known.append(Path(path))
            continue
        held.add(entry.key)
        written.append(write(corpus / corpus_file_name(entry), kept(entry.doc, entry.path.name)))
    return Added(tuple(written), tuple(known))
