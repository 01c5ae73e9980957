"""A logged table's calls as records: their data, requests and step flags as arrays, and back.

:class:`~replaystore.wal.logged.LoggedTable` logs each call as a record of the write-ahead log
(:mod:`~replaystore.wal.format`: a JSON header and NumPy arrays, never pickles). These are the
conversions: a batch's leaves as raw arrays with a flag for Python scalars and lists (which the
table converts leniently, and replay passes back as lists), an insert's priorities and versions,
a step write's streams and end flags; and back, from a record read from disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SpecError
from ..storage.spec import flatten, unflatten
from .format import Record, check_arrays

LOOSE = (bool, int, float, complex, list, tuple)  # what a column storage converts leniently


def encode_data(data: Any) -> tuple[dict[str, np.ndarray], dict[str, int], Any]:
    """``(arrays, flags, data for the table)``: every leaf as an array; the table gets these arrays.

    Flag 1: the leaf was a Python scalar or list, which the table converts leniently (and replay
    passes it back as a list).
    """
    if not isinstance(data, Mapping):
        raise SpecError(f"a logged table takes a dict of arrays, got {type(data).__name__}")
    flat = flatten(data)
    arrays: dict[str, np.ndarray] = {}
    flags: dict[str, int] = {}
    applied: dict[str, Any] = {}
    for path, leaf in flat.items():
        loose = isinstance(leaf, LOOSE)
        try:
            arr = leaf if isinstance(leaf, np.ndarray) else np.asarray(leaf)
        except ValueError as e:
            raise SpecError(f"field {path!r}: cannot convert to an array ({e})") from None
        arrays[path] = arr
        flags[path] = int(loose)
        applied[path] = leaf if loose else arr
    try:
        check_arrays(arrays)
    except TypeError as e:
        raise SpecError(str(e)) from None
    return arrays, flags, unflatten(applied)


def decode_data(rec: Record) -> Any:
    """A record's data as the table took it (flagged leaves as lists)."""
    return unflatten({name: arr.tolist() if rec.flags.get(name) else arr for name, arr in rec.arrays.items()})


def optional(head: Mapping[str, np.ndarray], name: str) -> Any:
    """The head array ``name`` (a 0-d one as a Python scalar), or ``None`` if the record has none."""
    a = head.get(name)
    return None if a is None else (a.item() if a.ndim == 0 else a)


def request_arrays(priorities: Any, version: Any) -> dict[str, Any]:
    """The insert's priorities and versions as the arrays to log (and to pass to the table)."""
    head: dict[str, Any] = {}
    if priorities is not None:
        head["priorities"] = np.asarray(priorities, dtype=np.float64)
    if version is not None:
        v = np.asarray(version)
        if v.dtype.kind not in "iub":
            raise SpecError(f"version must be an integer or an array of integers, got dtype {v.dtype}")
        head["version"] = v.astype(np.int64)
    return head


def step_arrays(streams: Any, terminated: Any, truncated: Any) -> dict[str, np.ndarray]:
    """A step write's stream ids and end flags as the table took them (so: valid), as arrays to log."""
    out = {"streams": np.asarray(streams, dtype=np.int64)}
    for name, flags in (("terminated", terminated), ("truncated", truncated)):
        if flags is not None:
            out[name] = np.asarray(flags).astype(bool)
    return out


__all__ = ["decode_data", "encode_data", "optional", "request_arrays", "step_arrays"]
