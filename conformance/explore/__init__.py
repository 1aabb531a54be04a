"""The explorer (``docs/DESIGN.md#explorer``): cases drawn from the whole space, judged by the suite, shrunk.

:mod:`~conformance.explore.spec` is what a case as data offers (JSON round
trip); :mod:`~conformance.explore.space` how a dimension is drawn and made
simpler; :mod:`~conformance.explore.kind` what a kind of case gives the
explorer and the verdict of a case; one module per kind
(:mod:`~conformance.explore.op_calls`, ...) listed in
:mod:`~conformance.explore.registry`; :mod:`~conformance.explore.shrink` the
shrinker; :mod:`~conformance.explore.explorer` the loop that runs, judges and
shrinks on the warm rank pools within a time budget.
"""
