"""Per-stream rings ``t -> slot``, the overflow map, and the gapless accounting of an episode index.

:class:`StreamRings` is the part of :class:`~replaystore.episodes.index.EpisodeIndex` that finds
where step ``t`` of a stream lives (a mixin: the index's per-slot ``uid`` and ``flags`` and its
per-stream ``next_t`` are shared state). Not thread-safe: the table calls it under its lock.

Per stream a ring is a power-of-two region of one flat array (``ring[ring_off[s] + (t &
(ring_len[s] - 1))]``, int32 slots while the capacity fits). A ring entry is trusted only when the
slot it names still holds that stream and ``t`` (its ``uid = stream << 40 | t``: slots are reused,
``(stream, t)`` never is), so removals cost nothing here and ``B x L`` positions are resolved with
one vectorised expression (:meth:`StreamRings.lookup`).

A ring grows (doubling, to twice the span of its stream's live positions and the new ones) when a
new step would overwrite a live one, up to ``ring_cap``, the first power of two >= twice the table
capacity. A live step further than ``ring_cap / 2`` behind its stream's newest position (kept
alive while newer steps of its stream were deleted, retired, refused as stale or evicted by a
non-FIFO remover) moves to the *overflow map* (its slot in a sorted array of ids, searched by
:meth:`lookup` only for positions the ring misses, only while the map is not empty): every live
step stays reachable, and a ring is re-laid out at most once per ``ring_cap / 2`` positions of its
stream (amortised O(1) per step).

Per stream, ``n_live`` counts its live steps and ``oldest_t`` is the position of the oldest one
(``next_t`` when there is none; when the oldest leaves in a removal that is not exactly the oldest
run, :meth:`StreamRings._advance_oldest` scans forward to the next live one). A stream
with ``n_live == next_t - oldest_t`` is *gapless*: every position from ``oldest_t`` to its newest
step is a live step (pigeonhole), so a window whose two ends are live needs no check in between
(:meth:`StreamRings.gapless`, :meth:`StreamRings.ring_window`). A gapless stream has no step in the
overflow map (its live span is at most the capacity, half the cap), so its ring holds every one of
its live steps.
"""

from __future__ import annotations

import numpy as np

from ..storage.columns import runs_view

#: a step's ``uid`` is ``stream << UID_SHIFT | t``: one gather verifies a ring entry
UID_SHIFT = 40
_T_MASK = (1 << UID_SHIFT) - 1
DETACHED = np.uint8(4)  # flag of a live step of no stream (only restored from old checkpoints: t = _T_MASK)
_MIN_RING = 16


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


class StreamRings:
    """The rings, overflow map and gapless counters of an :class:`~replaystore.episodes.index.EpisodeIndex`.

    A mixin: the index provides ``capacity``, ``uid``, ``flags``, ``next_t``, ``generation`` and
    calls :meth:`_rings_alloc` from ``bind``; the per-stream arrays (``ring_off``, ``ring_len``, ``lo_t``,
    ``n_live``, ``oldest_t``) are allocated with the index's other per-stream state.
    """

    def _rings_alloc(self, capacity: int) -> None:
        """Empty rings for a table of ``capacity`` slots."""
        self._slot_dtype = np.int32 if capacity <= np.iinfo(np.int32).max else np.int64
        self.n_detached = 0  # live steps marked detached (see DETACHED)
        # the overflow map: live steps their ring lost. _in_ov marks their slots (allocated at first
        # use); _ov_sorted = (uids sorted, their slots) may keep entries of steps that left since
        # (a find verifies the slot's uid), _ov_new holds slots added since it was built
        self._ov_n = 0
        self._in_ov: np.ndarray | None = None
        self._ov_sorted: tuple[np.ndarray, np.ndarray] | None = None
        self._ov_new: list[np.ndarray] = []
        self._ov_stale = 0
        self._gapless_at = (-1, False)  # (generation, all_gapless()) cache
        self.ring_cap = _pow2_at_least(2 * capacity)
        self.ring = np.full(1024, -1, dtype=self._slot_dtype)
        self.ring_used = 0

    # -- gapless streams --------------------------------------------------------------------------------
    def _count_out(self, slots: np.ndarray) -> np.ndarray | None:
        """Uncount leaving steps; ``oldest_t`` advances when its stream's oldest step leaves.

        It moves past the leaving steps when they are exactly the oldest ones, else one position.
        Returns the streams whose ``oldest_t`` is then not a live step while they have a gap: the
        caller moves it on (:meth:`_advance_oldest`) once the leaving steps are gone, so a stream
        whose holes all left is gapless again.
        """
        uid = self.uid[slots]
        counted = uid >= 0  # free slots and detached steps were not counted
        if self.n_detached:
            detached = (self.flags[slots] & DETACHED) != 0
            self.n_detached -= int(detached.sum())
            counted &= ~detached
        uid = uid[counted]
        if len(uid) == 0:
            return None
        st, ts = uid >> UID_SHIFT, uid & _T_MASK
        s0 = st[0]
        if len(st) == 1 or bool((st == s0).all()):
            s, k = int(s0), len(ts)
            left = int(self.n_live[s]) - k
            self.n_live[s] = left
            old = int(self.oldest_t[s])
            if left == 0:
                self.oldest_t[s] = self.next_t[s]
            elif int(ts.min()) == old:
                new = old + k if int(ts.max()) == old + k - 1 else old + 1  # positions are distinct
                self.oldest_t[s] = new
                if left != self.next_t[s] - new and not self._live_at(s, new, slots):
                    return np.array([s])
            return None
        us, inv, counts = np.unique(st, return_inverse=True, return_counts=True)
        lo = np.full(len(us), np.iinfo(np.int64).max)
        hi = np.full(len(us), np.iinfo(np.int64).min)
        np.minimum.at(lo, inv, ts)
        np.maximum.at(hi, inv, ts)
        left = self.n_live[us] - counts
        self.n_live[us] = left
        old = self.oldest_t[us]
        hit = lo == old
        new = np.where(hit, np.where(hi == old + counts - 1, old + counts, old + 1), old)
        new = np.where(left == 0, self.next_t[us], new)
        self.oldest_t[us] = new
        gap = hit & (left > 0) & (left != self.next_t[us] - new)
        return us[gap] if gap.any() else None

    def _live_at(self, s: int, t: int, leaving: np.ndarray) -> bool:
        """Whether position ``t`` of stream ``s`` is a live step its ring holds, not one of ``leaving``."""
        ln = int(self.ring_len[s])
        if ln == 0:
            return False
        slot = int(self.ring[int(self.ring_off[s]) + (t & (ln - 1))])
        return slot >= 0 and int(self.uid[slot]) == (s << UID_SHIFT | t) and slot not in leaving

    def _advance_oldest(self, streams: np.ndarray) -> None:
        """Move ``oldest_t`` of ``streams`` (which have live steps) on to their oldest live step.

        Scans blocks of positions (8, 64, 512, ... up to 65536) with :meth:`lookup`. ``oldest_t``
        never moves back, so the scans of a stream cost O(1) amortised per position it writes.
        """
        width = 8
        while len(streams):
            t0 = self.oldest_t[streams]
            nt = self.next_t[streams]
            ts = t0[:, None] + np.arange(width)
            found = (self.lookup(streams[:, None], ts) >= 0) & (ts < nt[:, None])
            has = found.any(axis=1)
            self.oldest_t[streams] = np.where(has, t0 + found.argmax(axis=1), np.minimum(t0 + width, nt))
            streams = streams[~has & (t0 + width < nt)]  # (n_live > 0: a live step lies ahead)
            width = min(8 * width, 1 << 16)

    def all_gapless(self) -> bool:
        """Whether every stream is gapless and no live step is detached (cheap while streams are few).

        ``False`` may also mean "not known cheaply" (many stream ids): test :meth:`gapless` of the
        streams at hand then.
        """
        if self._gapless_at[0] == self.generation:
            return self._gapless_at[1]
        ok = not self.n_detached and len(self.next_t) <= 64 and bool((self.n_live == self.next_t - self.oldest_t).all())
        self._gapless_at = (self.generation, ok)
        return ok

    def gapless(self, streams: np.ndarray) -> np.ndarray:
        """Which ``streams`` are gapless (see the module doc): a live step at every position from their oldest on."""
        return self.n_live[streams] == self.next_t[streams] - self.oldest_t[streams]

    def ring_window(self, streams: np.ndarray, t_first: np.ndarray, width: int) -> np.ndarray:
        """``(m, width)`` ring entries of positions ``t_first ... t_first + width - 1`` (unverified).

        Exact only for gapless ``streams`` and windows whose two ends are live steps (then every
        position in between is one, see :meth:`gapless`); use :meth:`lookup` otherwise.
        """
        ln = self.ring_len[streams]
        first = t_first & (ln - 1)
        if len(first) and int((first - ln).max()) <= -width:  # no window wraps around its ring
            return runs_view(self.ring, width)[self.ring_off[streams] + first]  # a row copy per window
        ts = t_first[:, None] + np.arange(width)
        return self.ring[self.ring_off[streams][:, None] + (ts & (ln - 1)[:, None])]

    # -- the rings --------------------------------------------------------------------------------------
    def lookup(self, streams: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """The slot of step ``ts`` of ``streams`` (broadcast), ``-1`` where it is not live."""
        ln = self.ring_len[streams]
        cand = self.ring[self.ring_off[streams] + (ts & np.maximum(ln - 1, 0))]
        want = (streams << UID_SHIFT) | (ts & _T_MASK)
        # cand == -1 reads the last slot's uid: the second test rejects it
        out = np.where((self.uid[cand] == want) & (cand >= 0), cand, -1)
        if self._ov_n:  # live steps their ring no longer holds (see the module doc)
            miss = out < 0
            if miss.any():
                out[miss] = self._overflow_find(np.broadcast_to(want, out.shape)[miss])
        return out

    def _overflow_find(self, uids: np.ndarray) -> np.ndarray:
        """The slots of the overflow steps ``uids`` (``-1`` where not there).

        The sorted array is rebuilt only after additions (at most once per ``ring_cap / 2``
        positions of a stream) or once more than half of it left; a departure costs nothing here.
        """
        if self._ov_sorted is None or self._ov_new or 2 * self._ov_stale > len(self._ov_sorted[0]):
            parts = list(self._ov_new)
            if self._ov_sorted is not None:
                parts.append(self._ov_sorted[1])
            slots = np.unique(np.concatenate(parts))  # a slot may be listed twice
            slots = slots[self._in_ov[slots]]
            u = self.uid[slots]
            order = np.argsort(u)
            self._ov_sorted = (u[order], slots[order])
            self._ov_new, self._ov_stale = [], 0
        su, ss = self._ov_sorted
        if len(su) == 0:
            return np.full(uids.shape, -1, dtype=np.int64)
        i = np.minimum(np.searchsorted(su, uids), len(su) - 1)
        cand = ss[i]
        return np.where((su[i] == uids) & (self.uid[cand] == uids), cand, -1)

    def _overflow_add(self, slots: np.ndarray) -> None:
        """Live steps their stream's ring is about to lose: find them through the overflow map."""
        if len(slots):
            if self._in_ov is None:
                self._in_ov = np.zeros(self.capacity, dtype=bool)
            self._in_ov[slots] = True
            self._ov_n += len(slots)
            self._ov_new.append(np.asarray(slots, dtype=np.int64))

    def _overflow_drop(self, slots: np.ndarray) -> None:
        """Forget leaving ``slots`` that were overflow steps (their sorted entries go stale)."""
        gone = slots[self._in_ov[slots]]
        if len(gone):
            self._in_ov[gone] = False
            self._ov_n -= len(gone)
            self._ov_stale += len(gone)

    @property
    def n_overflow(self) -> int:
        """Live steps found through the overflow map (see the module doc)."""
        return self._ov_n

    def attached(self, slots: np.ndarray) -> np.ndarray:
        """Which live ``slots`` are reachable through their stream's ring."""
        st, t = self.stream_t(slots)
        return self.lookup(st, t) == slots

    def _ring_put(
        self, slots: np.ndarray, streams: np.ndarray, ts: np.ndarray, shape: str = "general", restore: bool = False
    ) -> None:
        """Count new steps and enter them in their rings (``restore``: steps of any age, into an empty index).

        Each step is newer than every live step of its stream; ``shape`` is the plan's (``"same"``:
        one stream, positions increasing; ``"distinct"``: one step per stream).
        """
        if len(slots) == 0:
            return
        if len(slots) == 1 or shape == "same":
            s, lo, hi = int(streams[0]), int(ts[0]), int(ts[-1])
            if self.n_live[s] == 0:
                self.oldest_t[s] = lo
            self.n_live[s] += len(ts)
            if self.ring_len[s] == 0 or hi - self.lo_t[s] >= self.ring_len[s]:
                self._ensure(s, lo, hi)
            self.ring[self.ring_off[s] + (ts & (self.ring_len[s] - 1))] = slots
            return
        if shape == "distinct":
            empty = self.n_live[streams] == 0
            self.oldest_t[streams[empty]] = ts[empty]
            self.n_live[streams] += 1
            ln = self.ring_len[streams]
            need = (ln == 0) | (ts - self.lo_t[streams] >= ln)
            if need.any():
                for i in np.flatnonzero(need).tolist():
                    self._ensure(int(streams[i]), int(ts[i]), int(ts[i]))
                ln = self.ring_len[streams]
            self.ring[self.ring_off[streams] + (ts & (ln - 1))] = slots
            return
        us, inv, counts = np.unique(streams, return_inverse=True, return_counts=True)
        hi = np.full(len(us), np.iinfo(np.int64).min)
        lo = np.full(len(us), np.iinfo(np.int64).max)
        np.maximum.at(hi, inv, ts)
        np.minimum.at(lo, inv, ts)
        empty = self.n_live[us] == 0
        self.oldest_t[us[empty]] = lo[empty]
        self.n_live[us] += counts
        ln = self.ring_len[us]
        need = (ln == 0) | (hi - self.lo_t[us] >= ln)
        if restore:  # steps far behind their stream's newest go to the overflow map
            lo = np.maximum(lo, hi - self.ring_cap // 2 + 1)
        for i in np.flatnonzero(need).tolist():
            self._ensure(int(us[i]), int(lo[i]), int(hi[i]))
        if restore:
            old = ts < self.lo_t[streams]
            if old.any():
                self._overflow_add(slots[old])
                slots, streams, ts = slots[~old], streams[~old], ts[~old]
        ln = self.ring_len[streams]
        self.ring[self.ring_off[streams] + (ts & (ln - 1))] = slots

    def _ensure(self, s: int, t_lo: int, t_hi: int) -> None:
        """Make stream ``s``'s ring hold positions ``t_lo ... t_hi`` and its live steps.

        Growth and the overflow map: the module doc. ``lo_t[s]`` becomes the oldest position held.
        """
        ln = int(self.ring_len[s])
        live_slots = live_ts = np.empty(0, dtype=np.int64)
        off = int(self.ring_off[s])
        lo = t_lo
        if ln:
            region = self.ring[off : off + ln]
            idx = np.flatnonzero(region >= 0)
            cand = region[idx]
            u = self.uid[cand]  # the entry is live when its slot holds this stream at a position of this entry
            ok = (u >= 0) & ((u >> UID_SHIFT) == s) & ((u & (ln - 1)) == idx)
            ok &= (self.flags[cand] & DETACHED) == 0
            if self._ov_n:
                ok &= ~self._in_ov[cand]
            live_slots = cand[ok].astype(np.int64)
            live_ts = u[ok] & _T_MASK
            if len(live_ts):
                lo = min(lo, int(live_ts.min()))
        span = t_hi - lo + 1
        if ln and 2 * span <= ln:
            self.lo_t[s] = lo
            return
        new_len = min(self.ring_cap, max(_MIN_RING, _pow2_at_least(2 * span)))
        if 2 * span > new_len:  # capped: the oldest live steps go to the overflow map
            keep = live_ts >= min(t_lo, t_hi - new_len // 2 + 1)
            self._overflow_add(live_slots[~keep])
            if new_len == ln:
                self.ring[off + (live_ts[~keep] & (ln - 1))] = -1
            live_slots, live_ts = live_slots[keep], live_ts[keep]
            lo = min(t_lo, int(live_ts.min())) if len(live_ts) else t_lo
        if new_len != ln:
            off = self._alloc(new_len, dropping=s)
            self.ring[off + (live_ts & (new_len - 1))] = live_slots
            self.ring_off[s] = off
            self.ring_len[s] = new_len
        self.lo_t[s] = lo

    def _alloc(self, size: int, dropping: int) -> int:
        """Offset of a fresh region of ``size`` entries for stream ``dropping``.

        Compacts the flat array when it is full; the old region of ``dropping`` (already read by
        the caller) is not kept then.
        """
        if self.ring_used + size > len(self.ring):
            self.ring_len[dropping] = 0
            total = int(self.ring_len.sum()) + size
            # 25% room for growth, counting only the rings that can still grow
            growable = int(self.ring_len[self.ring_len < self.ring_cap].sum()) + (size if size < self.ring_cap else 0)
            new = np.full(max(1024, total + growable // 4), -1, dtype=self._slot_dtype)
            used = 0
            for s in np.flatnonzero(self.ring_len).tolist():
                ln, off = int(self.ring_len[s]), int(self.ring_off[s])
                new[used : used + ln] = self.ring[off : off + ln]
                self.ring_off[s] = used
                used += ln
            self.ring = new
            self.ring_used = used
        off = self.ring_used
        self.ring[off : off + size] = -1
        self.ring_used += size
        return off
