"""A sharded write's row-level checks, made before any shard is sent anything.

A write that splits its rows over several shards (``extend(route=...)``, ``extend_steps`` whose
streams live on several shards) must not leave some shards written when another refuses its
rows. The shards share one configuration, so what one shard refuses for a whole batch (a field
of the wrong dtype) every shard refuses; what depends on the rows (a stream id out of range, a
priority that is NaN, a count that does not match) is checked first, with the Table's own rules
and error classes (priorities: :func:`replaystore.table.args.as_priorities`). Plain functions, no Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..episodes import Episodes
from ..episodes.writers import validate_flags, validate_streams
from ..errors import InvalidArgument, SpecError


def batch_length(data: Any) -> int:
    """The number of rows of a batch (a dict of arrays, nested or not, or a sequence).

    Raises:
        SpecError: fields of different lengths, or a field with no rows dimension.
    """
    if isinstance(data, Mapping):
        lengths = set()
        for v in data.values():
            lengths.add(batch_length(v) if isinstance(v, Mapping) else _rows_of(v))
        if len(lengths) > 1:
            raise SpecError(f"the fields of a batch have different lengths: {sorted(lengths)}")
        if not lengths:
            raise SpecError("a batch needs at least one field")
        return lengths.pop()
    return _rows_of(data)


def _rows_of(value: Any) -> int:
    if np.ndim(value) == 0:
        raise SpecError(f"a batch field needs a leading rows dimension, got a scalar {value!r}")
    return len(value)


def check_versions(version: Any, n: int) -> None:
    """The Table's checks of an insert's versions.

    Raises:
        SpecError: not integers, or not one value (or one per row).
    """
    if version is None:
        return
    v = np.asarray(version)
    if v.dtype.kind not in "iub":
        raise SpecError(f"version must be an integer or an array of integers, got dtype {v.dtype}")
    if v.ndim and v.shape != (n,):
        raise SpecError(f"expected {n} versions, got shape {v.shape}")


def check_route(route: Any, n: int) -> np.ndarray:
    """``route`` as ``n`` int64 values.

    Raises:
        InvalidArgument: not integers, or not one per row.
    """
    r = np.asarray(route)
    if r.dtype.kind not in "iu":
        raise InvalidArgument(f"route must be integers, got dtype {r.dtype}")
    r = r.astype(np.int64).reshape(-1)
    if len(r) != n:
        raise InvalidArgument(f"route: {len(r)} values for {n} rows")
    if n and r.min() < 0:
        raise InvalidArgument(f"route values must be >= 0, got {int(r.min())}")
    return r


def check_steps(
    n: int, streams: Any, terminated: Any, truncated: Any, episodes: Episodes | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(streams, terminated, truncated)`` as ``n`` values each, with the Table's rules.

    Raises:
        EpisodeError: stream ids that are not integers or outside the table's range, flags that
            are not booleans, shapes that do not match.
    """
    s = validate_streams(streams, n, episodes or Episodes())
    return s, validate_flags(terminated, n, "terminated"), validate_flags(truncated, n, "truncated")
