"""coc-conformance: the suite that judges any CoC implementation.

Public API: :mod:`conformance.protocol` (what an implementation provides),
:mod:`conformance.plugin` (the pytest plugin), ``coc-gate``
and ``coc-matrix`` (CI gating).  The roles below it:
``harness`` (ranks), ``cases`` (rank-side code), ``judge`` (checks),
``suite`` (the tests), ``reporting``, ``bench``, ``adapters``.
"""
