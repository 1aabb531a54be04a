"""Run-level files of an Allure results directory: ``categories.json``, ``environment.properties``.

Categories are derived from the failure classes in :mod:`conformance.record.failures`
and the hang classes of :mod:`conformance.harness.case_errors`, so a new check
category is one class away.  They match the start of a failure's message
(``module.Class: ...``, after the line naming the failed checks), or the first remote error of a
:class:`~conformance.harness.case_errors.RankRaised` when the check failed on a rank.  The
same rules work in Allure 2 (whole-message match) and Allure 3 (search).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from conformance.harness import case_errors
from conformance.record import failures

HANG = "Hang / timeout"
#: The line of failed checks a failed case's message starts with (``[MUST] numerics: failed``), before the error.
_CHECKS_LINE = r"(?:\[[A-Z]+\] [^\n]*\n)?"
#: Extra message patterns per category: pytest.raises that saw nothing raised.
_EXTRA: dict[type, tuple[str, ...]] = {failures.WrongError: (rf"^{_CHECKS_LINE}Failed: DID NOT RAISE\b[\s\S]*",)}


def _patterns(classes: Sequence[type]) -> list[str]:
    names = "|".join(cls.__name__ for cls in classes)
    return [rf"^{_CHECKS_LINE}(?:[\w.]+\.)?(?:{names})\b[\s\S]*",
            rf"^{_CHECKS_LINE}(?:[\w.]+\.)?RankRaised: [^\n]*? raised; rank \d+: (?:[\w.]+\.)?(?:{names})\b[\s\S]*"]


def categories() -> list[dict[str, object]]:
    """Allure category rules: one per check failure class, plus hangs."""
    groups: list[tuple[str, Sequence[type]]] = [
        (cls.category.capitalize(), (cls,)) for cls in failures.CATEGORIES
    ]
    groups.append((HANG, case_errors.HANGS))
    rules: list[dict[str, object]] = []
    for name, classes in groups:
        patterns = _patterns(classes) + [p for cls in classes for p in _EXTRA.get(cls, ())]
        rules.append({"name": name, "matchedStatuses": ["failed", "broken"],
                      "messageRegex": "|".join(f"(?:{p})" for p in patterns)})
    return rules


def matching_category(rules: Sequence[Mapping[str, object]], status: str, message: str) -> str | None:
    """The first category whose rule matches a result, as Allure applies them (None: no category)."""
    for rule in rules:
        statuses = rule["matchedStatuses"]
        pattern = rule["messageRegex"]
        if isinstance(statuses, list) and status in statuses and isinstance(pattern, str) \
                and re.fullmatch(pattern, message):
            return str(rule["name"])
    return None


def git_sha(cwd: Path) -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _escape(text: str, *, key: bool = False) -> str:
    """Java properties escaping (what Allure's reader parses)."""
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace(" ", "\\ ").replace("=", "\\=").replace(":", "\\:") if key else text


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write(results_dir: Path, environment: Mapping[str, str]) -> None:
    """Write both files into ``results_dir`` (once per session, by the controller)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    _write_atomically(results_dir / "categories.json", json.dumps(categories(), indent=2) + "\n")
    lines = [f"{_escape(key, key=True)}={_escape(str(value))}" for key, value in environment.items()]
    _write_atomically(results_dir / "environment.properties", "\n".join(lines) + "\n")


#: Environment variables a run's bits depend on (reduction orders, GEMM workspaces and math modes), read where
#: the ranks take their environment from: HCCL's and LCCL's determinism switches, cuBLAS's workspace, NCCL's
#: algorithm, protocol and channels, TF32 overrides, and the CPU GEMM's threads and MKL's reproducibility mode.
DETERMINISM_VARIABLES = ("HCCL_DETERMINISTIC", "LCCL_DETERMINISTIC", "CUBLAS_WORKSPACE_CONFIG", "NCCL_ALGO",
                         "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NVIDIA_TF32_OVERRIDE",
                         "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "OMP_NUM_THREADS", "MKL_CBWR")


def determinism_settings(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """What a run's determinism verdicts depended on: :data:`DETERMINISM_VARIABLES` (None: unset) and torch's own
    switches as a rank starts with them (this process, the implementation loaded: the same imports in the same
    environment).  The poisoned allocations switch deterministic algorithms on, warning only, around an
    implementation's calls on a CPU or a GPU (``docs/DESIGN.md#harness``); that is not recorded here."""
    import torch

    environ = os.environ if environ is None else environ
    found: dict[str, str | None] = {name: environ.get(name) for name in DETERMINISM_VARIABLES}
    found["torch.use_deterministic_algorithms"] = (
        ("on, warn only" if torch.is_deterministic_algorithms_warn_only_enabled() else "on")
        if torch.are_deterministic_algorithms_enabled() else "off")
    found["torch.float32_matmul_precision"] = torch.get_float32_matmul_precision()
    found["torch.backends.cudnn.deterministic"] = str(bool(torch.backends.cudnn.deterministic)).lower()
    return found


def base_environment(rootdir: Path) -> dict[str, str]:
    """What every run shares: versions, host and source revision."""
    return {
        "torch": package_version("torch"),
        "coc_conformance": package_version("coc-conformance"),
        "python": platform.python_version(),
        "host": platform.node(),
        "git_sha": git_sha(rootdir),
    }
