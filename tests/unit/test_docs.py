"""The docs a newcomer reads stay short and true: DESIGN and README within their length, every path DESIGN names
exists, every DESIGN.md anchor the code links to is a heading, every page under docs/ is linked from the
README."""
from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "DESIGN.md"
README = ROOT / "README.md"
MAX_LINES = {DESIGN: 700, README: 250}

#: Where a path DESIGN writes may start: the repository root, or ``conformance/`` (the house table names the parts
#: inside it as ``judge/``, ``harness/wire.py``...).
PATH_BASES = (ROOT, ROOT / "conformance")
#: A backticked span that names a file or folder: it has a slash, or a file suffix of the tree.
PATH_LIKE = re.compile(r"/|\.(py|md|toml|json|ini)$")
#: Spans that look like paths but name none of the tree: system paths, what a run writes (``reports/``),
#: placeholders and patterns, URLs.
NOT_TREE = re.compile(r"^/|^reports/|[<>*]|://")
SKIPPED_DIRS = {"node_modules", "__pycache__", "build", "dist"}


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6} +(.+?) *$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def stale_paths(markdown: str) -> list[str]:
    """Backticked repository paths of ``markdown`` that exist under none of :data:`PATH_BASES`."""
    stale = []
    for span in sorted(set(re.findall(r"`([^`\s]+)`", markdown))):
        if not PATH_LIKE.search(span) or NOT_TREE.search(span) or span.startswith("-"):
            continue
        path = span.split("::", 1)[0].split("#", 1)[0]
        if not any((base / path).exists() for base in PATH_BASES):
            stale.append(span)
    return stale


def broken_links(markdown: str, where: Path) -> list[str]:
    """Relative markdown links of a document (beside ``where``) whose file does not exist."""
    targets = re.findall(r"\]\(([^)\s]+)\)", markdown)
    return [t for t in targets if "://" not in t and not t.startswith("#")
            and not (where.parent / t.split("#", 1)[0]).exists()]


def _source_files() -> Iterator[Path]:
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        yield from (Path(folder) / f for f in files if f.endswith((".py", ".md", ".toml", ".yml")))


def linked_design_anchors() -> dict[str, list[str]]:
    """Every DESIGN.md anchor written in the tree's sources and docs -> the files that write it."""
    linked: dict[str, list[str]] = {}
    for path in _source_files():
        for anchor in re.findall(r"DESIGN\.md#([a-z0-9-]+)", path.read_text(errors="replace")):
            linked.setdefault(anchor, []).append(str(path.relative_to(ROOT)))
    return linked


@pytest.mark.parametrize("doc", list(MAX_LINES), ids=lambda p: p.name)
def test_a_newcomer_reads_it_in_twenty_minutes(doc: Path) -> None:
    lines = len(doc.read_text().splitlines())
    assert lines <= MAX_LINES[doc], f"{doc.relative_to(ROOT)} has {lines} lines, at most {MAX_LINES[doc]}"


def test_every_path_design_names_exists() -> None:
    assert stale_paths(DESIGN.read_text()) == []


def test_a_stale_path_is_found() -> None:
    text = "The bound: `conformance/judge/numerics.py`; a moved one: `conformance/judge/no_such_module.py`, " \
           "`harness/wire.py`, `harness/gone/`, `test_ops.py::test_corner_*`, `reports/device-check.json`."
    assert stale_paths(text) == ["conformance/judge/no_such_module.py", "harness/gone/"]


def test_every_link_of_the_docs_resolves() -> None:
    docs = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "conformance" / "bench" / "README.md"]
    assert {str(d.relative_to(ROOT)): broken_links(d.read_text(), d) for d in docs} == \
        {str(d.relative_to(ROOT)): [] for d in docs}


def test_every_design_anchor_the_code_links_to_is_a_heading() -> None:
    anchors = heading_anchors(DESIGN.read_text())
    linked = linked_design_anchors()
    assert "house" in linked  # the scan reaches the sources (tests/unit/test_architecture.py links it)
    assert {a: files for a, files in linked.items() if a not in anchors} == {}


def test_a_missing_anchor_is_found() -> None:
    anchors = heading_anchors("# Design\n## Time budget\n### The emulated NPU node\n## Gating in CI\n")
    assert anchors == {"design", "time-budget", "the-emulated-npu-node", "gating-in-ci"}
    assert "storm-breaker" not in anchors


def test_every_page_under_docs_is_linked_from_the_readme() -> None:
    readme = README.read_text()
    pages = [p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")]
    assert [p for p in pages if f"]({p}" not in readme] == []
