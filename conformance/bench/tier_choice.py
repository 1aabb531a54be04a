"""``python -m conformance.bench tiers``: the smoke tier chosen by what it catches, and written with its kill table.

The per-change tier is worth what it catches per second.  This command runs
(:mod:`conformance.bench.kill_runs`, keeping every run so that a later call
runs only what changed) the reference on every candidate case, for its cost,
and each fault of the proof table on the whole of its suite module, for the
cases that catch it: a case *catches* a row when its record alone shows what
the row asks (the row's ``shown_by``: its check at its level came out as the
row says, the case failed where the row fails, no MUST failed where it must
hold).  It then picks the cheapest set of cases that holds

* for every row of the proof table, a case that catches it (every level: the
  smoke tier gates them all);
* every check name (its case's label dropped: ``m=13: numerics`` is
  ``numerics``) of each module at each level, at the largest TP it is
  recorded at;
* every op and layer kind at its largest TP;
* every test of the suite, once;

besides the whole corpus, which the tier always holds.  The choice is a
greedy weighted set cover (each step takes the case with the most uncovered
requirements per second, then cases made redundant by later picks are
dropped, dearest first): within ``ln n`` of the cheapest, and cheap.  A
requirement no case meets (a row its fault never shows on its whole module)
stops the command.  The result, the tier's cases with their costs and, per
row, the tier's cases that catch it, goes to ``conformance/smoke_tier.json``
(:mod:`conformance.tiers` reads it); the tests prove each row on exactly
those cases.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from conformance.bench import fault_sources, kill_runs
from conformance.bench.kill_runs import CORPUS_MODULE, JUDGED, ROOT, Candidate, RunStore, SuiteRuns
from conformance.caseids import matches
from conformance.options import DEFAULT_IMPL
from conformance.tiers import CORPUS, FUSED_GOLDENS, TIER_FILE


class ProofRow(Protocol):
    """What the command reads of a row of the proof table (``tests/support/proofs.py``)."""

    module: str
    fault: str
    node: str  #: ``cpu``, where the kill runs run; a row of another node is proved there, on the tier's held cases

    @property
    def key(self) -> str: ...

    def shown_by(self, cases: list[dict[str, Any]]) -> list[str]: ...


def check_name(name: str) -> str:
    """A recorded check's name without its case's label (``m=13 (13 rows per rank), 8 chunks: numerics``)."""
    return name.rsplit(": ", 1)[-1]


def kills(rows: Sequence[ProofRow], store: RunStore, judged: set[str]) -> dict[str, list[str]]:
    """Row key -> the judged cases of its module whose record alone shows the row."""
    found: dict[str, list[str]] = {}
    for row in rows:
        records = store.records(row.module, row.fault)
        found[row.key] = [case for case, record in records.items()
                          if case in judged and not row.shown_by([record])]
    return found


def requirements(candidates: Sequence[Candidate], store: RunStore,
                 caught: Mapping[str, Sequence[str]]) -> dict[str, set[str]]:
    """Case id -> the requirements it meets (see the module's docstring)."""
    met: dict[str, set[str]] = defaultdict(set)
    names = {c.id: {(level, check_name(name)) for level, name in store.reference[c.id]["checks"]}
             for c in candidates}
    largest_check: dict[tuple[str, str, str], int] = {}
    largest_kind: dict[str, int] = {}
    for c in candidates:
        for level, name in names[c.id]:
            largest_check[c.module, level, name] = max(largest_check.get((c.module, level, name), 0), c.tp)
        if c.kind:
            largest_kind[c.kind] = max(largest_kind.get(c.kind, 0), c.tp)
    for c in candidates:
        met[c.id].add(f"test {c.test}")
        met[c.id] |= {f"check {c.module} {level} {name!r} at TP {c.tp}" for level, name in names[c.id]
                      if largest_check[c.module, level, name] == c.tp}
        if c.kind and largest_kind[c.kind] == c.tp:
            met[c.id].add(f"kind {c.kind} at TP {c.tp}")
    for key, cases in caught.items():
        for case in cases:
            met[case].add(f"catches {key}")
    return dict(met)


def cheapest_cover(meets: Mapping[str, set[str]], cost: Mapping[str, float], held: Sequence[str] = ()) -> list[str]:
    """A cheap set of cases meeting every requirement any case meets (greedy weighted set cover, then the picks a
    later pick made redundant dropped, dearest first), beside the ``held`` cases it starts from and keeps."""
    floor = 1e-3  # a case run in the test process costs milliseconds, not nothing
    wanted = set().union(*meets.values())
    chosen: list[str] = []
    for case in held:
        wanted -= meets.get(case, set())
    while wanted:
        best = min((c for c in meets if c not in chosen and meets[c] & wanted),
                   key=lambda c: (max(cost[c], floor) / len(meets[c] & wanted), c))
        chosen.append(best)
        wanted -= meets[best]
    for case in sorted(chosen, key=lambda c: (-cost[c], c)):
        others = [c for c in chosen if c != case]
        if meets[case] <= set().union(*(meets[c] for c in (*others, *held) if c in meets)):
            chosen = others
    return sorted({*chosen, *held})


def _load_proofs(spec: str) -> Any:
    fault_sources.faults_module(spec.rpartition(".")[0] or spec)  # the checkout on the path
    return importlib.import_module(spec)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.bench tiers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--proofs", default="tests.support.proofs",
                        help="module of the proof table (FAULT_TABLE, FAULTS, MODULE_OPTIONS)")
    parser.add_argument("--store", type=Path, default=ROOT / "reports" / "tiers" / "kill-runs.json",
                        help="the kept runs (read, and written after each run; not part of the tree)")
    parser.add_argument("--out", type=Path, default=TIER_FILE, help="where the tier goes")
    parser.add_argument("--rerun", nargs="*", default=(), metavar="WHAT",
                        help="run again: 'reference' (another cost sample), 'faults' (every fault), or fault names")
    parser.add_argument("--jobs", type=int, default=1, help="suite runs at once")
    parser.add_argument("--plan", action="store_true", help="say what would run, run nothing, write nothing")
    args = parser.parse_args(argv)

    proofs = _load_proofs(args.proofs)
    rows: list[ProofRow] = [row for row in proofs.FAULT_TABLE if row.node == "cpu"]
    faults = fault_sources.faults_module(proofs.FAULTS)
    options: Mapping[str, Sequence[str]] = proofs.MODULE_OPTIONS
    rerun = set(args.rerun)

    began = time.monotonic()
    collected = kill_runs.collect()
    candidates = [c for c in collected if c.module != CORPUS_MODULE]
    corpus = [c.id for c in collected if c.module == CORPUS_MODULE]
    store = RunStore(args.store)
    by_module: dict[str, list[str]] = defaultdict(list)
    for c in collected:
        by_module[c.module].append(c.id)
    for module, ids in by_module.items():
        if module != CORPUS_MODULE:
            store.align(module, ids)

    jobs: list[tuple[str, str, str, list[str]]] = []  # (what, impl, digest, cases)
    reference = store.reference_needed([c.id for c in collected], "reference" in rerun)
    if reference:
        jobs.append(("reference", "", "", reference))
    sources = fault_sources.module_sources(faults)
    for module, fault in dict.fromkeys((r.module, r.fault) for r in rows):
        digest = fault_sources.source_digest(sources, fault) + ":" + " ".join(options.get(module, ()))
        needed = store.fault_needed(module, fault, digest, bool(rerun & {"faults", fault}))
        if needed:
            jobs.append((f"{module}:{fault}", f"{proofs.FAULTS}:{fault}", digest, needed))
    print(f"{len(collected)} cases collected ({len(candidates)} candidates, {len(corpus)} corpus); "
          f"{len(jobs)} run(s) to make, {sum(len(j[3]) for j in jobs)} case runs")
    for what, _, _, cases in jobs:
        print(f"  {what}: {len(cases)} case(s)")
    if args.plan:
        return 0
    _run(jobs, store, options, by_module, args.jobs)
    spent = time.monotonic() - began

    judged = {c.id for c in collected if store.reference[c.id]["outcome"] in JUDGED}
    dropped = sorted({c.id for c in collected} - judged)
    caught = kills(rows, store, judged)
    uncaught = [key for key, cases in caught.items() if not cases]
    if uncaught:
        print("rows no case of their module catches (their fault or check is wrong):\n  " + "\n  ".join(uncaught))
        return 1
    chosen_from = [c for c in candidates if c.id in judged]
    meets = requirements(chosen_from, store, caught)
    cost = {c.id: store.cost(c.id) for c in collected}
    tier = cheapest_cover(meets, cost, [c.id for c in chosen_from if any(matches(c.id, p) for p in FUSED_GOLDENS)])
    held = set(tier) | set(corpus)
    written = {
        "about": "The smoke tier (-m smoke): written by `python -m conformance.bench tiers`, not by hand "
                 "(docs/DESIGN.md#tiers). cases: each with its cost in seconds (held rank-seconds and its "
                 "worker's time, the reference's median); kills: per row of the proof table, the tier's cases "
                 "that catch it.",
        "corpus": CORPUS,
        "cases": {case: round(cost[case], 3) for case in tier},
        "kills": {key: sorted(c for c in cases if c in held) for key, cases in caught.items()},
        "totals": {"cases": len(tier), "corpus": len(corpus), "cost_s": round(sum(cost[c] for c in held), 1),
                   "suite_cases": len(judged), "suite_cost_s": round(sum(cost[c] for c in judged), 1),
                   "tp8_cases": sum(1 for c in chosen_from if c.id in held and c.tp == 8),
                   "requirements": len(set().union(*meets.values()))},
    }
    args.out.write_text(json.dumps(written, indent=1) + "\n")
    _report(rows, caught, written, dropped, spent)
    return 0


def _run(jobs: Sequence[tuple[str, str, str, list[str]]], store: RunStore, options: Mapping[str, Sequence[str]],
         modules: Mapping[str, Sequence[str]], at_once: int) -> None:
    """Make the runs, keeping each in the store as it ends."""
    if not jobs:
        return
    from conformance.harness.launchers.devices import cpu
    from conformance.harness.launchers.rank_server_client import RankServer
    from conformance.launching import default_max_live_ranks

    server = RankServer(cpu(), max_live_ranks=default_max_live_ranks(8))
    try:
        with tempfile.TemporaryDirectory(prefix="coc-tier-leases-") as leases:
            runs = SuiteRuns(server.address, leases, jobs=at_once)
            for job, records in runs.each(
                    [(job[1] or DEFAULT_IMPL, kill_runs.targets(job[3], modules),
                      options.get(job[0].split(":", 1)[0], ()) if job[1] else ()) for job in jobs], jobs):
                what, _, digest, cases = job
                if what == "reference":
                    store.keep_reference(records)
                else:
                    module, fault = what.split(":", 1)
                    store.keep_fault(module, fault, digest, cases, records)
                store.save()
                print(f"  {time.strftime('%H:%M:%S')} {what}: {len(records)} case(s) recorded", flush=True)
    finally:
        server.close()


def _report(rows: Sequence[ProofRow], caught: Mapping[str, Sequence[str]], written: Mapping[str, Any],
            dropped: Sequence[str], spent: float) -> None:
    tier_kills = written["kills"]
    width = max(len(r.key) for r in rows)
    print(f"{'proof row':<{width}}  module  tier")
    for row in rows:
        print(f"{row.key:<{width}}  {len(caught[row.key]):>6}  {len(tier_kills[row.key]):>4}")
    totals = written["totals"]
    print(f"tier: {totals['cases']} cases and the corpus's {totals['corpus']}, {totals['tp8_cases']} at TP 8, "
          f"cost {totals['cost_s']} s of the suite's {totals['suite_cost_s']} s ({totals['suite_cases']} cases), "
          f"{totals['requirements']} requirements held")
    if dropped:
        print(f"{len(dropped)} case(s) not candidates (the reference did not judge them here): "
              + ", ".join(dropped[:5]) + (" ..." if len(dropped) > 5 else ""))
    print(f"runs took {spent:.0f} s")
    print(json.dumps({"totals": totals, "runs_s": round(spent, 1)}))


if __name__ == "__main__":
    sys.exit(main())
