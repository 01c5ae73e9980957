"""The Table's calls by key (``get``, ``info``, ``update_priorities``, ``update_fields``, ``delete``); edits.

The whole-table edits: ``set_version``, ``clear`` and ``close``.

A mixin of :class:`~replaystore.table.Table`; each method takes the table's lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import InvalidArgument, SpecError, Unsupported
from ..storage import ColumnStorage
from ..storage.columns import as_array, cast
from ..storage.spec import flatten
from .args import as_keys, as_priorities, as_version


class KeyedMethods:
    """The calls by key and the whole-table edits (see the module doc)."""

    # -- read, update and delete by key ------------------------------------------------------------
    def get(self, keys: Any) -> tuple[Any, np.ndarray]:
        """Read items by key without sampling them.

        Returns:
            ``(data, found)``: the payloads of the keys that are live (in the given order) and a
            boolean mask over ``keys`` saying which were found.
        """
        keys = as_keys(keys)
        with self._cond:
            self._flush_pending()
            slots = self._index.lookup(keys)
            found = slots >= 0
            return self.storage.read(slots[found]), found

    def info(self, keys: Any) -> dict[str, np.ndarray]:
        """Metadata of live items by key: ``priorities``, ``times_sampled``, ``versions``, ``found``."""
        keys = as_keys(keys)
        with self._cond:
            self._flush_pending()
            slots = self._index.lookup(keys)
            found = slots >= 0
            s = slots[found]
            return {
                "found": found,
                "priorities": self._priority[s],
                "times_sampled": self._times_sampled[s].astype(np.int64),
                "versions": self._version[s].astype(np.int64),
            }

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of items by key; return how many were applied.

        Duplicate keys: the last occurrence wins. Keys no longer in the table are skipped (and
        counted in ``stats()["skipped_updates"]``). Errors are raised before anything changes.
        A table whose sampler and remover read no priorities (``Selector.reads_priorities``
        false: ``Uniform``, ``Fifo``, ``Lifo``, ``UniformDistinct``, ``WithoutReplacement``)
        keeps none per item (16 bytes of metadata an item instead of 24): given priorities,
        here or to ``add``/``extend``, are checked and raise ``max_priority`` as always, and
        every item reports priority 1.0 (``info``, ``Sample.priorities``, ``stats``, checkpoints).

        Raises:
            InvalidPriority: NaN, infinite or (for the prioritized sampler) negative values.
            InvalidArgument: ``keys`` are the ``indices`` (storage slots) of one of this handle's
                recent samples, not their keys (see :mod:`replaystore.table.recent`).
        """
        given, keys = keys, as_keys(keys)
        self._recent.check(keys, given)
        prio = as_priorities(priorities, len(keys), self._requires_nonnegative, self.sampler)
        if len(keys) == 0:
            return 0
        with self._cond:
            self._flush_pending()
            self._check_open()
            st = self._state
            slots = self._index.lookup(keys)
            ok = slots >= 0
            if not ok.all():
                st.skipped_updates += len(np.unique(keys[~ok]))
                slots, keys, prio = slots[ok], keys[ok], prio[ok]
            if len(slots) == 0:
                return 0
            last = self._last_occurrences(slots)
            if last is not None:
                slots, keys, prio = slots[last], keys[last], prio[last]
            self._priority[slots] = prio
            for sel in self._selectors:
                sel.update(slots, keys, prio)
            st.max_priority = max(st.max_priority, float(prio.max()))
            if self._waiting:
                self._cond.notify_all()
            return len(slots)

    def update_fields(self, keys: Any, data: Any) -> int:
        """Rewrite some payload fields of live items by key; return how many items were rewritten.

        ``data`` is a dict (nested as the items are) of some of the table's fields, each with one
        row per key: ``(len(keys), *field shape)``; the other fields, the keys, priorities and
        counters stay as they are. Duplicate and unknown keys: as :meth:`update_priorities`. For
        per-row state a reader needs after a restore, e.g. per-agent priorities (:mod:`replaystore.multiagent`).

        Raises:
            SpecError: ``data`` is not a dict of known fields, or a value's shape or dtype does not
                fit its field (dtype rule as ``extend``: an array needs the field's exact dtype).
            Unsupported: a storage other than plain columns (objects, frame stacks, compressed).
            InvalidArgument: bad keys (as :meth:`update_priorities`). Nothing changes on any error.
        """
        given, keys = keys, as_keys(keys)
        self._recent.check(keys, given)
        storage = self.storage
        if not isinstance(storage, ColumnStorage) or type(storage).write is not ColumnStorage.write:
            raise Unsupported(f"update_fields needs plain column storage, not {type(storage).__name__}")
        if not isinstance(data, Mapping) or not data:
            raise SpecError(f"update_fields takes a non-empty dict of fields, got {type(data).__name__}")
        with self._flushed(check_open=True):
            cols = _field_rows(storage, flatten(data), len(keys))
            slots = self._index.lookup(keys)
            ok = slots >= 0
            if not ok.all():
                self._state.skipped_updates += len(np.unique(keys[~ok]))
                slots, cols = slots[ok], {p: c[ok] for p, c in cols.items()}
            if len(slots) == 0:
                return 0
            last = self._last_occurrences(slots)
            if last is not None:
                slots, cols = slots[last], {p: c[last] for p, c in cols.items()}
            for path, c in cols.items():
                storage.columns[path][slots] = c
            return len(slots)

    def delete(self, keys: Any) -> int:
        """Delete items by key; return how many were deleted (unknown keys are skipped and counted)."""
        keys = np.unique(as_keys(keys))
        with self._cond:
            self._flush_pending()
            self._check_open()
            slots = self._index.lookup(keys)
            ok = slots >= 0
            self._remove_slots(slots[ok])  # (first: it may fail leaving ring mode, before any change)
            self._state.skipped_deletes += int((~ok).sum())
            if self._waiting:
                self._cond.notify_all()
            return int(ok.sum())

    def set_version(self, version: int, reset: bool = False) -> int:
        """Set the current model version; with ``max_staleness``, drop items that became stale.

        Versions only go up (setting the current one again is a no-op): a lower one is refused,
        since it is a mistake (two counters, a typo) more often than a new run. ``reset=True``
        sets any version (a new training run, a restore).

        Returns:
            How many items were dropped.

        Raises:
            InvalidArgument: ``version`` is not an integer, not an int32 (the metadata row keeps
                versions as int32), or below the current version without ``reset`` (the table
                is unchanged).
        """
        version = as_version(version)
        with self._flushed(check_open=True):
            st = self._state
            if version < st.version and not reset:
                raise InvalidArgument(
                    f"set_version({version}): versions only go up (the current one is {st.version}); "
                    "pass reset=True to start counting again"
                )
            st.version = version
            if self.max_staleness is None:
                return 0
            live = np.flatnonzero(self._index.key_of_slot >= 0)
            stale = live[self._version[live] < version - self.max_staleness]
            self._remove_slots(stale)
            st.dropped_stale += len(stale)
            if self._waiting:
                self._cond.notify_all()
            return len(stale)

    def clear(self) -> None:
        """Remove every item and reset the rate limiter's counters (keys keep increasing)."""
        with self._flushed(check_open=True):
            live = self._index.live_slots()
            self._remove_slots(live)
            self.rate_limiter.reset()
            if self._waiting:
                self._cond.notify_all()

    def close(self) -> None:
        """Close the table: wake every blocked call with :class:`Closed`; later calls raise it too.

        Idempotent. The data stays readable through ``stats()`` and ``save()``.
        """
        with self._flushed():
            self._state.closed = 1
            if self._waiting:
                self._cond.notify_all()


def _field_rows(storage: ColumnStorage, flat: dict[str, Any], n: int) -> dict[str, np.ndarray]:
    """``update_fields``' values as arrays of the fields' dtypes, ``(n, *shape)`` each (``SpecError`` if not)."""
    spec = storage.spec or {}
    unknown = sorted(set(flat) - set(spec))
    if unknown:
        raise SpecError(f"update_fields: unknown fields {unknown} (the table's: {sorted(spec)})")
    out = {}
    for path, value in flat.items():
        field = spec[path]
        arr, strict = as_array(path, value)
        if arr.shape != (n, *field.shape):
            raise SpecError(f"field {path!r}: expected shape {(n, *field.shape)} (one row per key), got {arr.shape}")
        out[path] = cast(path, arr, strict, field.dtype)
    return out
