"""Field specs: the shape and dtype of one item's leaves, and nested-dict flattening.

A nested dict such as ``{"obs": {"image": a, "state": b}, "reward": r}`` is stored as flat
columns named by their path, ``"obs/image"``, ``"obs/state"``, ``"reward"``. Paths use ``/``; a
key that itself contains ``/`` is rejected, so the mapping is reversible.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from ..errors import SpecError

SEP = "/"


class Field(NamedTuple):
    """The spec of one leaf: its per-item ``shape`` (without the batch axis) and ``dtype``."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @classmethod
    def of(cls, shape: Any, dtype: Any) -> "Field":
        """Build a field from any shape-like (int or sequence) and dtype-like."""
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        return cls(tuple(int(d) for d in shape), np.dtype(dtype))

    def to_json(self) -> dict:
        """A JSON-able form: ``{"shape": [...], "dtype": "<f4"}``."""
        return {"shape": list(self.shape), "dtype": self.dtype.str}

    @classmethod
    def from_json(cls, obj: Mapping) -> "Field":
        """Inverse of :meth:`to_json`."""
        return cls.of(obj["shape"], obj["dtype"])


def flatten(data: Mapping, prefix: str = "") -> dict[str, Any]:
    """Flatten a nested mapping into ``{path: leaf}`` in insertion order.

    Raises:
        SpecError: a key is not a string, contains ``/``, or a nested mapping is empty.
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or SEP in key or not key:
            raise SpecError(f"field names must be non-empty strings without '/': got {key!r}")
        path = prefix + key
        if isinstance(value, Mapping):
            if not value:
                raise SpecError(f"field {path!r} is an empty mapping")
            out.update(flatten(value, path + SEP))
        else:
            out[path] = value
    return out


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Rebuild the nested dict from ``{path: leaf}`` (inverse of :func:`flatten`)."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        if SEP not in path:
            out[path] = value
            continue
        node = out
        *parents, leaf = path.split(SEP)
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def reshape_leaves(data: Any, lead: tuple[int, ...]) -> Any:
    """Every array of a (nested) dict with its leading axis split into ``lead``."""
    if isinstance(data, dict):
        return {k: reshape_leaves(v, lead) for k, v in data.items()}
    return data.reshape(*lead, *data.shape[1:])


def concat(parts: list[Any]) -> Any:
    """The batches ``parts`` as one, rows of each after the previous one's.

    Dicts recurse by the first part's keys (every part must have them: ``KeyError`` otherwise),
    lists of objects are chained, arrays go through ``np.concatenate`` (so shapes past the first axis
    must agree; dtypes are promoted). One part is returned as is, not copied. ``parts`` must not be
    empty (``IndexError``).
    """
    first = parts[0]
    if isinstance(first, dict):
        return {k: concat([p[k] for p in parts]) for k in first}
    if isinstance(first, list):
        return [x for p in parts for x in p]
    if len(parts) == 1:
        return first
    return np.concatenate(parts)


def take(data: Any, idx: np.ndarray) -> Any:
    """Rows ``idx`` (an integer array) of a batch.

    Dicts recurse, lists of objects are indexed one by one, arrays by ``data[idx]`` (a copy); an
    index out of range raises ``IndexError``.
    """
    if isinstance(data, dict):
        return {k: take(v, idx) for k, v in data.items()}
    if isinstance(data, list):
        return [data[i] for i in idx.tolist()]
    return data[idx]


def normalize_spec(spec: Mapping) -> dict[str, Field]:
    """Turn a user spec (nested dict of ``Field``, ``(shape, dtype)`` or dtype) into flat Fields.

    Raises:
        SpecError: ``spec`` is not a mapping, or an entry is not a shape and a dtype (the message
            names the field and says when the two look swapped).
    """
    if not isinstance(spec, Mapping):
        raise SpecError(f"spec must be a dict of field: (shape, dtype), got {type(spec).__name__}")
    flat = {}
    for path, f in flatten(spec).items():
        if isinstance(f, Field):
            flat[path] = f
            continue
        shape, dtype = f if isinstance(f, tuple) and len(f) == 2 else ((), f)
        try:
            flat[path] = Field.of(shape, dtype)
            if any(d < 0 for d in flat[path].shape):
                raise ValueError("negative dimension")
        except (TypeError, ValueError) as e:
            hint = ""
            if isinstance(f, tuple) and len(f) == 2 and _is_shape(dtype) and not _is_shape(shape):
                dims = tuple(dtype) if isinstance(dtype, (tuple, list)) else (int(dtype),)
                hint = f": the order is (shape, dtype), e.g. ({dims!r}, {getattr(shape, '__name__', shape)})"
            raise SpecError(f"field {path!r}: expected (shape, dtype) or a dtype, got {f!r}{hint}") from e
    return flat


def _is_shape(x: Any) -> bool:
    """Whether ``x`` reads as a shape: an int or a sequence of ints."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return True
    return isinstance(x, (tuple, list)) and all(isinstance(d, (int, np.integer)) for d in x)
