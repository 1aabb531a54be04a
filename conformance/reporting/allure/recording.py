"""Whether this session records Allure results, and what the running case described of itself.

The hooks switch recording on at configure (with ``--alluredir``) and off at
unconfigure; everything else asks :func:`is_active` first, so the suite costs
nothing without a report.  What a test described itself (feature, story,
severity, title) is kept here until its teardown, so the defaults leave it alone.
"""

from __future__ import annotations

_active = False
_figures = "failed"  # --coc-figures
#: What the running test described itself (the defaults skip it); cleared as each case begins and ends.
described: set[str] = set()


def activate(on: bool, *, figures: str = "failed") -> None:
    """Switch recording on or off (the hooks do, at configure and unconfigure).

    ``figures`` (``--coc-figures``): which comparisons get figures: ``failed``, ``all`` or ``none``.
    """
    global _active, _figures
    _active, _figures = on, figures


def is_active() -> bool:
    return _active


def figures() -> str:
    """``--coc-figures`` as recording was switched on with."""
    return _figures
