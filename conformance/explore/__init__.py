"""The explorer (``docs/DESIGN.md#explorer``): cases drawn from the whole space, judged by the suite, shrunk.

:mod:`~conformance.explore.spec` is a case as data (JSON round trip, the job
it maps to); :mod:`~conformance.explore.space` the dimensions it is drawn
from and made simpler along; :mod:`~conformance.explore.shrink` the shrinker;
:mod:`~conformance.explore.explorer` the loop that runs, judges and shrinks
on the warm rank pools within a time budget.
"""
