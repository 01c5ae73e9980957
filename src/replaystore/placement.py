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

Three more rules make a placed part work in every process that constructs it over the same arrays:

- **Allocate everything at construction.** While :func:`placing` is true, a part allocates now
  every array it may need later (structures it would otherwise build lazily, e.g. when a table
  leaves ring mode): an allocation made after construction would not be placed.
- **Unique names.** :func:`scope` prefixes the names allocated inside it (the Table binds its
  sampler under ``"sampler."`` and its remover under ``"remover."``); a name allocated twice in
  one placement is an error of the allocator.
- **Scalars are published, not placed** (the *scalar hook*). A part's few mutable scalars (sizes,
  heads, counts) stay Python attributes, so in-process code pays nothing; the part lists them in
  a class attribute ``SCALARS`` (names of ``int`` attributes) and/or ``FLOAT_SCALARS`` (``float``
  attributes), and may name sub-objects with scalars of their own in a method
  ``scalar_parts() -> dict[str, object]`` (recursively). ``HostedTable.scalar_parts()``
  (:mod:`replaystore.table.host`) lists the table's parts (its state, rate limiter, key index,
  sampler, remover, episode index, and the host's own, e.g. a shared table's episode sync); a placed
  (shared) table gathers every listed attribute when a process leaves its lock and sets them in
  a process that enters after another one changed them (``HostedTable.state_scalars`` /
  ``load_state_scalars``). The listed objects must stay the same for the table's life: a placed
  part resets and refills its sub-objects, it never replaces them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

Allocator = Callable[[str, tuple, np.dtype, Any], np.ndarray]

_current: ContextVar[Allocator | None] = ContextVar("replaystore_placement", default=None)
_prefix: ContextVar[str] = ContextVar("replaystore_placement_prefix", default="")


def allocate(name: str, shape: tuple, dtype: Any, fill: Any = 0) -> np.ndarray:
    """A new array of ``shape``/``dtype`` holding ``fill``, from the current placement (default: NumPy)."""
    allocator = _current.get()
    dtype = np.dtype(dtype)
    if allocator is None:
        if np.isscalar(fill) and fill == 0:
            return np.zeros(shape, dtype=dtype)
        return np.full(shape, fill, dtype=dtype)
    return allocator(_prefix.get() + name, tuple(int(s) for s in shape), dtype, fill)


def placing() -> bool:
    """Whether :func:`allocate` goes to a placement (inside :func:`placed`): allocate eagerly then."""
    return _current.get() is not None


@contextmanager
def scope(prefix: str) -> Iterator[None]:
    """Prefix the names allocated in this block with ``prefix`` (nested scopes concatenate)."""
    token = _prefix.set(_prefix.get() + prefix)
    try:
        yield
    finally:
        _prefix.reset(token)


@contextmanager
def placed(allocator: Allocator | None) -> Iterator[None]:
    """Route :func:`allocate` calls made in this context to ``allocator`` until the block ends."""
    token = _current.set(allocator)
    try:
        yield
    finally:
        _current.reset(token)


def unplaced() -> AbstractContextManager[None]:
    """Allocate with NumPy in this block, even inside :func:`placed`.

    For a part that every process keeps a copy of its own (the episode index of a shared table is
    a per-process replica, kept equal to the segment's truth by ``replaystore.shared.episodes``).
    """
    return placed(None)


__all__ = ["Allocator", "allocate", "placed", "placing", "scope", "unplaced"]
