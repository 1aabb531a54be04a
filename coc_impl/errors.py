"""Typed errors of the CoC implementation.

Every misuse has its own class so that callers (and the conformance suite) can
tell a configuration mistake from a shape mistake from a quantisation mistake
without parsing messages.  Each message names the flags or sizes involved.
"""

from __future__ import annotations


class CoCError(Exception):
    """Root of every error raised by ``coc_impl`` on purpose."""


class CoCConfigError(CoCError, ValueError):
    """The CoC configuration is invalid or incompatible with the model."""


class CoCWithMC2Error(CoCConfigError):
    """``--use-ascend-coc`` together with ``--use-ascend-mc2``."""


class CoCMoEError(CoCConfigError):
    """CoC requested for a mixture-of-experts model (``num_experts`` set)."""


class CoCTP2DError(CoCConfigError):
    """CoC requested together with 2-D tensor parallelism."""


class CoCTransformerEngineError(CoCConfigError):
    """CoC requested with Transformer Engine layers (only ``local`` is patched)."""


class CoCChunkCountError(CoCConfigError):
    """A chunk count outside {1, 2, 4, 8, auto}."""


class CoCFusedTPError(CoCConfigError):
    """The fused kernels run only at tensor-parallel size 8 (ATB restriction)."""


class CoCUserCfgError(CoCConfigError):
    """An unknown key or a bad value in the user ``coc_cfgs``."""


class CoCSettingValueError(CoCConfigError):
    """A malformed value of a flag, a legacy environment variable or a size (e.g. ``USE_COC_FUSED_KERNEL=maybe``)."""


class CoCShapeError(CoCError, ValueError):
    """A tensor shape the chunked pipeline cannot split exactly."""


class CoCArgumentError(CoCError, ValueError):
    """A fused-op argument of the wrong shape, dtype or value (e.g. antiquant)."""


class CoCBackendUnavailable(CoCError, RuntimeError):
    """The requested backend cannot run here (missing hardware or library)."""
