"""Episodes in a shared table: each process's episode index, kept equal to the table's by replay.

Every process has an ordinary :class:`~replaystore.episodes.EpisodeIndex` of its own (the
in-process code). The segment holds the truth they are kept equal to: per slot the step's ``uid``
(stream and position), episode id, position in it and end flags (``episodes.uid|episode|pos|flags``,
written once per step); per stream its next position, open episode and position in it
(``episodes.streams``, ``max_streams`` rows); four scalars in the published state (a serial number
of the episode state, a count of ``end_episode`` calls, the next episode id, the stream ids used).
Entering the lock after another process published, :meth:`EpisodeSync.pull` replays what changed
(ring mode: the key ranges that left and arrived; out of it: the slots whose ``uid`` differs) into
the index; leaving it, :meth:`EpisodeSync.push` writes the rows and streams this process changed,
in-place overwrites first noted in an undo journal (``episodes.undo``) stamped with the published
generation, which :meth:`EpisodeSync.recover` puts back after a writer died before publishing.
The design and its costs: docs/architecture.md "Episodes in a shared table are per-process
replicas, not placed arrays"; docs/shared.md "How it works".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..episodes import EpisodeIndex
from ..placement import allocate
from ..table import Table, contract

_SHIFT = 40
_T_MASK = (1 << _SHIFT) - 1


class EpisodeSync:
    """One process's episode index and the segment's episode state (see the module doc).

    Allocates its regions through :func:`replaystore.placement.allocate` (call it inside the
    table's placement). Its published scalars (the placement's scalar hook, ``SCALARS``) are the
    ``pub_*`` attributes: :meth:`push` sets them, :meth:`pull` reads them. Every method runs with
    the table's lock held.
    """

    #: the scalar hook (:mod:`replaystore.placement`): set by push, published, loaded before pull
    SCALARS = ("pub_serial", "pub_ends", "pub_next_episode", "pub_used")

    def __init__(self, index: EpisodeIndex, capacity: int, max_streams: int) -> None:
        self.index = index
        self.capacity = int(capacity)
        self.max_streams = int(max_streams)
        self.uid = allocate("episodes.uid", (capacity,), np.int64, -1)
        self.episode = allocate("episodes.episode", (capacity,), np.int64, -1)
        self.pos = allocate("episodes.pos", (capacity,), np.int64, 0)
        self.flags = allocate("episodes.flags", (capacity,), np.uint8, 0)
        self.streams = allocate("episodes.streams", (max_streams, 3), np.int64, (0, -1, 0))
        # row 0: (generation stamp, entries, ...); then (stream, next_t, cur_ep, cur_pos, slot, flags)
        self.undo = allocate("episodes.undo", (max_streams + 1, 6), np.int64, (-1, 0, 0, 0, -1, 0))
        self.serial = 0  # the episode state this index holds
        self.ends = 0  # how many critical sections called end_episode (flags of published steps changed)
        self.ended = False  # this critical section called end_episode
        self.used = 0  # stream ids below it may have state
        self.lo = self.hi = 0  # the live keys this index holds
        self.gen = index.generation  # the index's generation when it last matched the segment
        self.hint = 0  # stream ids below it may change in the current critical section
        self.revalidate = False
        self.in_ring = True  # the table was in ring mode when this index last matched the segment
        self.pub_serial = self.pub_ends = self.pub_next_episode = self.pub_used = 0

    def note_streams(self, top: int) -> None:
        """Streams below ``top`` (at most ``max_streams``) may get state in this critical section."""
        self.hint = max(self.hint, min(int(top), self.max_streams))

    def _slots(self, first: int, last: int, base: int) -> np.ndarray:
        return (np.arange(first, last, dtype=np.int64) - base) % self.capacity

    def _changed(self, n: int) -> np.ndarray:
        """Stream ids below ``n`` whose state in this index differs from the segment's."""
        idx, sh = self.index, self.streams[:n]
        return np.flatnonzero(
            (idx.next_t[:n] != sh[:, 0]) | (idx.cur_ep[:n] != sh[:, 1]) | (idx.cur_pos[:n] != sh[:, 2])
        )

    def _last_steps(self, streams: np.ndarray, next_t: np.ndarray) -> np.ndarray:
        """Slots of the steps ``next_t - 1`` of ``streams`` that this index and the segment both hold."""
        has = next_t > 0
        slots = self.index.lookup(streams[has], next_t[has] - 1)
        slots = slots[slots >= 0]
        return slots[self.uid[slots] == self.index.uid[slots]]

    # -- other processes' changes into this index ---------------------------------------------------
    def pull(self, ring: tuple | None, priorities: np.ndarray, key_of_slot: Any) -> None:
        """Bring this index to the published state (the ``pub_*`` scalars just loaded).

        ``ring``: ``(lo, hi, base)`` of a table in ring mode (its live keys ``[lo, hi)``), else
        ``None``: then the slots whose step differs are found by comparing the whole ``uid``
        column (``O(capacity)``). ``key_of_slot()``: the table's key column (``-1``: free slot; called
        only after a crash).
        """
        serial, ends, next_episode, used = self.pub_serial, self.pub_ends, self.pub_next_episode, self.pub_used
        idx = self.index
        if self.revalidate:  # a process died in the lock: steps of slots the repaired table frees are gone
            self.uid[key_of_slot() < 0] = -1
        if ring is None and self.in_ring:  # the table left ring mode (in another process): steps are
            idx.refill_live()  # found by comparison from now on; its own live set is its steps
            self.in_ring = False
        if ring is not None:
            lo, hi, base = ring
            gone_hi = min(lo, self.hi)
            gone = self._slots(self.lo, gone_hi, base) if gone_hi > self.lo else None  # (oldest first)
            first = max(self.hi, lo)
            new = self._slots(first, hi, base) if hi > first else None
            self.lo, self.hi = lo, hi
        else:
            changed = np.flatnonzero(idx.uid != self.uid)
            gone = changed[idx.uid[changed] >= 0]
            new = changed[self.uid[changed] >= 0]
            new = new[np.argsort(self.uid[new], kind="stable")]  # by stream, then position
        if gone is not None and len(gone):
            idx.remove(gone)
        if serial != self.serial:
            changed = self._changed(max(used, self.used))
            if ends != self.ends:  # end_episode flagged the last step of an open episode
                last = self._last_steps(changed, idx.next_t[changed])
                idx.flags[last] = self.flags[last]
                self.ends = ends
            sh = self.streams[changed]
            idx.load_streams(changed, sh[:, 0], sh[:, 1], sh[:, 2], next_episode)
            self.serial, self.used = serial, used
        if new is not None and len(new):  # steps that arrived since
            u = self.uid[new]
            rows = (u >> _SHIFT, u & _T_MASK, self.episode[new], self.pos[new], self.flags[new])
            idx.apply_rows(new, rows, priorities[new])
        if self.revalidate and idx.validity is not None:  # the recovery reset the trees' leaves
            idx.validity.on_update(np.flatnonzero(idx.uid >= 0))
        self.revalidate = False
        self.gen = idx.generation

    # -- this process's changes into the segment ---------------------------------------------------
    def push(self, ring: tuple | None, published: int) -> None:
        """Write this critical section's changes into the segment and set the ``pub_*`` scalars.

        ``ring``: as for :meth:`pull`. ``published``: the generation of the state currently
        published (the undo journal's stamp).
        """
        idx = self.index
        if idx.generation != self.gen:
            # streams the writers named (a call that did not name them, e.g. a replayed write: all)
            n = max(self.used, self.hint) if self.hint else self.max_streams
            changed = self._changed(n)
            if ring is not None:  # new steps are the keys [hi_seen, hi) (removals: readers know them)
                lo, hi, base = ring
                first = max(self.hi, lo)
                slots = self._slots(first, hi, base) if hi > first else np.empty(0, dtype=np.int64)
                self.lo, self.hi = lo, hi
            else:  # every slot whose step changed (new, or gone: uid -1)
                slots = np.flatnonzero(idx.uid != self.uid)
                self.in_ring = False
            if len(changed):
                self._journal(changed, published, self.ended)
                sh = self.streams
                sh[changed, 0], sh[changed, 1], sh[changed, 2] = (
                    idx.next_t[changed],
                    idx.cur_ep[changed],
                    idx.cur_pos[changed],
                )
            if len(slots):
                self.uid[slots] = idx.uid[slots]
                self.episode[slots] = idx.episode_of[slots]
                self.pos[slots] = idx.pos_of[slots]
                self.flags[slots] = idx.flags[slots]
            if len(changed) or len(slots):  # (a new episode changes its stream's state too)
                self.serial += 1
                self.ends += self.ended
            if len(changed):
                self.used = max(self.used, int(changed[-1]) + 1)
            self.gen = idx.generation
            self.hint = 0  # (kept while nothing changed: a writer waiting for the rate limiter goes on)
            self.ended = False
            self.pub_serial, self.pub_ends, self.pub_used = self.serial, self.ends, self.used
            self.pub_next_episode = idx.next_episode
        elif ring is not None:  # (nothing to publish: the pub_* scalars stay as loaded, even when this
            self.lo, self.hi = ring[0], ring[1]  # index has not caught up yet, as in a recovery)

    def _journal(self, changed: np.ndarray, published: int, ended: bool) -> None:
        """Journal the old state of ``changed`` streams (and, if ``ended``, of end flags), then set the flags."""
        idx, u = self.index, self.undo
        m = len(changed)
        entries = u[1 : m + 1]
        entries[:, 0] = changed
        entries[:, 1:4] = self.streams[changed]
        entries[:, 4] = -1
        last = None
        if ended:
            last = self._last_steps(changed, self.streams[changed, 0])
            last = last[self.flags[last] != idx.flags[last]]
            k = len(last)
            entries[:k, 4] = last  # (one flag per stream at most: the entries' order does not matter)
            entries[:k, 5] = self.flags[last]
        u[0, 1] = m
        u[0, 0] = published  # last: a journal with the current stamp is complete
        if last is not None:
            self.flags[last] = idx.flags[last]

    def recover(self, published: int) -> bool:
        """After a process died in the lock: undo its stream and flag writes if it journaled them.

        Returns whether it did. The caller then loads the published state (:meth:`pull`).
        """
        u = self.undo
        self.revalidate = True
        if u[0, 0] != published:
            return False
        m = int(u[0, 1])
        e = u[1 : m + 1]
        self.streams[e[:, 0]] = e[:, 1:4]
        fl = e[e[:, 4] >= 0]
        self.flags[fl[:, 4]] = fl[:, 5]
        u[0, 0] = -1
        return True


def _stream_top(streams: Any, default: int) -> int:
    """One more than the largest stream id in ``streams`` (``default`` when it is not integers)."""
    try:
        a = np.asarray(streams)
    except (TypeError, ValueError):
        return default
    if a.dtype.kind not in "iu" or a.size == 0:
        return default
    return int(a.max()) + 1


class SharedEpisodeMethods:
    """The episode writers of a :class:`~replaystore.shared.SharedTable` (a mixin).

    As :class:`~replaystore.Table`'s, plus what a shared table needs around them: the insert's
    row count noted for recovery (``ProcessGuard.acquire(rows=)``) and the streams it may change
    (:meth:`EpisodeSync.note_streams`). The readers (``sample_sequences``, ``sample_nstep``,
    ``sample_episodes``, ``episode_info``, ``episode_keys``) are the Table's own: entering the lock
    brings this process's index up to date.
    """

    def _steps_call(self, method: Any, rows: int, top: Any, args: dict[str, Any]) -> Any:
        guard, sync = self._guard, self._episync
        if self._segment.closed or sync is None:
            return method(self, **args)  # raises Closed, or EpisodeError (no episodes=)
        guard.acquire(rows=rows)
        try:
            sync.note_streams(_stream_top(top, sync.used + 1))
            if method is Table.end_episode:
                sync.ended = True
            return method(self, **args)
        finally:
            guard.release()


def _episode_write(name: str, top: str) -> Callable:
    """``SharedEpisodeMethods.<name>``: the Table's method in ``_steps_call`` (its signature and docstring).

    ``top``: the argument naming the streams written. The rows noted for recovery: 1 for
    ``add_step``, none for ``end_episode``, the batch's for the others (published all at once).
    """
    call = contract.CALLS[name]

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        a = contract.bind(call, args, kwargs)
        rows = 1 if name == "add_step" else 0 if name == "end_episode" else self._batch_rows(a["steps"])
        return self._steps_call(call.method, rows, a[top], a)

    return contract.forwarded(call, method, SharedEpisodeMethods)


for _name, _top in {
    "add_step": "stream",
    "extend_steps": "streams",
    "add_episode": "stream",
    "end_episode": "streams",
}.items():
    setattr(SharedEpisodeMethods, _name, _episode_write(_name, _top))
del _name, _top


__all__ = ["EpisodeSync", "SharedEpisodeMethods"]
