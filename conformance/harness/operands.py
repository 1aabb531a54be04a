"""Operand naming through storages: which of a recording's named tensors an op reads or writes.

A recording (:mod:`conformance.harness.probes`) names the storages of the
tensors a case hands the implementation; every op dispatched while it records
carries the names of the storages it reads into the storages it writes, so a
collective's operands are known by name however the implementation views,
copies or reshapes them.  Storages are keyed by address and kept alive while
recording, so no address is reused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol


class CollectiveLog(Protocol):
    """What operand naming reads and writes of a recording's log
    (:class:`conformance.harness.probes.collective_log.CollectiveLog`)."""

    _lazy: dict[int, int]  #: storage address of a functional collective's result -> its call
    _names: dict[int, tuple[Any, frozenset[str]]]  #: storage address -> (the storage, kept alive; its names)

    def waited(self, index: int) -> None: ...


def tensors(value: Any) -> Iterator[Any]:
    from torch import Tensor

    if isinstance(value, Tensor):
        yield value
        return
    if not isinstance(value, (list, tuple)):
        return
    for item in value:
        if isinstance(item, Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            yield from (t for t in item if isinstance(t, Tensor))


def storage_of(tensor: Any) -> Any:
    try:
        return tensor.untyped_storage()
    except Exception:  # noqa: BLE001 - a tensor subclass without storage
        return None


def storage_key(tensor: Any) -> int:
    """The address of ``tensor``'s storage, from its own (no storage object is made: this runs on every op)."""
    try:
        return int(tensor.data_ptr() - tensor.storage_offset() * tensor.element_size())
    except Exception:  # noqa: BLE001 - a tensor subclass without storage
        return 0


def storage_keys(value: Any) -> list[int]:
    return [key for key in map(storage_key, tensors(value)) if key]


def names_of(log: CollectiveLog, args: Any, kwargs: Any) -> frozenset[str]:
    """The names an op's tensor arguments carry (this runs on every op while a name is given: kept lean)."""
    names: frozenset[str] = frozenset()
    known = log._names
    for value in (*args, *kwargs.values()) if kwargs else args:
        for tensor in tensors(value):
            entry = known.get(storage_key(tensor))
            if entry is not None:
                names |= entry[1]
    return names


def name_storages(log: CollectiveLog, values: list[Any], names: frozenset[str]) -> None:
    """Give ``names`` to the storages of ``values`` (kept alive while recording, so no address is reused)."""
    for value in values:
        for tensor in tensors(value):
            storage = storage_of(tensor)
            if storage is None or storage.nbytes() == 0:
                continue
            ptr = storage.data_ptr()
            entry = log._names.get(ptr)
            log._names[ptr] = (storage, names | (entry[1] if entry else frozenset()))


def written_arguments(func: Any, args: Any, kwargs: Any) -> list[Any]:
    """The arguments an op writes into (``out=``, in-place, a collective's output buffers)."""
    written = []
    for index, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = kwargs.get(argument.name, args[index] if index < len(args) else None)
            if value is not None:
                written.append(value)
    return written


def note_lazy_waits(log: CollectiveLog, args: Any, kwargs: Any) -> None:
    for value in [*args, *kwargs.values()]:
        for ptr in storage_keys(value):
            index = log._lazy.pop(ptr, None)
            if index is not None:
                log.waited(index)


def shapes(args: Any) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for arg in args for t in tensors(arg)]
