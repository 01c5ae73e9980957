"""The Table's general insert path: validation, staleness, the rate limiter, eviction, accounting.

Every insert that no fast path takes ends here (:meth:`GeneralInsert._insert`), including the
staged adds' batches and the episode writers' rows.

A mixin of :class:`~replaystore.table.Table`: every method runs with the table's lock held.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CapacityError, EpisodeError, SpecError
from ..rows import VERSION_MAX, VERSION_MIN
from .args import NO_LIMIT, as_priorities, as_slice_if_contiguous, subset


class GeneralInsert:
    """Checks and the insert of a prepared batch (see the module doc)."""

    def _validate_versions(self, version: Any, n: int) -> int | np.ndarray:
        """One int for the whole batch, or ``n`` int64 versions."""
        if version is None:
            return self._state.version
        v = np.asarray(version)
        if v.dtype.kind not in "iub":
            raise SpecError(f"version must be an integer or an array of integers, got dtype {v.dtype}")
        if v.size and (v.min() < VERSION_MIN or v.max() > VERSION_MAX):
            raise SpecError(f"versions must lie in [{VERSION_MIN}, {VERSION_MAX}] (int32: the metadata row's)")
        v = v.astype(np.int64)
        if v.ndim == 0:
            return int(v)
        if v.shape != (n,):
            raise SpecError(f"expected {n} versions, got shape {v.shape}")
        return v

    def _insert(
        self, prepared: Any, n: int, priorities: Any, version: Any, timeout: float | None, admitted: bool = False
    ) -> np.ndarray:
        """Insert a prepared batch (lock held).

        Nothing changes (counters included) until every check has passed and the rate limiter
        has admitted the batch; the storage write is the only step after that which may fail, and
        on an empty-enough table its slots are given back if it does.
        """
        if self._await_head is not None:
            self._await_head()
        if self._episodes is not None and not self._episodes.planned():
            raise EpisodeError(
                f"table {self.name!r} has episode structure: write steps with add_step, extend_steps "
                "or add_episode (they say which stream each step belongs to)"
            )
        fifo = self._fifo
        if n > self.capacity and not fifo:
            raise CapacityError(
                f"a batch of {n} items does not fit a table of capacity {self.capacity} whose "
                f"remover is {type(self.remover).__name__} (only a Fifo table keeps the newest items)"
            )
        st = self._state
        n_given = n
        limiter = self.rate_limiter
        limited = limiter.max_diff < NO_LIMIT  # else every insert may proceed at once
        if limited:
            limiter.check_insert_size(n)
        prio = None if priorities is None else as_priorities(priorities, n, self._requires_nonnegative, self.sampler)
        versions = self._validate_versions(version, n)
        accepted = None
        if self.max_staleness is not None:
            fresh = np.asarray(versions >= st.version - self.max_staleness)
            if not fresh.all():
                accepted = np.flatnonzero(np.broadcast_to(fresh, (n,)))
                if self._episodes is not None:
                    self._episodes.note_accepted(accepted)
                if len(accepted) == 0:
                    st.dropped_stale += n
                    return np.full(n, -1, dtype=np.int64)
        if limited and not admitted:
            wanted = n if accepted is None else len(accepted)
            while True:
                self._wait(lambda: limiter.can_insert(wanted), timeout, f"insert of {n}", "insert_blocked_s")
                if self._stager is None or self._stager.n == 0:
                    break
                # adds staged while this call waited hold the next keys: insert them first
                self._flush_pending()
        if accepted is not None:
            prepared = subset(self.storage, prepared, accepted)
            versions = versions if isinstance(versions, int) else versions[accepted]
            prio = None if prio is None else prio[accepted]
            n = len(accepted)
        if prio is None:
            prio = np.full(n, st.max_priority)
        new_max_priority = max(st.max_priority, float(prio.max()))
        keys = np.arange(st.next_key, st.next_key + n, dtype=np.int64)
        gone = 0  # a FIFO batch larger than the capacity: its oldest items are evicted at once
        if n > self.capacity:
            gone = n - self.capacity
            keep = np.arange(gone, n)
            prepared = subset(self.storage, prepared, keep)
            versions = versions if isinstance(versions, int) else versions[keep]
            prio, stored_keys = prio[keep], keys[keep]
        else:
            stored_keys = keys
        m = n - gone

        overflow = max(st.size + m - self.capacity, self.storage.evictions_needed(prepared, m))
        # (in ring mode the victims' slots are the new keys' slots only when the table is full)
        if overflow == m > 0 and (self._ring is None or st.size == self.capacity):
            # The steady state of a full table: the new items take the victims' slots in place
            # (what removing and re-inserting would do, minus the bookkeeping of both).
            slots = self._victims(m)
            if gone and self._ring is not None:  # every slot, but key k must go to its ring slot
                slots = self._ring.slots_for(int(stored_keys[0]), m)
            where = as_slice_if_contiguous(slots)
            self.storage.release(slots)
            if self._unordered_write is not None:
                self._unordered_write()
            if self._written_hi is not None and self._ring is not None:
                self._written_hi[0] = max(int(self._written_hi[0]), st.next_key + n)
            self.storage.write(where, prepared)
            self._replace_slots(slots, stored_keys, prio)
        else:
            if overflow > 0:
                self._remove_slots(self._victims(overflow), oldest=fifo)
                st.evictions += overflow
            slots = self._take_free(m, int(stored_keys[0]))
            where = as_slice_if_contiguous(slots)
            if self._unordered_write is not None:
                self._unordered_write()
            if self._written_hi is not None and self._ring is not None:
                self._written_hi[0] = max(int(self._written_hi[0]), st.next_key + n)
            try:
                self.storage.write(where, prepared)  # may adopt the spec, or raise (DiskFull)
            except BaseException:
                st.nfree += m  # give the slots back: the failed write inserted nothing
                raise
            self._index.assign(slots, stored_keys)
            for sel in self._selectors:
                sel.insert(slots, stored_keys, prio)
            st.size += m
        st.next_key += n
        st.max_priority = new_max_priority
        self._priority[where] = prio
        self._times_sampled[where] = 0
        self._version[where] = versions
        limiter.inserts += n
        st.inserts += n
        if gone:
            limiter.deletes += gone
            st.deletes += gone
            st.evictions += gone
        if accepted is not None:
            st.dropped_stale += n_given - n
        if self._waiting:
            self._cond.notify_all()
        if accepted is None:
            return keys
        keys_out = np.full(n_given, -1, dtype=np.int64)
        keys_out[accepted] = keys
        return keys_out
