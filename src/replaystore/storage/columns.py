"""Column storage: one preallocated NumPy array per field, indexed by slot.

The spec (shape and dtype of every field) is either given or inferred from the first item that
arrives; the arrays are allocated then, at full capacity. Nested dicts are stored as flat columns
named by path (see :mod:`replaystore.storage.spec`).

Dtype rule: an incoming ``np.ndarray``/NumPy scalar (or anything exposing ``__array__``, such as a
CPU torch tensor) must have exactly the field's dtype; a Python scalar or list is accepted when
NumPy can cast it ``same_kind`` (so ``reward=1.0`` fits a float32 field). Shapes must match exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SpecError
from ..placement import allocate
from ..rows import gather_rows
from .base import Storage
from .spec import SEP, Field, flatten, normalize_spec, reshape_leaves, unflatten

_PY_SCALARS = (bool, int, float, complex, list, tuple)


def as_array(path: str, value: Any) -> tuple[np.ndarray, bool]:
    """Field ``path``'s value as an array, and whether it is strict (see the module doc's dtype rule).

    Returns ``(np.asarray(value), strict)``: ``strict`` is False for a Python scalar or list
    (:func:`cast` may then cast it ``same_kind``), True when the value carried its own dtype (an
    ``np.ndarray`` is returned as is, not copied).

    Raises:
        SpecError: a ragged list that NumPy cannot make an array of.
    """
    if isinstance(value, np.ndarray):
        return value, True
    if isinstance(value, _PY_SCALARS):
        try:
            return np.asarray(value), False
        except ValueError as e:  # ragged lists
            raise SpecError(f"field {path!r}: cannot convert to an array ({e})") from None
    return np.asarray(value), True


def cast(path: str, arr: np.ndarray, strict: bool, dtype: np.dtype) -> np.ndarray:
    """``arr`` (from :func:`as_array`) as field ``path``'s ``dtype``: itself if it has it, else a cast copy.

    Raises:
        SpecError: the dtypes differ and ``arr`` is strict, or NumPy cannot cast ``same_kind``.
    """
    if arr.dtype == dtype:
        return arr
    if strict or not np.can_cast(arr.dtype, dtype, "same_kind"):
        raise SpecError(f"field {path!r}: expected dtype {dtype}, got {arr.dtype}")
    return arr.astype(dtype)


class ColumnStorage(Storage):
    """Preallocated NumPy columns for dicts (optionally nested) of arrays.

    Args:
        capacity: number of slots.
        spec: optional nested dict of :class:`Field` / ``(shape, dtype)``; inferred from the first
            item when omitted.
    """

    kind = "columns"

    def __init__(self, capacity: int, spec: Mapping | None = None) -> None:
        super().__init__(capacity)
        self.spec: dict[str, Field] | None = None
        self.columns: dict[str, np.ndarray] = {}
        self._rows: tuple = ()  # (names, columns, (row shape, dtype) of each) for gather_rows
        self._nested = False
        if spec is not None:
            self._adopt(normalize_spec(spec))

    @property
    def nested(self) -> bool:
        """Whether some field path is nested (``a/b``): items are then nested dicts."""
        return self._nested

    def set_spec(self, spec: Mapping) -> None:
        """Fix the field spec of a new, empty storage now (instead of from its first item)."""
        self._adopt(normalize_spec(spec))

    # -- spec -------------------------------------------------------------------------------
    def _adopt(self, spec: dict[str, Field]) -> None:
        self.spec = spec
        self._nested = any(SEP in p for p in spec)
        self.columns = {p: self._allocate(p, f) for p, f in spec.items()}
        self._index_rows()

    def _index_rows(self) -> None:
        """Note the columns for ``gather_rows`` (after the columns are (re)made)."""
        cols = tuple(self.columns.values())
        ok = cols and all(c.flags.c_contiguous for c in cols)
        self._rows = (tuple(self.columns), cols, tuple((c.shape[1:], c.dtype) for c in cols)) if ok else ()

    def _allocate(self, path: str, field: Field) -> np.ndarray:
        return allocate(f"columns/{path}", (self.capacity, *field.shape), field.dtype, 0)

    def _infer(self, flat: dict[str, Any], batched: bool) -> dict[str, Field]:
        spec = {}
        for path, value in flat.items():
            arr, _ = as_array(path, value)
            if arr.dtype == object:
                raise SpecError(f"field {path!r} has dtype object; use ObjectStorage for arbitrary Python items")
            if batched and arr.ndim == 0:
                raise SpecError(f"field {path!r}: a batch needs a leading batch axis, got a scalar")
            spec[path] = Field(tuple(arr.shape[1:] if batched else arr.shape), arr.dtype)
        return spec

    # -- Storage interface ----------------------------------------------------------------------
    def prepare(self, data: Any, batched: bool) -> tuple[tuple, int]:
        """Validate a dict item (or batch) against the spec; see the module doc for dtype rules.

        Returns ``((columns, new_spec), n)``: ``new_spec`` is the inferred spec when this is the
        first data the storage sees (adopted by :meth:`write`), else ``None``.
        """
        if not isinstance(data, Mapping):
            raise SpecError(
                f"column storage takes a dict of arrays, got {type(data).__name__}; "
                "use storage='objects' for arbitrary Python items"
            )
        flat = flatten(data)
        spec = self.spec if self.spec is not None else self._infer(flat, batched)
        if flat.keys() != spec.keys():
            missing = sorted(spec.keys() - flat.keys())
            extra = sorted(flat.keys() - spec.keys())
            raise SpecError(f"fields differ from the table's spec: missing {missing}, unexpected {extra}")
        out: dict[str, np.ndarray] = {}
        n = None
        for path, field in spec.items():
            arr, strict = as_array(path, flat[path])
            if batched:
                if arr.ndim == 0:
                    raise SpecError(f"field {path!r}: a batch needs a leading batch axis, got a scalar")
                if n is None:
                    n = arr.shape[0]
                elif arr.shape[0] != n:
                    raise SpecError(f"field {path!r}: batch size {arr.shape[0]} differs from the other fields' {n}")
                shape = arr.shape[1:]
            else:
                shape = arr.shape
            if shape != field.shape:
                hint = ""
                if not batched and shape[1:] == field.shape:  # an (n_envs, ...) batch given to add
                    hint = f": a batch of {shape[0]} rows? add() stores one item, extend() stores a batch"
                raise SpecError(f"field {path!r}: expected shape {field.shape}, got {tuple(shape)}{hint}")
            out[path] = arr if arr.dtype == field.dtype else cast(path, arr, strict, field.dtype)
        new_spec = spec if self.spec is None else None
        return (out, new_spec), (int(n) if batched else 1)

    def write(self, slots: slice | np.ndarray, prepared: tuple) -> None:
        """Copy prepared columns into ``slots`` (allocates the columns on the first write)."""
        columns, new_spec = prepared
        if new_spec is not None and self.spec is None:
            self._adopt(new_spec)
        for path, col in self.columns.items():
            col[slots] = columns[path]

    def read(self, slots: np.ndarray) -> dict[str, Any]:
        """Gather ``slots`` from every column (a new array per field)."""
        flat = self._gather(slots) if self._rows else None
        if flat is None:
            flat = {p: col.take(slots, axis=0) for p, col in self.columns.items()}
        return unflatten(flat) if self._nested else flat

    def read_counted(
        self, slots: np.ndarray, meta: np.ndarray, meta_out: np.ndarray, keys: tuple = ()
    ) -> dict[str, Any] | None:
        """:meth:`read` that also counts a sample in a table's metadata (``rows.count_samples``).

        One pass over the slots for the payload and the metadata; ``None`` (nothing read or
        counted) when the columns or slots do not suit it: the caller then reads and counts apart.
        ``keys``: ``(key_column, lo, base)`` to write the rows' keys too (``rows.fill_keys``).
        """
        if not self._rows:
            return None
        names, cols, rows = self._rows
        n = len(slots)
        outs = tuple(np.empty((n, *shape), dtype) for shape, dtype in rows)
        if not gather_rows(cols, slots, outs, meta, meta_out, *keys):
            return None
        flat = dict(zip(names, outs))
        return unflatten(flat) if self._nested else flat

    def _gather(self, slots: np.ndarray) -> dict[str, np.ndarray] | None:
        names, cols, rows = self._rows
        slots = np.asarray(slots)
        if slots.dtype != np.int64 or slots.ndim != 1:
            return None
        n = len(slots)
        outs = tuple(np.empty((n, *shape), dtype) for shape, dtype in rows)
        return dict(zip(names, outs)) if gather_rows(cols, np.ascontiguousarray(slots), outs) else None

    def read_runs(self, first: np.ndarray, width: int) -> dict[str, Any]:
        """Slots ``first[i] ... first[i] + width - 1`` of every column as ``(m, width, ...)`` arrays.

        Each run is one contiguous block copy (no per-slot index), the same values as
        ``read`` of the runs' slots reshaped. Requires ``first + width <= capacity``. A subclass
        with its own :meth:`read` (stacks, compressed blobs) gets exactly that ``read``.
        """
        if type(self).read is not ColumnStorage.read or not all(c.flags.c_contiguous for c in self.columns.values()):
            slots = (np.asarray(first, dtype=np.int64)[:, None] + np.arange(width)).ravel()
            data = self.read(slots)
            return reshape_leaves(data, (len(first), width))
        flat = {p: runs_view(col, width)[first] for p, col in self.columns.items()}  # (fancy index: fresh arrays)
        return unflatten(flat) if self._nested else flat

    def describe(self) -> dict:
        """Kind, capacity and the flat spec as JSON."""
        return {
            "kind": self.kind,
            "capacity": self.capacity,
            "spec": None if self.spec is None else {p: f.to_json() for p, f in self.spec.items()},
        }

    def export(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Flat ``{path: column[slots]}`` for checkpoints."""
        return {p: np.take(col, slots, axis=0) for p, col in self.columns.items()}

    def import_(self, exported: Mapping[str, np.ndarray]) -> int:
        """Write (through :meth:`write`) flat columns as produced by :meth:`export` to slots ``0..n-1``."""
        if not exported:
            return 0
        if self.spec is None:
            self._adopt({p: Field(tuple(a.shape[1:]), a.dtype) for p, a in exported.items()})
        n = len(next(iter(exported.values())))
        if n:
            self.write(slice(0, n), ({p: exported[p] for p in self.spec}, None))
        return n

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns."""
        return int(sum(c.nbytes for c in self.columns.values()))


def runs_view(arr: np.ndarray, width: int, column: int | None = None) -> np.ndarray:
    """A read-only view whose row ``i`` is ``arr[i : i + width]`` (no copy).

    ``arr`` must be C-contiguous. With ``column``, ``arr`` is 2-D and the rows are those of
    ``arr[:, column]``. Built with the ``ndarray`` constructor (several times cheaper than
    ``as_strided``), for fancy indexing by run starts: one block copy per run.
    """
    step = arr.strides[0]
    if column is None:
        shape, strides, offset = (len(arr) - width + 1, width, *arr.shape[1:]), (step, *arr.strides), 0
    else:
        shape, strides, offset = (len(arr) - width + 1, width), (step, step), column * arr.strides[1]
    view = np.ndarray(shape, arr.dtype, arr, offset, strides)
    view.flags.writeable = False
    return view
