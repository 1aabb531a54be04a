"""The CI templates a patch repository copies: they parse, and everything they run exists.

A template is only read by its user's CI, long after a change here renamed a
module, a console command or an option; these checks fail first instead.
Commands come from every ``run:`` (GitHub Actions) and ``script:`` /
``before_script:`` / ``after_script:`` (GitLab CI) entry.  The NPU jobs' shells
load CANN's environment before any Python, as their own lines show when run.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

yaml = pytest.importorskip("yaml")

TEMPLATES = sorted((ROOT / "ci-templates").glob("*.yml"))
GITLAB_KEYWORDS = {"variables", "stages", "default", "include", "workflow", "image", "services",
                   "cache", "before_script", "after_script"}
GITLAB_SCRIPTS = ("before_script", "script", "after_script")
#: How the NPU node job runs pytest (its other two jobs: the smoke tier and the full suite on a CPU runner).
NPU_OPTIONS = {"-n": "8", "--coc-backend": "hccl"}


def _load(path: Path) -> dict[Any, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), f"{path.name}: not a mapping"
    return doc


def _jobs(doc: dict[Any, Any]) -> dict[str, dict[str, Any]]:
    if "jobs" in doc:  # GitHub Actions
        return dict(doc["jobs"])
    return {name: job for name, job in doc.items()
            if name not in GITLAB_KEYWORDS and not name.startswith(".") and isinstance(job, dict)}


def _scripts(job: dict[str, Any]) -> Iterator[str]:
    for step in job.get("steps", []):
        if "run" in step:
            yield step["run"]
    for key in GITLAB_SCRIPTS:
        yield from job.get(key, [])


def _commands(script: str) -> Iterator[list[str]]:
    """The simple commands of a shell script, as word lists (control words and operators dropped)."""
    for line in re.split(r"\n|;|&&|\|\||\|", script.replace("\\\n", " ")):
        words = shlex.split(line, comments=True)
        while words and words[0] in ("if", "then", "else", "fi", "do", "done", "!"):
            words = words[1:]
        if words and not words[0].startswith("["):
            yield words


def _invocations() -> Iterator[tuple[str, str, list[str]]]:
    """(template, job, words) of every command of every job."""
    for path in TEMPLATES:
        for name, job in _jobs(_load(path)).items():
            for script in _scripts(job):
                for words in _commands(script):
                    yield path.name, name, words


def _python_module(words: list[str]) -> tuple[str, list[str]] | None:
    """``(module, args)`` of ``python -m module args`` (any interpreter path), else None."""
    if Path(words[0]).name in ("python", "python3") and len(words) > 2 and words[1] == "-m":
        return words[2], words[3:]
    return None


def _pytest_runs() -> list[tuple[str, str, list[str]]]:
    runs = []
    for template, job, words in _invocations():
        module = _python_module(words)
        if module and module[0] == "pytest":
            runs.append((template, job, module[1]))
        elif words[0] == "pytest":
            runs.append((template, job, words[1:]))
    return runs


def _console_scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.fixture(scope="module")
def pytest_help() -> str:
    """``pytest --help`` with the suite's plugin loaded (installed entry point or the root conftest)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--coc-impl" in done.stdout, "the plugin was not loaded"
    return done.stdout


def test_templates_exist() -> None:
    assert {p.name for p in TEMPLATES} >= {"github-actions.yml", "gitlab-ci.yml"}


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_parses_with_its_jobs(path: Path) -> None:
    jobs = _jobs(_load(path))
    assert len(jobs) >= 3, f"{path.name}: jobs {sorted(jobs)}"
    for name, job in jobs.items():
        assert list(_scripts(job)), f"{path.name}: job {name} runs nothing"
        needs = job.get("needs", [])
        for needed in [needs] if isinstance(needs, str) else needs:
            assert (needed["job"] if isinstance(needed, dict) else needed) in jobs
    # A job that downloads another job's artifacts by name names a job of this template.
    for job_name in re.findall(r"[?&]job=([\w-]+)", path.read_text()):
        assert job_name in jobs, f"{path.name}: artifacts of unknown job {job_name}"


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_runs_the_three_jobs(path: Path) -> None:
    runs = [args for template, _, args in _pytest_runs() if template == path.name]
    assert any("smoke" in args for args in runs), "no smoke tier"
    assert any("-m" not in args and "--coc-backend" not in args for args in runs), "no full suite on a CPU runner"
    npu = [args for args in runs if all(opt in args and args[args.index(opt) + 1] == value
                                        for opt, value in NPU_OPTIONS.items())]
    assert npu, f"no NPU node job ({NPU_OPTIONS})"
    text = path.read_text()
    assert "ASCEND_RT_VISIBLE_DEVICES" in text and "npu-910b" in text and "allure-report" in text


#: Where CANN is installed by default, and the script its environment comes from.
CANN_DEFAULT, CANN_SET_ENV = "/usr/local/Ascend", "ascend-toolkit/set_env.sh"


def _npu_jobs(path: Path) -> dict[str, dict[str, Any]]:
    """The jobs of a template that run pytest on an NPU node (:data:`NPU_OPTIONS`)."""
    jobs = _jobs(_load(path))
    return {name: job for name, job in jobs.items()
            if any(t == path.name and j == name and all(opt in args and args[args.index(opt) + 1] == value
                                                         for opt, value in NPU_OPTIONS.items())
                   for t, j, args in _pytest_runs())}


def _shells(job: dict[str, Any]) -> list[str]:
    """Each shell a job's commands run in: a GitHub step each; GitLab's before_script and script together, and
    after_script apart."""
    if "steps" in job:
        return [step["run"] for step in job["steps"] if "run" in step]
    joined = ["\n".join([*job.get("before_script", []), *job.get("script", [])]),
              "\n".join(job.get("after_script", []))]
    return [shell for shell in joined if shell.strip()]


def _runs_python(words: list[str]) -> bool:
    """Python, a console script of a Python package, or pytest (each imports torch, which loads torch_npu)."""
    return Path(words[0]).name.startswith("python") or words[0] in ("pytest", "pip") or words[0].startswith("coc-")


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_every_npu_shell_loads_cann_before_any_python(path: Path, tmp_path: Path) -> None:
    """``import torch`` loads torch_npu (its ``torch.backends`` entry point), which needs CANN's environment: each
    NPU job's shell that runs Python loads it first -- and NNAL's where installed -- from ``CANN_INSTALL_PATH``
    (default the standard install), and where no CANN is installed says so and runs on.  The template's own lines
    before its first Python command are run, against a stand-in CANN and against none."""
    cann = tmp_path / "Ascend"
    for script, exported in ((CANN_SET_ENV, "COC_TOOLKIT=loaded"), ("nnal/atb/set_env.sh", "COC_ATB=loaded")):
        (cann / script).parent.mkdir(parents=True, exist_ok=True)
        (cann / script).write_text(f"export {exported}\n")
    jobs = _npu_jobs(path)
    assert jobs, f"{path.name}: no NPU job"
    for name, job in jobs.items():
        assert (job.get("env") or job.get("variables") or {}).get("CANN_INSTALL_PATH") == CANN_DEFAULT, name
        for shell in _shells(job):
            lines = shell.replace("\\\n", " ").splitlines()
            first = next((i for i, line in enumerate(lines) if any(_runs_python(w) for w in _commands(line))), None)
            if first is None:
                continue
            prefix = "\n".join(lines[:first])
            assert CANN_SET_ENV in prefix, f"{path.name} {name}: Python before CANN's environment is loaded:\n{shell}"
            for root, expected in ((cann, "loaded loaded"), (tmp_path / "none", "No CANN under CANN_INSTALL_PATH=")):
                done = subprocess.run(["bash", "-e", "-c", prefix + '\necho "$COC_TOOLKIT $COC_ATB"'],
                                      env={"PATH": os.environ["PATH"], "CANN_INSTALL_PATH": str(root)},
                                      capture_output=True, text=True, timeout=60)
                assert done.returncode == 0 and expected in done.stdout, (name, root, done.stdout, done.stderr)


#: What the NPU job judges first: the reference with MC² wherever torch_npu's kernels take the call.
REFERENCE_WITH_MC2 = "coc_impl.reference:ReferenceCoCAuto"


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_the_npu_job_judges_the_reference_with_mc2_before_the_implementation(path: Path) -> None:
    from conformance.harness.impl_loader import load_implementation

    runs = [args for template, job, args in _pytest_runs() if template == path.name and job in _npu_jobs(path)]
    impls = [args[args.index("--coc-impl") + 1] for args in runs]
    assert impls[0] == REFERENCE_WITH_MC2 and impls[-1] == "$COC_IMPL", impls
    assert load_implementation(REFERENCE_WITH_MC2).backend == "auto"


def test_templates_install_a_pinned_package() -> None:
    """Never the bare name: nothing is published under it."""
    for template, job, words in _invocations():
        module = _python_module(words)
        if module and module[0] == "pip" and module[1][:1] == ["install"]:
            packages = [w for w in module[1][1:] if "coc-conformance" in w]
            for package in packages:
                assert "@" in package, f"{template} {job}: unpinned {package!r}"
    for path in TEMPLATES:
        pinned = re.search(r"^\s*COC_CONFORMANCE: (\S+)$", path.read_text(), re.M)
        assert pinned and re.search(r"@v?\d|\.whl$", pinned[1]), f"{path.name}: version not pinned"


def test_python_modules_answer_help() -> None:
    modules = sorted({m[0] for *_, words in _invocations() if (m := _python_module(words))} - {"pip", "pytest"})
    assert "conformance.reporting.build" in modules
    for module in modules:
        done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, f"python -m {module} --help: {done.stderr}"


def test_console_commands_answer_help(capsys: pytest.CaptureFixture[str]) -> None:
    scripts = _console_scripts()
    used = {words[0] for *_, words in _invocations() if words[0].startswith("coc-")}
    assert "coc-gate" in used
    for command in sorted(used | {"coc-gate", "coc-matrix", "coc-expectations"}):
        assert command in scripts, f"{command} is not a console script of the package"
        module, _, attr = scripts[command].partition(":")
        with pytest.raises(SystemExit) as exited:
            getattr(importlib.import_module(module), attr)(["--help"])
        assert exited.value.code == 0, command
        assert "usage:" in capsys.readouterr().out


def test_pytest_options_are_registered(pytest_help: str) -> None:
    """Every long option passed to pytest is one pytest knows (the suite's, its own, a plugin's).

    pytest's help lists options that differ only in hyphens once (``--junit-xml`` for
    ``--junitxml``), so names are compared without them.
    """
    known = {re.sub("-", "", name) for name in re.findall(r"--[a-z][\w-]*", pytest_help)}
    runs = _pytest_runs()
    assert runs
    for template, job, args in runs:
        for arg in args:
            option = arg.partition("=")[0]
            if option.startswith("--"):
                assert option.replace("-", "") in known, f"{template} {job}: pytest has no option {option}"


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_template_runs_a_nightly_exploration(path: Path) -> None:
    """A 10-minute exploration, seeded, its minimal failing cases kept (README: the nightly exploration)."""
    runs = [args for template, _, args in _pytest_runs() if template == path.name and "--coc-explore" in args]
    assert runs, "no exploration job"
    args = runs[0]
    assert args[args.index("--coc-explore") + 1] == "600" and "--coc-seed" in args and "--coc-explore-dir" in args


def test_every_run_with_results_builds_its_report_with_history() -> None:
    """Each job that writes Allure results builds the report from them, keeping the history for the trend
    (never ``--no-history``), with options the builder has; the per-change job embeds the gate and the matrix."""
    from conformance.reporting.build import argument_parser

    known = {option for action in argument_parser()._actions for option in action.option_strings}
    builds = {(template, job): module[1] for template, job, words in _invocations()
              if (module := _python_module(words)) and module[0] == "conformance.reporting.build"}
    with_results = {(template, job) for template, job, args in _pytest_runs()
                    if any(arg.startswith("--alluredir") for arg in args)}
    assert with_results and with_results <= set(builds), sorted(with_results - set(builds))
    for (template, job), args in builds.items():
        assert "--history" in args and "--no-history" not in args, f"{template} {job}: {args}"
        assert {arg for arg in args if arg.startswith("--")} <= known, f"{template} {job}: {args}"
    for template in {template for template, _ in builds}:
        smoke = [args for (t, job), args in builds.items() if t == template and "smoke" in job]
        assert smoke and sum(arg == "--attach" for arg in smoke[0]) == 2, f"{template}: {smoke}"
        # the baseline is named through a shell variable, set where the baseline run's summary was fetched
        assert "$BASELINE" in smoke[0] and "--baseline" in known, f"{template}: {smoke}"
        text = (ROOT / "ci-templates" / template).read_text()
        assert 'BASELINE="--baseline baseline"' in text, template


def _gate_check(words: list[str]) -> str | None:
    """The folder ``coc-gate --current DIR`` (no baseline) checks, for either way of running it; else None."""
    module = _python_module(words)
    args = words[1:] if words[0] == "coc-gate" else module[1] if module and module[0] == "conformance.gating.gate" \
        else None
    if args is None or "--baseline" in args or "--current" not in args:
        return None
    return args[args.index("--current") + 1]


def test_every_run_of_the_suite_is_followed_by_a_check_of_its_summary() -> None:
    """A session that ends without a complete summary (killed, or ``os._exit(0)`` in its process) never passes its
    job: each job that runs the suite with ``--coc-summary`` checks that summary's folder next (``coc-gate
    --current``), as a command of its own after the run."""
    checked = 0
    for path in TEMPLATES:
        for name, job in _jobs(_load(path)).items():
            commands = [words for script in _scripts(job) for words in _commands(script)]
            for index, words in enumerate(commands):
                module = _python_module(words)
                args = module[1] if module and module[0] == "pytest" else []
                if "--coc-summary" not in args:
                    continue
                folder = str(Path(args[args.index("--coc-summary") + 1]).parent)
                assert folder in [_gate_check(later) for later in commands[index + 1:]], f"{path.name} {name}"
                checked += 1
    assert checked >= 8, checked


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_a_nightly_job_runs_the_npu_job_on_the_emulated_node(path: Path) -> None:
    """The NPU node's job, on a CPU runner against the emulated node (npu-sim): the reference with MC² first, then the
    whole suite; npu-sim installed from the pinned repository; CANN's set-up kept (checked with the NPU jobs)."""
    emulated = {job for template, job, args in _pytest_runs() if template == path.name and "--coc-emulate-npu" in args}
    assert len(emulated) == 1, emulated
    job = emulated.pop()
    assert job in _npu_jobs(path)
    runs = [args for template, j, args in _pytest_runs() if template == path.name and j == job]
    assert runs[-1][runs[-1].index("--coc-impl") + 1] == "$COC_IMPL" and "-m" not in runs[-1], runs
    text = path.read_text()
    assert re.search(r"^\s*NPU_SIM_PACKAGE: \S+@v?\d\S*#subdirectory=npu-sim$", text, re.M), "npu-sim not pinned"
    assert '"npu-sim @ $NPU_SIM_PACKAGE"' in text
    spec = _jobs(_load(path))[job]
    schedule_only = spec.get("if", "") or str(spec.get("rules", ""))
    assert "schedule" in schedule_only and "pull_request" not in schedule_only, schedule_only
