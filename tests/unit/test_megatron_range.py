"""The supported megatron-core range: a release outside it, or missing what it imports, stops at start-up."""

from __future__ import annotations

import sys

import pytest
from packaging.requirements import Requirement

from coc_shared import megatron_range
from tests.support import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@pytest.mark.parametrize("version", ["0.6.0", "0.20.0", "1.0.0", "dev"])
def test_outside_the_range_names_the_version(monkeypatch, version: str) -> None:
    monkeypatch.setattr(megatron_range, "installed", lambda: version)
    with pytest.raises(megatron_range.UnsupportedMegatron, match=f"megatron-core {version} is installed"):
        megatron_range.check()


@pytest.mark.parametrize("version", ["0.7.0", "0.16.1", "0.17.0", "0.19.2"])
def test_every_release_of_the_range_is_accepted(monkeypatch, version: str) -> None:
    monkeypatch.setattr(megatron_range, "installed", lambda: version)
    monkeypatch.setattr(megatron_range.importlib.util, "find_spec", lambda name: object())
    assert megatron_range.check() == version


@pytest.mark.parametrize("version", ["0.18.0", "0.19.2"])
def test_undeclared_import_of_triton_is_named(monkeypatch, version: str) -> None:
    monkeypatch.setattr(megatron_range, "installed", lambda: version)
    monkeypatch.setattr(megatron_range.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(megatron_range.UnsupportedMegatron, match="imports triton.*pip install triton"):
        megatron_range.check()


def test_not_installed_is_not_refused(monkeypatch) -> None:
    monkeypatch.setattr(megatron_range, "installed", lambda: None)
    assert megatron_range.check() is None


@pytest.mark.parametrize("machine, python, platform, installed", [
    ("x86_64", "3.12", "linux", True),
    ("aarch64", "3.12", "linux", True),  # Kunpeng hosts of Ascend nodes: triton publishes aarch64 wheels from 3.5
    ("aarch64", "3.13", "linux", True),
    ("aarch64", "3.11", "linux", False),  # megatron-core 0.18+ asks for 3.12; installed by hand there
    ("arm64", "3.12", "darwin", False),
    ("AMD64", "3.12", "win32", False),
])
def test_the_package_asks_for_triton_where_megatron_core_imports_it_and_triton_has_wheels(
        machine: str, python: str, platform: str, installed: bool) -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (triton,) = [Requirement(d) for d in dependencies if Requirement(d).name == "triton"]
    assert triton.marker is not None
    assert triton.marker.evaluate({"platform_machine": machine, "python_version": python,
                                   "sys_platform": platform}) is installed
