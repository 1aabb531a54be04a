"""The user's ``coc_cfgs`` (a dict, or a JSON file holding one), validated: per-shape chunk counts and switches.

Every key and value is checked here, before any collective, so a bad entry
fails identically on every rank; an unknown key is refused, never ignored.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from coc_impl.config_sources import VALID_CHUNKS
from coc_impl.errors import CoCChunkCountError, CoCUserCfgError

__all__ = ["UserCfgs", "read_user_cfgs"]

_SHAPE_KEY = re.compile(r"^\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]$")


@dataclass(frozen=True)
class UserCfgs:
    """The user ``coc_cfgs`` dictionary, validated.

    ``customized_coc`` maps a matmul shape ``(m, k, n)`` to the chunk count to
    use for it; it overrides ``parallel_num`` for that shape in every layer and
    mode.
    """

    matmul_soc_friendly: bool = True
    customized_coc: Mapping[tuple[int, int, int], int] = field(
        default_factory=lambda: MappingProxyType({})
    )
    enable_coc_in_column_backward: bool = False
    recompute_all_gather: bool = True

    @classmethod
    def from_mapping(cls, cfgs: Mapping[str, Any] | str | os.PathLike | None) -> UserCfgs:
        """Validate a ``coc_cfgs`` dict (or a path to a JSON file holding one)."""
        if cfgs is None:
            return cls()
        cfgs = read_user_cfgs(cfgs)
        if not isinstance(cfgs, Mapping):
            raise CoCUserCfgError(f"coc_cfgs must be a dict, got {type(cfgs).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(cfgs) - known)
        if unknown:
            raise CoCUserCfgError(
                f"coc_cfgs has unknown key(s) {unknown}; known keys are {sorted(known)}"
            )
        values: dict[str, Any] = {}
        for key in ("matmul_soc_friendly", "enable_coc_in_column_backward", "recompute_all_gather"):
            if key in cfgs:
                if not isinstance(cfgs[key], bool):
                    raise CoCUserCfgError(
                        f"coc_cfgs[{key!r}] must be True or False, got {cfgs[key]!r}"
                    )
                values[key] = cfgs[key]
        if "customized_coc" in cfgs:
            values["customized_coc"] = _parse_customized(cfgs["customized_coc"])
        return cls(**values)

    def chunks_for(self, m: int, k: int, n: int) -> int | None:
        """The customised chunk count for matmul shape ``[m, k, n]``, if any."""
        return self.customized_coc.get((m, k, n))


def read_user_cfgs(cfgs: Mapping[str, Any] | str | os.PathLike) -> Any:
    """The ``coc_cfgs`` mapping itself, read from its JSON file when given a path."""
    if not isinstance(cfgs, (str, os.PathLike)):
        return cfgs
    try:
        return json.loads(Path(cfgs).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CoCUserCfgError(f"coc_cfgs file {cfgs!s} cannot be read: {exc}") from exc


def _parse_customized(raw: Any) -> Mapping[tuple[int, int, int], int]:
    if not isinstance(raw, Mapping):
        raise CoCUserCfgError(
            f"coc_cfgs['customized_coc'] must map '[m, k, n]' to a chunk count, got {raw!r}"
        )
    parsed: dict[tuple[int, int, int], int] = {}
    for key, value in raw.items():
        match = _SHAPE_KEY.match(key) if isinstance(key, str) else None
        if match is None:
            raise CoCUserCfgError(
                f"coc_cfgs['customized_coc'] key {key!r} is not of the form '[m, k, n]'"
            )
        if isinstance(value, bool) or value not in VALID_CHUNKS:
            raise CoCChunkCountError(
                f"coc_cfgs['customized_coc'][{key!r}] = {value!r}: chunk count must be one of "
                f"{list(VALID_CHUNKS)}"
            )
        parsed[(int(match[1]), int(match[2]), int(match[3]))] = value
    return MappingProxyType(parsed)
