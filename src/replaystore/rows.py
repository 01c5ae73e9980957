"""Row copies of the small-call hot path: compiled when ``replaystore._rows`` is built, else NumPy.

The functions below, one contract in both versions (the compiled one is ``_rows.c``):

- ``copy_rows(columns, sources, start, n, batched[, hi_word, written_hi]) -> bool``: copy ``sources[i]`` into rows
  ``start .. start + n - 1`` of ``columns[i]`` when every source has exactly the column's dtype
  and row shape (``(n, *shape)`` when ``batched``, ``shape`` for one row, where a 0-d field may
  also be a Python bool, int or float that NumPy casts "same_kind"), and return ``True``;
  otherwise write nothing and return ``False`` (the caller's general path then raises the
  precise error). Columns are C-contiguous ``(capacity, *shape)`` arrays; sources that are not
  C-contiguous are refused too (the general path copies them). With ``hi_word`` (a shared table's
  *written_hi* word: a writable int64 vector, its element 0) that word is raised to
  ``written_hi`` (a larger value stays) before any payload is written (a fence between,
  compiled: ``replaystore.shared.reads`` relies on it).
- ``fill_meta(meta, start, n, version, priority)``: rows ``start .. start + n - 1`` of a table's
  metadata (``META_WIDTH``, below) become times sampled 0, ``version`` and ``priority``.
- ``add_row(columns, sources, start, meta, version, priority) -> bool``: ``copy_rows`` of
  one item and, if it copied, ``fill_meta`` of its row: one call per single add.
- ``fill_keys(out, slots, key_column, lo, base, capacity)``: column 0 (the key) of sample rows:
  ``key_column[slot]`` out of ring mode, ``lo + (slot - (lo - base)) mod capacity`` in ring mode
  (``key_column`` ``None``).
- ``ring_draw(uniforms, size, start, capacity, out)``: ``out[i] = (start + floor(uniforms[i] *
  size)) % capacity``: the slots of a ring's uniform draw (``RingIndex.sample``).
- ``touch_draw(uniforms, meta) -> int``: read the metadata rows a full ring's uniform draw of
  ``uniforms`` will take (a cache warm-up; the NumPy version does nothing).
- ``ring_lookup(keys, lo, hi, base, capacity, out)``: ``out[i]`` is the slot of ``keys[i]`` in a
  ring whose live keys are ``[lo, hi)`` (key ``base`` in slot 0), ``-1`` for keys not live.
- ``last_occurrences(slots, scratch, mask) -> bool``: ``mask[i]``: position ``i`` is the last of its
  slot; ``True`` when all are distinct. ``scratch``: ``capacity`` int64, all ``-1`` (left so).
- ``count_samples(meta, slots, out)``: add one to ``times_sampled`` of each slot (a repeated slot
  counts each time) and gather the slots' rows (with the new counts) into ``out``, a
  ``(len(slots), 4)`` int64 array of *sample rows* (``ROW_*``, below: the stored row widened),
  but for their keys (column 0: ``fill_keys``).

- ``gather_rows(columns, slots, outs[, meta, meta_out[, key_column, lo, base]]) -> bool``:
  ``outs[i][j] = columns[i][slots[j]]`` for every column (the compiled one copies every column's
  row of a slot together, prefetching ahead, so the cache misses overlap); with
  ``meta``/``meta_out`` it also does ``count_samples``, and with ``key_column, lo, base``
  ``fill_keys`` of ``meta_out``. ``False`` (nothing written) when shapes, dtypes or slots do not fit.

- ``RingWriter`` and ``FastMethod`` (compiled only, else ``None``; ``replaystore._ring``): a
  ring-mode table's whole single ``add`` / small ``extend`` as one call into C (the lock, the
  checks, the copy, the metadata row, the ring and limiter counters); ``Table.add`` and
  ``Table.extend`` are ``FastMethod`` descriptors that fall back to the Python methods for every
  call the compiled path does not take (see ``replaystore.table.fast``).

The metadata layout (one row per slot, ``(capacity, META_WIDTH)`` int64, 16 bytes): word 0 two
int32 halves, ``times_sampled`` (int32 column ``META_TIMES_SAMPLED`` of the row viewed as int32)
and ``version`` (``META_VERSION``), word 1 the priority's float64 bits. A table that keeps no
per-item priorities (its sampler and remover read none: ``Selector.reads_priorities``) has the
narrow row, ``(capacity, META_WIDTH_NO_PRIORITY)``, 8 bytes: word 0 alone; every function here
takes either width (the compiled ones too), writes no priority to a narrow row and widens it
with ``UNKEPT_PRIORITY`` as its priority. The key is not in the row: in ring mode it is implicit
(the slot's ring arithmetic, ``keys.RingIndex``), out of ring mode the table's key column
(``KeyIndex.key_of_slot``). Versions therefore lie in ``[VERSION_MIN, VERSION_MAX]`` (the table
refuses others with a named error) and a count stops at ``2**31 - 1``; :func:`meta_columns` gives
the three column views, :func:`sample_rows` the widened rows of some slots. The earlier layouts
and what became of their segments and checkpoints: docs/architecture.md, "Per-slot metadata in
one row".

None of them locks (but ``FastMethod``, which takes the table's lock): the table calls them under
its lock. ``COMPILED`` says which version runs;
``REPLAYSTORE_PURE_PYTHON=1`` in the environment forces the NumPy one (the test suite runs the
core tests both ways).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

#: int64 words per slot of a table's metadata rows: (times_sampled, version) as int32, priority.
META_WIDTH = 2
#: int32 columns of the metadata viewed as int32: times sampled and version.
META_TIMES_SAMPLED, META_VERSION = 0, 1
#: int64 word of the priority's float64 bits.
META_PRIORITY = 1
#: int64 words per slot of a table that keeps no per-item priorities: (times_sampled, version).
META_WIDTH_NO_PRIORITY = 1
#: The priority every item of such a table reports (``Sample.priorities``, ``info``, checkpoints).
UNKEPT_PRIORITY = 1.0
_UNKEPT_BITS = np.float64(UNKEPT_PRIORITY).view(np.int64)
#: Columns of a sample row ``(n, 4)`` int64: key, times sampled, version, priority bits.
ROW_KEY, ROW_TIMES_SAMPLED, ROW_VERSION, ROW_PRIORITY = 0, 1, 2, 3
#: The range of an item's (and the table's) version: int32.
VERSION_MIN, VERSION_MAX = -(2**31), 2**31 - 1
#: The largest times_sampled a slot holds (the count saturates there).
TIMES_SAMPLED_MAX = 2**31 - 1


class UnkeptPriorities:
    """The priority column of a narrow metadata row: reads give ``UNKEPT_PRIORITY``, writes are dropped.

    Indexing returns a new float64 array of ``UNKEPT_PRIORITY`` of the shape the index would take
    from a ``(n,)`` array; item assignment does nothing. Thread-safe (no state).
    """

    __slots__ = ("_ones",)

    def __init__(self, n: int) -> None:
        self._ones = np.broadcast_to(np.float64(UNKEPT_PRIORITY), (int(n),))

    def __len__(self) -> int:
        return len(self._ones)

    def __getitem__(self, index: object) -> np.ndarray:
        return np.array(self._ones[index], dtype=np.float64)

    def __setitem__(self, index: object, value: object) -> None:
        pass  # (a table that keeps no per-item priorities: given ones are not stored)


def meta_columns(meta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(times_sampled int32, versions int32, priorities float64)``: writable views of ``meta``.

    For a narrow row (``META_WIDTH_NO_PRIORITY``) the priorities are an :class:`UnkeptPriorities`.
    """
    pair = meta[:, 0:1].view(np.int32)  # (word 0 alone: also a view of a zero-stride stand-in)
    if meta.shape[1] <= META_PRIORITY:
        return pair[:, META_TIMES_SAMPLED], pair[:, META_VERSION], UnkeptPriorities(len(meta))  # type: ignore[return-value]
    prio = meta[:, META_PRIORITY : META_PRIORITY + 1].view(np.float64)[:, 0]
    return pair[:, META_TIMES_SAMPLED], pair[:, META_VERSION], prio


def widen_rows(stored: np.ndarray, keys: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Sample rows ``(n, 4)`` int64 (key, times sampled, version, priority bits) of stored rows (2 or 1 words).

    ``keys``: the rows' keys (the row does not hold them).
    """
    if out is None:
        out = np.empty((len(stored), 4), dtype=np.int64)
    out[:, ROW_KEY] = keys
    s32 = np.ascontiguousarray(stored).view(np.int32)
    out[:, ROW_TIMES_SAMPLED] = s32[:, META_TIMES_SAMPLED]
    out[:, ROW_VERSION] = s32[:, META_VERSION]
    out[:, ROW_PRIORITY] = stored[:, META_PRIORITY] if stored.shape[1] > META_PRIORITY else _UNKEPT_BITS
    return out


def sample_rows(meta: np.ndarray, slots: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The sample rows ``(len(slots), 4)`` int64 of ``slots`` (their metadata widened, ``keys`` theirs; reads only)."""
    flat = np.asarray(slots, dtype=np.int64).ravel()
    return widen_rows(meta.take(flat, axis=0), np.asarray(keys).ravel()).reshape((*np.shape(slots), 4))


# Python scalar type -> field dtype kinds it may be cast into (NumPy "same_kind" from its default dtype)
_PY_KINDS = {bool: "biufc", int: "iufc", float: "fc"}


def _copy_rows_py(
    columns: tuple,
    sources: tuple,
    start: int,
    n: int,
    batched: bool,
    hi_word: np.ndarray | None = None,
    written_hi: int = 0,
) -> bool:
    if len(columns) != len(sources) or (not batched and n != 1):
        return False
    values = []
    for col, src in zip(columns, sources):
        if start < 0 or start + n > len(col):
            return False
        if type(src) is np.ndarray or isinstance(src, np.generic):
            want = (n, *col.shape[1:]) if batched else col.shape[1:]
            if src.dtype != col.dtype or src.shape != want or not src.flags.c_contiguous:
                return False
            values.append(src)
        elif not batched and col.ndim == 1 and col.dtype.kind in _PY_KINDS.get(type(src), ""):
            try:
                values.append(col.dtype.type(src))  # OverflowError for an int out of range
            except (OverflowError, ValueError):
                return False
        else:
            return False
    if hi_word is not None:  # (written_hi first, as the compiled one: only the order of two writes)
        hi_word[0] = max(int(hi_word[0]), written_hi)
    for col, v in zip(columns, values):
        if batched:
            col[start : start + n] = v
        else:
            col[start] = v
    return True


def _fill_meta_py(meta: np.ndarray, start: int, n: int, version: int, priority: float) -> None:
    times, versions, priorities = meta_columns(meta[start : start + n])
    times[:] = 0
    versions[:] = version
    priorities[:] = priority


def _add_row_py(columns: tuple, sources: tuple, start: int, meta: np.ndarray, version: int, priority: float) -> bool:
    if not _copy_rows_py(columns, sources, start, 1, False):
        return False
    _fill_meta_py(meta, start, 1, version, priority)
    return True


def _fill_keys_py(
    out: np.ndarray, slots: np.ndarray, key_column: np.ndarray | None, lo: int, base: int, capacity: int
) -> None:
    if len(slots) and (slots.min() < 0 or slots.max() >= capacity):
        raise ValueError("fill_keys: a slot is out of range")
    if key_column is not None:
        out[:, ROW_KEY] = key_column[slots]
    else:
        out[:, ROW_KEY] = lo + (slots - (lo - base)) % capacity


def _ring_draw_py(uniforms: np.ndarray, size: int, start: int, capacity: int, out: np.ndarray) -> None:
    np.copyto(out, uniforms * size, casting="unsafe")
    np.minimum(out, size - 1, out=out)
    if start:
        out += start
        out[out >= capacity] -= capacity


def _touch_draw_py(uniforms: np.ndarray, meta: np.ndarray) -> int:
    return 0  # (a warm-up only: without the compiled loop it would cost more than it saves)


def _ring_lookup_py(keys: np.ndarray, lo: int, hi: int, base: int, capacity: int, out: np.ndarray) -> None:
    np.copyto(out, np.where((keys >= lo) & (keys < hi), (keys - base) % capacity, -1))


def _last_occurrences_py(slots: np.ndarray, scratch: np.ndarray, mask: np.ndarray) -> bool:
    # np.maximum.at is unbuffered, so defined for repeated indices: each slot's last position
    pos = np.arange(len(slots))
    np.maximum.at(scratch, slots, pos)
    np.equal(scratch[slots], pos, out=mask)
    scratch[slots] = -1
    return bool(mask.all())


def _count_samples_py(meta: np.ndarray, slots: np.ndarray, out: np.ndarray) -> None:
    times = meta.view(np.int32)[:, META_TIMES_SAMPLED]
    np.add.at(times, slots, 1)
    wrapped = slots[times[slots] < 0]  # (int32: a count past 2**31 - 1 wrapped; it saturates instead)
    if len(wrapped):
        times[wrapped] = TIMES_SAMPLED_MAX
    keys = out[:, ROW_KEY].copy()  # (left as they are: fill_keys writes them)
    widen_rows(meta.take(slots, axis=0), keys, out)


def _gather_rows_py(
    columns: tuple,
    slots: np.ndarray,
    outs: tuple,
    meta: np.ndarray | None = None,
    meta_out: np.ndarray | None = None,
    key_column: Any = False,
    lo: int = 0,
    base: int = 0,
) -> bool:
    if len(columns) != len(outs) or any(
        c.dtype != o.dtype or o.shape != (len(slots), *c.shape[1:]) for c, o in zip(columns, outs)
    ):
        return False
    if len(slots) and (slots.min() < 0 or slots.max() >= min(len(c) for c in columns)):
        return False
    for c, o in zip(columns, outs):
        np.take(c, slots, axis=0, out=o, mode="clip")  # in range (checked); "raise" would buffer out
    if meta is not None and meta_out is not None:
        if key_column is not False and key_column is not None and key_column.shape != (len(meta),):
            return False
        _count_samples_py(meta, slots, meta_out)
        if key_column is not False:
            _fill_keys_py(meta_out, slots, key_column, lo, base, len(meta))
    return True


try:
    if os.environ.get("REPLAYSTORE_PURE_PYTHON", "") not in ("", "0"):
        raise ImportError("REPLAYSTORE_PURE_PYTHON is set")
    from ._rows import (
        add_row,
        copy_rows,
        count_samples,
        fill_keys,
        fill_meta,
        gather_rows,
        last_occurrences,
        ring_draw,
        ring_lookup,
        touch_draw,
    )

    COMPILED = True
except ImportError:  # not built (no compiler at install time), or refused: the same contract in NumPy
    copy_rows, fill_meta, count_samples, gather_rows = _copy_rows_py, _fill_meta_py, _count_samples_py, _gather_rows_py
    add_row, ring_draw, ring_lookup, fill_keys = _add_row_py, _ring_draw_py, _ring_lookup_py, _fill_keys_py
    last_occurrences, touch_draw = _last_occurrences_py, _touch_draw_py
    COMPILED = False

try:  # the compiled Table.add / small extend (replaystore._ring; needs NumPy's headers at build time)
    if os.environ.get("REPLAYSTORE_PURE_PYTHON", "") not in ("", "0"):
        raise ImportError("REPLAYSTORE_PURE_PYTHON is set")
    from ._ring import FastMethod, RingWriter
except ImportError:  # not built: Table.add / extend are the Python methods (the reference)
    FastMethod = RingWriter = None

__all__ = [
    "FastMethod",
    "RingWriter",
    "COMPILED",
    "META_PRIORITY",
    "META_TIMES_SAMPLED",
    "META_VERSION",
    "META_WIDTH",
    "META_WIDTH_NO_PRIORITY",
    "UNKEPT_PRIORITY",
    "UnkeptPriorities",
    "ROW_KEY",
    "ROW_PRIORITY",
    "ROW_TIMES_SAMPLED",
    "ROW_VERSION",
    "TIMES_SAMPLED_MAX",
    "VERSION_MAX",
    "VERSION_MIN",
    "add_row",
    "copy_rows",
    "count_samples",
    "fill_keys",
    "fill_meta",
    "gather_rows",
    "last_occurrences",
    "meta_columns",
    "sample_rows",
    "widen_rows",
    "ring_draw",
    "ring_lookup",
    "touch_draw",
]
