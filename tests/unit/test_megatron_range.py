"""The supported megatron-core range: a release outside it, or missing what it imports, stops at start-up."""

from __future__ import annotations

import pytest

from coc_shared import megatron_range


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
