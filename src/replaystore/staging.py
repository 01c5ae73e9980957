"""AddStager: write-combining for ``Table.add`` of one item at a time.

Inserting one item through the general path costs a dozen small NumPy calls of bookkeeping (key
index, selectors, eviction, metadata). The stager instead validates the item against the column
spec, copies its fields into a row of small staging arrays, and lets the table insert the staged
rows as one batch later. The table flushes the stager before any other operation (sample,
update, delete, stats, save, ...), so staged items are invisible to nobody: they have their keys
already, and every read sees them.

``try_stage`` either stages the whole item or returns ``False`` having changed nothing observable
(a half-written row is simply not counted), so the caller can fall back to the general path, which
raises the precise error for bad input.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .storage.spec import Field

# Python scalar type -> field dtype kinds it may be cast into (NumPy "same_kind" from its default dtype)
_PY_KINDS = {bool: "biufc", int: "iufc", float: "fc", complex: "c"}


class AddStager:
    """Staging rows for single-item adds into a flat (non-nested) column storage.

    Args:
        spec: the storage's flat spec.
        rows: how many items to collect before the table must flush.
        skip: fields a subclass stages itself (they must still be present in each item).
    """

    def __init__(self, spec: dict[str, Field], rows: int = 256, skip: tuple[str, ...] = ()) -> None:
        self.rows = rows
        self.names = frozenset(spec)
        self.fields = []
        for name, f in spec.items():
            if name in skip:  # staged by a subclass
                continue
            stage = np.empty((rows, *f.shape), dtype=f.dtype)
            # Python scalar types accepted without a cast error (NumPy "same_kind" for 0-d fields)
            py_ok = tuple(t for t, kinds in _PY_KINDS.items() if f.dtype.kind in kinds) if f.shape == () else ()
            self.fields.append((name, f.shape, f.dtype, stage, py_ok))
        self.priorities = np.empty(rows, dtype=np.float64)
        self.versions = np.empty(rows, dtype=np.int64)
        self.n = 0

    def try_stage(self, item: Any, priority: float, version: int) -> bool:
        """Stage ``item`` in the next row; ``False`` (nothing staged) if it needs the general path."""
        if type(item) is not dict or item.keys() != self.names:
            return False
        i = self.n
        for name, shape, dtype, stage, py_ok in self.fields:
            v = item[name]
            t = type(v)
            if t is np.ndarray or isinstance(v, np.generic):
                vd = v.dtype
                if (vd is not dtype and vd != dtype) or v.shape != shape:  # `is`: builtin dtypes are shared
                    return False
            elif t not in py_ok:
                return False
            try:
                stage[i] = v
            except (OverflowError, ValueError, TypeError):
                return False
        self.priorities[i] = priority
        self.versions[i] = version
        self.n = i + 1
        return True

    def take(self) -> tuple[tuple, int, np.ndarray, np.ndarray]:
        """The staged rows as ``(prepared columns, n, priorities, versions)``; empties the stager.

        The returned arrays are views of the staging rows: the caller must consume them (write
        them to the storage) before staging again.
        """
        n = self.n
        self.n = 0
        columns = {name: stage[:n] for name, _, _, stage, _ in self.fields}
        return (columns, None), n, self.priorities[:n], self.versions[:n]
