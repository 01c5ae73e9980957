"""Argument checks and small helpers the Table's modules share (no table state)."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import InvalidArgument, InvalidPriority
from ..rows import VERSION_MAX, VERSION_MIN
from ..storage import ColumnStorage, MemmapColumnStorage, ObjectStorage, Storage

#: a rate limiter's ``max_diff`` when inserts are never limited (MinSize)
NO_LIMIT = sys.float_info.max


def as_int(value: Any, what: str) -> int:
    """``value`` as an int, or :class:`InvalidArgument` (floats only when integral)."""
    try:
        out = int(value)
        exact = out == value
    except (TypeError, ValueError, OverflowError):
        exact = False
    if not exact or isinstance(value, (bool, np.bool_)):
        raise InvalidArgument(f"{what} must be an integer, got {value!r}")
    return out


def as_version(value: Any) -> int:
    """``value`` as a model version (an int32: the metadata row keeps versions so), or :class:`InvalidArgument`."""
    out = as_int(value, "version")
    if not VERSION_MIN <= out <= VERSION_MAX:
        raise InvalidArgument(f"version must lie in [{VERSION_MIN}, {VERSION_MAX}] (int32), got {out}")
    return out


def as_count(value: Any, what: str) -> int:
    """``value`` as an int ``>= 1``, or :class:`InvalidArgument`."""
    n = as_int(value, what)
    if n < 1:
        raise InvalidArgument(f"{what} must be >= 1, got {value!r}")
    return n


def as_priorities(priorities: Any, n: int, nonnegative: bool, of: Any = "a prioritized table") -> np.ndarray:
    """``priorities`` as ``n`` float64 values (a scalar is broadcast): every mode's one check.

    Raises:
        InvalidPriority: not one value (or one per row), NaN or infinite values, negative ones
            when ``nonnegative`` (the message names ``of``, the sampler that needs them).
    """
    p = np.asarray(priorities, dtype=np.float64)
    if p.ndim == 0:
        p = np.full(n, float(p))
    if p.shape != (n,):
        raise InvalidPriority(f"expected {n} priorities, got {p.size} values for {n} keys (shape {p.shape})")
    # (fast path: a finite sum has no NaN or infinity in it; a sum that overflowed is checked below)
    if n and math.isfinite(p.sum()) and (not nonnegative or p.min() >= 0):
        return p
    bad = ~np.isfinite(p)
    if bad.any():
        raise InvalidPriority(f"priorities must be finite: got {p[bad][:5].tolist()}")
    if nonnegative and (p < 0).any():
        raise InvalidPriority(f"priorities must be >= 0 for {of}: got {p[p < 0][:5].tolist()}")
    return p


def as_keys(keys: Any) -> np.ndarray:
    """Item keys as a one-dimensional int64 array (a scalar is one key), or :class:`InvalidArgument`.

    Integer arrays and lists pass; floats only when every value is integral; anything else
    (strings, nested or ragged lists, 2-D arrays) is refused rather than silently cast.
    """
    if isinstance(keys, np.ndarray) and keys.dtype == np.int64 and keys.ndim == 1:
        return keys
    try:
        arr = np.asarray(keys)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"keys must be integers, got {type(keys).__name__} ({e})") from None
    if arr.ndim > 1:
        raise InvalidArgument(f"keys must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind in "iu":
        return np.atleast_1d(arr.astype(np.int64, copy=False))
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind == "f" and np.isfinite(arr).all() and (arr == np.round(arr)).all():
        return np.atleast_1d(arr.astype(np.int64))
    raise InvalidArgument(f"keys must be integers, got dtype {arr.dtype}")


def check_part(value: Any, base: type, what: str, example: str) -> None:
    """Raise :class:`InvalidArgument` unless ``value`` is ``None`` or an instance of ``base``.

    The message says what was given (a class instead of an instance, a string, a number) and what
    was expected: ``example`` is an instance to write instead, e.g. ``"rs.Prioritized()"``.
    """
    if value is None or isinstance(value, base):
        return
    if isinstance(value, type) and issubclass(value, base):
        got = f"the class {value.__name__}: pass an instance, {what}=rs.{value.__name__}()"
    elif isinstance(value, str):
        got = f"the string {value!r}: pass an instance such as {what}={example}"
    else:
        got = f"{type(value).__name__} {value!r}: pass an instance such as {what}={example}"
    raise InvalidArgument(f"{what} must be an instance of {base.__name__} (or None), got {got}")


def make_storage(storage: str | Storage | None, capacity: int, spec: Mapping | None) -> Storage:
    """The storage a Table's ``storage=`` argument names (see :class:`~replaystore.Table`)."""
    if storage is None or storage == "columns":
        return ColumnStorage(capacity, spec)
    if storage == "objects":
        return ObjectStorage(capacity)
    if isinstance(storage, (str, os.PathLike)) and str(storage).startswith("memmap:"):
        return MemmapColumnStorage(capacity, str(storage)[len("memmap:") :], spec)
    if isinstance(storage, Storage):
        if storage.capacity != capacity:
            raise InvalidArgument(f"storage capacity {storage.capacity} != table capacity {capacity}")
        return storage
    raise InvalidArgument(f"storage must be 'columns', 'objects', 'memmap:<dir>' or a Storage, got {storage!r}")


def as_slice_if_contiguous(slots: np.ndarray) -> slice | np.ndarray:
    """``slots`` as a slice when they are consecutive and ascending (slice writes are much faster)."""
    n = len(slots)
    # n strictly increasing integers whose ends are n - 1 apart are consecutive
    if n > 1 and slots[-1] - slots[0] == n - 1 and (n < 3 or bool((slots[:-1] < slots[1:]).all())):
        return slice(int(slots[0]), int(slots[0]) + n)
    return slots


def subset(storage: Storage, prepared: Any, idx: np.ndarray) -> Any:
    """The items ``idx`` of a batch ``storage.prepare`` made."""
    if isinstance(storage, ObjectStorage):
        return [prepared[i] for i in idx.tolist()]
    columns, spec = prepared
    return {p: a[idx] for p, a in columns.items()}, spec
