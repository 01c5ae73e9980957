"""The Table's slot bookkeeping: free slots, removal, eviction in place, and leaving ring mode.

Ring mode: while items leave only oldest-first (a Fifo remover, no delete, retirement or stale
drop of other items), key ``k`` lives in slot ``(k - base) % capacity`` and the key index, the
free-slot stack and the Fifo/Uniform selectors' arrays are arithmetic on the ring (not
allocated); the first other removal builds them (:meth:`SlotBookkeeping._leave_ring`). A table
built under a placement (a shared table) allocated them up front: leaving ring mode fills them,
or, in a process that learns another one did, only points at them. After a crash,
:meth:`~replaystore.table.host.HostedTable.rebuild_from_rows` rebuilds them from the metadata rows.

A mixin of :class:`~replaystore.table.Table`: every method runs with the table's lock held and
valid input.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgument
from ..rows import last_occurrences
from ..samplers import Uniform
from .state import allocate_keys


class SlotBookkeeping:
    """Which slot holds which item, and how items leave (see the module doc)."""

    def _remove_slots(self, slots: np.ndarray, oldest: bool = False) -> None:
        """Remove distinct live slots from every part of the table.

        ``oldest`` promises that they hold the oldest keys (the Fifo remover's victims); any other
        removal that is not exactly the oldest run of keys ends ring mode first.
        """
        if len(slots) == 0:
            return
        if self._ring is not None and not oldest and not self._holds_oldest(slots):
            self._leave_ring()
        for sel in self._selectors:
            sel.remove(slots)
        self._index.release(slots)
        hi = self._written_hi
        if hi is not None and self._ring is not None and hi[0] < self._state.ring_lo + self.capacity:
            # the oldest items left (keys implicit): a sample copying outside the lock must see them gone
            hi[0] = self._state.ring_lo + self.capacity
        self.storage.release(slots)
        k = len(slots)
        st = self._state
        if self._free is not None:
            self._free[st.nfree : st.nfree + k] = slots[::-1]  # pops come out in ascending order
        st.nfree += k
        st.size -= k
        self.rate_limiter.deletes += k
        st.deletes += k

    def _replace_slots(self, victims: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Evict the items at ``victims`` and put new items (``keys``) in the same slots.

        The caller has released the victims' payloads in the storage and written the new ones.
        """
        newest_gone = int(self._index.keys_of(victims[-1:])[0]) if self._fifo else None  # (the oldest items)
        for sel in self._selectors:
            sel.replace(victims, keys, priorities)
        self._index.replace(victims, keys, newest_gone)
        k = len(victims)
        st = self._state
        self.rate_limiter.deletes += k
        st.deletes += k
        st.evictions += k

    def _victims(self, n: int) -> np.ndarray:
        """The remover's ``n`` victims, or the ones :meth:`replay_insert` was told (state unchanged)."""
        forced = self._forced_victims
        if forced is None:
            return self.remover.victims(n)
        if len(forced) != n or (self._fifo and not np.array_equal(forced, self.remover.victims(n))):
            raise InvalidArgument(
                f"evict_keys names {len(forced)} victims; this insert evicts {n} other items: "
                "the recorded insert does not continue this table"
            )
        return forced

    def _take_free(self, n: int, first_key: int) -> np.ndarray:
        """Slots for ``n`` new items whose keys start at ``first_key``."""
        st = self._state
        if self._ring is not None:
            slots = self._ring.slots_for(first_key, n)
        else:
            slots = self._free[st.nfree - n : st.nfree][::-1].copy()
        st.nfree -= n
        return slots

    def _holds_oldest(self, slots: np.ndarray) -> bool:
        """Whether distinct live ``slots`` hold exactly the ring's oldest ``len(slots)`` keys."""
        keys = self._ring.keys_of(slots)
        lo = self._state.ring_lo
        return int(keys.min()) == lo and int(keys.max()) == lo + len(slots) - 1

    def _leave_ring(self, fill: bool = True) -> None:
        """End ring mode: build the key index, the free-slot stack and the selectors' own state.

        ``O(capacity)``, once per table (until a checkpoint is loaded into a new one). A placed
        table (``replaystore.shared``) allocated these structures when it was built: they are
        reset and filled here; with ``fill=False`` (another process of a shared table left ring
        mode and filled them already) the table only switches to them.
        """
        ring = self._ring
        if ring is None:
            return
        if self._reserve_outside_ring is not None:  # (the host's hook; shared: may raise DiskFull, nothing changed)
            self._reserve_outside_ring()
        st = self._state
        placed = self._placed_index is not None
        sampler, remover = self.sampler, self.remover
        followers = [sel for sel in (sampler, remover) if sel not in self._selectors]
        if not fill:
            self._index, self._free = self._placed_index, self._placed_free
            for sel in followers:
                sel.unfollow(None, None, None)
            if hasattr(sampler, "share_live"):
                sampler.share_live(None, None)
        else:
            live = ring.live_slots()
            keys = ring.live_keys()
            free = ring.free_slots()
            if placed:  # (its key column: the segment's "table.keys", -1 since its reservation)
                self._index, self._free = self._placed_index, self._placed_free
                self._index.reset()
                self._index.key_of_slot[:] = -1
                if len(live):
                    self._index.assign(live, keys)  # (the keys written out: implicit until now)
            else:
                self._free = np.empty(self.capacity, dtype=np.int64)
                self._index = ring.to_key_index(allocate_keys(self.capacity))
            self._free[: len(free)] = free[::-1]  # pops come out in the order the ring would fill them
            st.nfree = len(free)
            for sel in followers:
                sel.unfollow(live, keys, self._priority[live])
            if hasattr(sampler, "share_live"):
                sampler.share_live(None, live)
        self._selectors = (sampler, remover)
        if self._episodes is not None:
            index = self._episodes
            if type(sampler) is Uniform:  # share the sampler's new set, as a table built so would
                index.share_live(sampler.live_set)
            else:
                index.share_live(None)
                index.live.add(ring.live_slots())
            self._selectors = (*self._selectors, index)
        st.ring_mode = 0
        if self._written_hi is not None:  # (readers outside the lock check the key column from now on)
            self._written_hi[0] = -1
        self._ring = None
        self._plan = False

    def _last_occurrences(self, slots: np.ndarray) -> np.ndarray | None:
        """Mask of the last occurrence of each slot, or ``None`` when all are distinct.

        ``rows.last_occurrences`` writes each slot's last position into a scratch array: O(n), no sort.
        """
        if self._scratch is None:
            self._scratch = np.full(self.capacity, -1, dtype=np.int64)
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        last = np.empty(len(slots), dtype=bool)
        return None if last_occurrences(slots, self._scratch, last) else last
