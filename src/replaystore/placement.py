"""Where a table's per-slot arrays live: ordinary NumPy memory, or a placement chosen by the caller.

The Table and its parts allocate their large, per-slot state arrays (the metadata rows, the
``Prioritized`` sum and min trees, the storage columns) through :func:`allocate`, under a name
that says what the array is (``"table.meta"``, ``"prioritized.sum"``, ``"columns/obs"``). By
default that is a new NumPy array filled with ``fill``: exactly what the parts did before.

Inside ``with placed(allocator):`` every call goes to ``allocator(name, shape, dtype, fill)``
instead, which returns a C-contiguous writable array of that shape and dtype (already holding its
initial contents). :mod:`replaystore.shared` uses it to put a Table's state into a shared-memory
segment: first with an allocator that only records what is asked for (to size the segment),
then with one that hands out views of the segment (filled when the segment is created, as found
when a process attaches to it).

Contract for the parts: an array obtained here is the part's state; the part must not overwrite
it wholesale after allocation (an attached process would erase the live table); ``fill`` is a
scalar or a row that broadcasts over ``shape``. The placement is per thread and per context
(a :class:`contextvars.ContextVar`), so concurrent construction elsewhere is unaffected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

Allocator = Callable[[str, tuple, np.dtype, Any], np.ndarray]

_current: ContextVar[Allocator | None] = ContextVar("replaystore_placement", default=None)


def allocate(name: str, shape: tuple, dtype: Any, fill: Any = 0) -> np.ndarray:
    """A new array of ``shape``/``dtype`` holding ``fill``, from the current placement (default: NumPy)."""
    allocator = _current.get()
    dtype = np.dtype(dtype)
    if allocator is None:
        if np.isscalar(fill) and fill == 0:
            return np.zeros(shape, dtype=dtype)
        return np.full(shape, fill, dtype=dtype)
    return allocator(name, tuple(int(s) for s in shape), dtype, fill)


@contextmanager
def placed(allocator: Allocator) -> Iterator[None]:
    """Route :func:`allocate` calls made in this context to ``allocator`` until the block ends."""
    token = _current.set(allocator)
    try:
        yield
    finally:
        _current.reset(token)


__all__ = ["Allocator", "allocate", "placed"]
