"""Pickles that cross the harness's process boundaries, with CPU tensor storages sent as their bytes.

Tasks go from the pytest process (or the rank server) to the ranks, and
outcomes come back the same way, as pickles.  torch pickles each storage
through ``torch.save``, a small archive per storage: about 0.12 ms to write
and 0.07 ms to read on the 2-core machine, for every tensor an outcome
carries (results, their copies, kept inputs); a rank server forwards both
unread (:attr:`~conformance.harness.case.RankTask.call`).  :func:`dumps` sends a CPU storage as its raw bytes
and its dtype instead (about 0.02 and 0.01 ms); everything else about a tensor
(shape, strides, offset, ``requires_grad``, its subclass) still goes through
torch's own reduction, and a storage on any other device is pickled by torch
as before.  Any ``pickle.loads`` reads the result.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
import threading
from typing import Any

PROTOCOL = pickle.HIGHEST_PROTOCOL
#: Unpickling imports what a pickle names (torch, for a tensor; a task's module): one thread at a time, since a
#: thread importing a submodule of a package another thread is half-way through importing fails.
_unpickling = threading.Lock()


def loads(data: bytes) -> Any:
    """``pickle.loads(data)``, one thread at a time (:data:`_unpickling`)."""
    with _unpickling:
        return pickle.loads(data)


def dumps(obj: Any) -> bytes:
    """``pickle.dumps(obj)``, CPU tensor storages as raw bytes (module docstring).

    It imports nothing: in the rank server one thread may be importing torch
    while another answers, and importing ``torch.storage`` beside a
    half-initialised torch fails.  Until torch has defined its storages no
    object here can hold one.
    """
    typed_storage = getattr(sys.modules.get("torch.storage"), "TypedStorage", None)
    if typed_storage is None:
        return pickle.dumps(obj, PROTOCOL)
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, PROTOCOL)
    pickler.dispatch_table = {**copyreg.dispatch_table, typed_storage: _reduce_storage}
    pickler.dump(obj)
    return buffer.getvalue()


def _reduce_storage(storage: Any) -> tuple[Any, ...]:
    import torch

    untyped = storage._untyped_storage  # a TypedStorage's own accessors warn that it is deprecated
    if untyped.device.type != "cpu":
        return storage.__reduce__()
    data = torch.empty(0, dtype=torch.uint8).set_(untyped).numpy().tobytes() if untyped.nbytes() else b""
    return _storage_from_bytes, (data, storage.dtype)


def _storage_from_bytes(data: bytes, dtype: Any) -> Any:
    import torch
    from torch.storage import TypedStorage

    untyped = torch.UntypedStorage.from_buffer(data, dtype=torch.uint8) if data else torch.UntypedStorage(0)
    return TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)
