"""A distributed case: a picklable function run on every rank, and its outcome.

Checks write cases as plain module-level functions ``fn(ctx, **params)``; they
never know how ranks are launched.  Each rank returns a picklable value (or
raises); the launcher collects one :class:`RankOutcome` per rank.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CaseContext:
    """What a rank knows while it runs a case."""

    rank: int
    world_size: int
    device: str
    impl_spec: str
    launcher: str
    subgroup: Any = None  # set when the case runs on part of a larger world (torchrun)

    @property
    def impl(self) -> Any:
        """The implementation under test, loaded once per rank process."""
        from conformance.impl_loader import load_implementation

        return load_implementation(self.impl_spec)

    @property
    def group(self) -> Any:
        """The process group spanning the case's ranks."""
        import torch.distributed as dist

        return self.subgroup if self.subgroup is not None else dist.group.WORLD


CaseFn = Callable[..., Any]


@dataclass(frozen=True)
class Case:
    """A function and parameters to run on ``world_size`` ranks."""

    fn: CaseFn
    world_size: int
    params: dict[str, Any] = field(default_factory=dict)
    timeout: float = 60.0
    exclusive: bool = False

    @property
    def name(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"


@dataclass
class RemoteError:
    """An exception raised on a rank, carried back as text (and the object when picklable)."""

    type_name: str
    message: str
    traceback: str
    exception: BaseException | None = None

    @classmethod
    def capture(cls, exc: BaseException) -> RemoteError:
        import pickle

        try:
            pickle.loads(pickle.dumps(exc))
            carried: BaseException | None = exc
        except Exception:  # noqa: BLE001 - unpicklable exceptions travel as text only
            carried = None
        return cls(
            type_name=f"{type(exc).__module__}.{type(exc).__qualname__}",
            message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
            exception=carried,
        )


@dataclass
class RankOutcome:
    """One rank's result: a value or an error, plus what the rank logged."""

    rank: int
    value: Any = None
    error: RemoteError | None = None
    log: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


def run_on_rank(
    case_fn: CaseFn, params: dict[str, Any], ctx: CaseContext, *, capture_stdio: bool = True
) -> RankOutcome:
    """Run one case on this rank, capturing its output, logs and exception.

    Ranks that are threads of one process share ``sys.stdout``; they pass
    ``capture_stdio=False`` and only their log records are kept.
    """
    buffer = io.StringIO()
    with _capture_output(buffer, capture_stdio):
        try:
            value = case_fn(ctx, **params)
            error = None
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the test
            value, error = None, RemoteError.capture(exc)
    return RankOutcome(rank=ctx.rank, value=value, error=error, log=buffer.getvalue())


class _Tee(io.TextIOBase):
    def __init__(self, *streams: Any) -> None:
        self._streams = streams

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
            stream.flush()
        return len(text)


@contextlib.contextmanager
def _capture_output(buffer: io.StringIO, capture_stdio: bool) -> Iterator[None]:
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    own_thread = threading.get_ident()
    handler.addFilter(lambda record: record.thread == own_thread)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        if capture_stdio:
            # Tee, so that what a rank printed survives in its process output if it dies.
            with contextlib.redirect_stdout(_Tee(buffer, sys.stdout)), \
                    contextlib.redirect_stderr(_Tee(buffer, sys.stderr)):
                yield
        else:
            yield
    finally:
        root.removeHandler(handler)
