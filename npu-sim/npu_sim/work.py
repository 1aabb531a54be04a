"""A queued HCCL collective as the program holds it: a ``dist.Work`` that completes when it is waited for.

:class:`HcclWork` completes (its transfers done, its result written to its outputs) at ``wait()``,
``synchronize()``, ``get_future()``, ``is_completed()`` once the transfers are done, or
``torch.npu.synchronize()`` (:mod:`npu_sim.streams` holds the queue); see :mod:`npu_sim.collectives` for why
then.  Its future is complete when taken, its value the outputs.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from npu_sim import streams

_NOT_RELAYED = object()
#: dist.Work's own methods, as torch binds them, for the gloo transfers under a collective (and the
#: communicator's set-up exchange): not the program's work, so not shown to wrappers installed on dist.Work.
TRANSFER_WAIT = dist.Work.wait
_TRANSFER_DONE = dist.Work.is_completed


class HcclWork(dist.Work):
    """A queued collective: complete once its transfers are done and its result is written to its outputs.

    A hardware Work is torch's own ``dist.Work`` to Python, so code that wraps ``dist.Work.wait`` /
    ``synchronize`` / ``get_future`` / ``is_completed`` (a profiler, a test probe) sees every call on it.  This
    subclass's overrides would hide such wrappers; so each override, having done its work, relays the call to
    the wrapper, whose call of the bound method torch sends back here (answered without doing it twice) --
    except ``is_completed``, which torch answers for its C++ base class (never completed): a wrapper gets this
    Work's answer from ``type(work).is_completed(work)``.
    """

    def __init__(self, transfers: list[dist.Work], finish: Callable[[], None] | None, result: Any) -> None:
        super().__init__()
        self._transfers = transfers
        self._finish = finish
        self._result = result
        self._done = False
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._future: torch.futures.Future | None = None
        self._relaying: set[int] = set()  # threads inside a wrapper's call of the bound method
        streams.enqueue(self)  # also what keeps the Python object, and its overrides, alive until completed

    def complete(self, timeout=None) -> None:
        with self._lock:
            if not self._done:
                try:
                    for transfer in self._transfers:
                        TRANSFER_WAIT(transfer) if timeout is None else TRANSFER_WAIT(transfer, timeout)
                    if self._finish is not None:
                        self._finish()
                except BaseException as error:
                    self._error = error
                finally:
                    self._done = True
                    streams.dequeue(self)
        if self._error is not None:
            raise self._error

    def _relay(self, name: str, *args: Any) -> Any:
        """Call ``dist.Work.<name>`` on this work if Python code has wrapped it there (else :data:`_NOT_RELAYED`)."""
        bound = getattr(dist.Work, name)
        ident = threading.get_ident()
        if not isinstance(bound, types.FunctionType) or ident in self._relaying:
            return _NOT_RELAYED
        self._relaying.add(ident)
        try:
            return bound(self, *args)
        finally:
            self._relaying.discard(ident)

    def wait(self, timeout=None) -> bool:
        if threading.get_ident() in self._relaying:
            return True  # torch sends a wrapper's call back here: done already
        self.complete(timeout)
        self._relay("wait", *(() if timeout is None else (timeout,)))
        return True

    def synchronize(self) -> None:
        if threading.get_ident() in self._relaying:
            return
        self.complete()
        self._relay("synchronize")

    def is_completed(self) -> bool:
        if threading.get_ident() in self._relaying:
            return self._done  # a wrapper asking this Work's own answer (torch's method answers for the base: never)
        if not self._done and all(_TRANSFER_DONE(transfer) for transfer in self._transfers):
            self.complete()
        self._relay("is_completed")
        return self._done

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self):
        return self._error

    def result(self) -> Any:
        return self._result

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            self.complete()
            future: torch.futures.Future = torch.futures.Future()
            future.set_result(self._result)
            self._future = future
        if threading.get_ident() in self._relaying:
            return self._future
        relayed = self._relay("get_future")
        return self._future if relayed is _NOT_RELAYED else relayed
