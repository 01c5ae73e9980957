"""The Table's calls by key (``get``, ``info``, ``update_priorities``, ``delete``) and whole-table edits.

The whole-table edits: ``set_version``, ``clear`` and ``close``.

A mixin of :class:`~replaystore.table.Table`; each method takes the table's lock.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .args import as_int, as_keys


class KeyedMethods:
    """``get``, ``info``, ``update_priorities``, ``delete``, ``set_version``, ``clear``, ``close``."""

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
                "times_sampled": self._times_sampled[s],
                "versions": self._version[s],
            }

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set the priorities of items by key; return how many were applied.

        Duplicate keys: the last occurrence wins. Keys no longer in the table are skipped (and
        counted in ``stats()["skipped_updates"]``). Errors are raised before anything changes.

        Raises:
            InvalidPriority: NaN, infinite or (for the prioritized sampler) negative values.
            InvalidArgument: ``keys`` are the ``indices`` (storage slots) of one of this handle's
                recent samples, not their keys (see :mod:`replaystore.table.recent`).
        """
        keys = as_keys(keys)
        self._recent.check(keys)
        prio = self._validate_priorities(priorities, len(keys))
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
            InvalidArgument: ``version`` is not an integer, or below the current version without
                ``reset`` (the table is unchanged).
        """
        version = as_int(version, "version")
        with self._cond:
            self._flush_pending()
            self._check_open()
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
        with self._cond:
            self._flush_pending()
            self._check_open()
            live = self._index.live_slots()
            self._remove_slots(live)
            self.rate_limiter.reset()
            if self._waiting:
                self._cond.notify_all()

    def close(self) -> None:
        """Close the table: wake every blocked call with :class:`Closed`; later calls raise it too.

        Idempotent. The data stays readable through ``stats()`` and ``save()``.
        """
        with self._cond:
            self._flush_pending()
            self._state.closed = 1
            if self._waiting:
                self._cond.notify_all()
