"""EpisodeIndex: every live step's stream, episode and position, and where step ``t`` lives.

The index is a part of the Table told about every insert, removal and in-place replacement under
the table's lock, exactly like its sampler and remover (it implements the
:class:`~replaystore.samplers.Selector` hooks; it never samples or evicts). Eviction, deletes,
staleness, ``max_times_sampled`` and ``clear`` therefore keep it consistent without any code of
their own.

State:

- per slot (17 bytes): ``uid = stream << 40 | t`` (int64; ``t`` is the step's position in its
  stream, 0, 1, 2, ... forever; ``-1`` for a free slot), from which :meth:`EpisodeIndex.streams`
  and :meth:`EpisodeIndex.positions` derive the stream and position; ``episode_of`` (a
  table-wide episode id, ``-1`` for a free slot) and ``pos_of`` (position within the episode, 0
  for its first step), both int32 until a value needs int64; ``flags``
  (``TERMINATED | TRUNCATED``; ``DETACHED`` only for steps restored from checkpoints of versions
  that detached steps, which belong to no stream);
- per stream: the next ``t``, the open episode (``-1`` when the next step starts a new one) and
  the next position in it, and a ring ``t -> slot`` with its gapless accounting
  (:mod:`replaystore.episodes.rings`: every live step is reachable through its ring or the
  overflow map, whatever else left the table).

Writers hand their rows over as a plan (:mod:`replaystore.episodes.plans`) registered for the
writing thread and computed when the table writes the rows (after any wait for the rate limiter,
so concurrent writers never interleave their plans); a restore is a plan with explicit rows.
"""

from __future__ import annotations

import threading

import numpy as np

from ..errors import EpisodeError
from ..samplers.base import Selector
from ..samplers.dense import DenseSet
from .config import Episodes
from .consistency import check_index_arrays
from .plans import ENDS, TERMINATED, TRUNCATED, StepPlan, compute_plan
from .rings import _T_MASK, DETACHED, UID_SHIFT, StreamRings, _pow2_at_least

_INT32_MAX = np.iinfo(np.int32).max
#: the per-stream state arrays (int64, indexed by stream id) and their initial value
_STREAM_ARRAYS = {
    "next_t": 0,
    "cur_ep": -1,
    "cur_pos": 0,
    "ring_off": 0,
    "ring_len": 0,
    "lo_t": 0,
    "n_live": 0,
    "oldest_t": 0,
}


class EpisodeIndex(StreamRings, Selector):
    """Per-slot and per-stream episode structure of a Table (see the module doc).

    Not thread-safe on its own: the Table calls it under its lock. ``live`` may be the table's
    ``Uniform`` sampler's set of live slots (shared to save memory) or a set of its own.
    """

    usable_as_remover = False

    def __init__(self, config: Episodes, live: DenseSet | None = None) -> None:
        super().__init__()
        self.options = config
        self._shared_live = live
        self._pending: dict[int, StepPlan] = {}
        self.validity = None  # a hook with on_insert/on_remove/on_update (prioritized sequences)

    # -- allocation ---------------------------------------------------------------------------------
    def bind(self, capacity: int, rng: np.random.Generator) -> None:  # noqa: D102
        super().bind(capacity, rng)
        c = self.capacity
        self.uid = np.full(c, -1, dtype=np.int64)  # stream << UID_SHIFT | t, -1 free
        self.episode_of = np.full(c, -1, dtype=np.int32)  # widened to int64 when an id needs it
        self.pos_of = np.zeros(c, dtype=np.int32)  # likewise
        self.flags = np.zeros(c, dtype=np.uint8)
        self.share_live(self._shared_live)
        # bumped on every change of the live steps (caches key on it); never reset, so caches of
        # the index before a clear() cannot be mistaken for current ones
        self.generation = getattr(self, "generation", -1) + 1
        self.next_episode = 0
        self._rings_alloc(c)
        self._streams_alloc(self.options.max_streams or 8)
        self.written = int(self.next_t.max())  # grows by every plan's rows: bounds every stream's next position

    def share_live(self, live: DenseSet | None) -> None:
        """Read the live steps from ``live``, a set another part of the table keeps.

        (The ring's or the Uniform sampler's.) ``None``: keep a set of its own, empty (the caller
        adds the live steps).
        """
        self._shared_live, self._own_live = live, live is None
        self.live = DenseSet(self.capacity) if live is None else live

    def _grow_streams(self, top: int) -> None:
        """Make the per-stream arrays hold stream id ``top`` (doubling, up to the stream limit)."""
        if top >= self.n_streams:
            self._streams_alloc(min(self.options.stream_limit, _pow2_at_least(top + 1)))

    def _streams_alloc(self, n: int) -> None:
        k = len(getattr(self, "next_t", ()))
        for name, fill in _STREAM_ARRAYS.items():
            a = np.full(n, fill, dtype=np.int64)
            if k:
                a[:k] = getattr(self, name)
            setattr(self, name, a)
        self._mark = np.zeros(n, dtype=np.int64)  # scratch for the distinct-streams test

    def streams(self, slots: np.ndarray) -> np.ndarray:
        """The stream id of each of ``slots`` (``-1`` for a free slot)."""
        return self.uid[slots] >> UID_SHIFT

    def positions(self, slots: np.ndarray) -> np.ndarray:
        """The position in its stream of each of the live ``slots`` (``_T_MASK`` for a restored detached step)."""
        return self.uid[slots] & _T_MASK

    def stream_t(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(streams(slots), positions(slots))`` with one gather."""
        u = self.uid[slots]
        return u >> UID_SHIFT, u & _T_MASK

    def _widen(self, max_pos: int, max_episode: int) -> None:
        """Make ``pos_of`` / ``episode_of`` int64 before a value beyond int32 is written."""
        if max_pos > _INT32_MAX and self.pos_of.dtype != np.int64:
            self.pos_of = self.pos_of.astype(np.int64)
        if max_episode > _INT32_MAX and self.episode_of.dtype != np.int64:
            self.episode_of = self.episode_of.astype(np.int64)

    @property
    def nbytes(self) -> int:
        """Bytes of the index's arrays.

        17 per slot, the rings, the per-stream state, and its own set of live slots (16 per slot)
        unless it shares the table's ``Uniform`` sampler's.
        """
        arrays = (self.uid, self.episode_of, self.pos_of, self.flags, self.ring, self._mark)
        arrays += tuple(getattr(self, name) for name in _STREAM_ARRAYS)
        own = (self.live.items, self.live.pos) if self._own_live else ()  # else the Uniform sampler's set
        if self._in_ov is not None:  # the overflow map (see the module doc)
            own = (*own, self._in_ov, *(self._ov_sorted or ()))
        return sum(a.nbytes for a in (*arrays, *own))

    @property
    def n_streams(self) -> int:
        """Size of the per-stream arrays (ids below it may be known)."""
        return len(self.next_t)

    def known(self, streams: np.ndarray) -> np.ndarray:
        """Which stream ids have written at least one step."""
        streams = np.asarray(streams, dtype=np.int64)
        out = np.zeros(streams.shape, dtype=bool)
        inside = streams < self.n_streams
        out[inside] = self.next_t[streams[inside]] > 0
        return out

    def fresh_stream(self) -> int:
        """A stream id larger than every id used so far."""
        used = np.flatnonzero(self.next_t > 0)
        return int(used[-1]) + 1 if len(used) else 0

    # -- plans ----------------------------------------------------------------------------------------
    def begin(self, plan: StepPlan) -> None:
        """Register ``plan`` for the calling thread's next insert.

        Raises :class:`EpisodeError` (nothing changed) when a stream would reach position
        ``2**40 - 1`` (the per-slot id's limit; that position marks restored detached steps).
        """
        n = len(plan.streams)
        self.written += n  # an upper bound of every stream's next position (plans that fail count too)
        known = plan.streams[plan.streams < self.n_streams] if self.written > _T_MASK else ()
        if len(known):
            us, counts = np.unique(known, return_counts=True)
            worst = int((self.next_t[us] + counts).max())
            if worst > _T_MASK:
                self.written -= n
                raise EpisodeError(
                    f"a stream would reach position {worst - 1}: positions must stay below "
                    "2**40 - 1 per stream (write to a new stream id)"
                )
        self._grow_streams(int(plan.streams[0] if plan.same_stream else plan.streams.max()) if n else 0)
        self._pending[threading.get_ident()] = plan

    def end(self) -> StepPlan | None:
        """Forget the calling thread's plan (after its insert returned or raised)."""
        return self._pending.pop(threading.get_ident(), None)

    def planned(self) -> bool:
        """Whether the calling thread registered a plan (a plain insert did not)."""
        return threading.get_ident() in self._pending

    def note_accepted(self, accepted: np.ndarray) -> None:
        """The table admits only rows ``accepted`` of the pending plan (the others were stale)."""
        plan = self._pending.get(threading.get_ident())
        if plan is not None:
            plan.accepted = accepted

    def _commit(self, plan: StepPlan) -> tuple:
        """Advance the streams by ``plan``'s rows (:func:`.compute_plan`); their ``(ts, episodes, pos, flags)``."""
        ts, eps, pos, flags, us, state, next_episode = compute_plan(
            plan, self.next_t, self.cur_ep, self.cur_pos, self.next_episode, self._mark
        )
        self.next_t[us], self.cur_ep[us], self.cur_pos[us] = state
        self.next_episode = next_episode
        plan.committed = True
        return ts, eps, pos, flags

    def finish(self, plan: StepPlan) -> None:
        """Advance the streams of a plan whose rows were all refused (stale): they leave holes."""
        if plan.committed or plan.rows is not None:
            return
        self._commit(plan)
        self.generation += 1  # the streams have holes now: caches of their structure are stale

    # -- Selector hooks (lock held by the table) -----------------------------------------------------------
    def insert(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Record the pending plan's rows in ``slots``."""
        plan = self._pending.get(threading.get_ident())
        if plan is None:  # the table guards plain inserts; this is a bug, not user input
            raise EpisodeError("an episodic table got rows without stream information")
        if plan.rows is not None:
            streams, ts, eps, pos, flags = plan.rows
        else:
            ts, eps, pos, flags = self._commit(plan)
            streams = plan.streams
            if plan.accepted is not None:
                a = plan.accepted
                streams, ts, eps, pos, flags = streams[a], ts[a], eps[a], pos[a], flags[a]
        if len(slots) < len(streams):  # a FIFO batch larger than the table keeps its newest rows
            tail = len(streams) - len(slots)
            streams, ts, eps, pos, flags = streams[tail:], ts[tail:], eps[tail:], pos[tail:], flags[tail:]
        if len(slots) != len(streams):
            raise EpisodeError(f"episode plan has {len(streams)} rows, the table wrote {len(slots)}")
        if len(ts):
            # pos <= t: the newest position bounds every position in the episode
            top = int(ts[-1]) if plan.shape == "same" else int(ts.max())
            if plan.shape == "restore":  # restored detached steps have t = -1
                top = max(top, int(pos.max()))
            if top > _INT32_MAX or self.next_episode > _INT32_MAX:
                self._widen(top, self.next_episode)
        self.episode_of[slots] = eps
        self.pos_of[slots] = pos
        self.flags[slots] = flags
        self.uid[slots] = (streams << UID_SHIFT) | (ts & _T_MASK)  # restored detached: t = -1 -> _T_MASK
        if plan.rows is not None and plan.shape == "restore":  # restored steps that were detached stay detached
            on = ts >= 0
            self.flags[slots[~on]] |= DETACHED
            self.n_detached += int((~on).sum())
            self._ring_put(slots[on], streams[on], ts[on], restore=True)
        else:
            self._ring_put(slots, streams, ts, plan.shape)
        if self._own_live:
            self.live.add(slots)
        self.generation += 1
        if self.validity is not None:
            self.validity.on_insert(slots, priorities)

    def remove(self, slots: np.ndarray) -> None:
        """Forget steps (their ring entries become stale by themselves)."""
        if self.validity is not None:
            self.validity.on_remove(slots)
        gap = self._count_out(slots)
        if self._ov_n:
            self._overflow_drop(slots)
        self.episode_of[slots] = -1
        self.uid[slots] = -1
        if gap is not None:  # (after the leaving steps are gone: the scan must not find them)
            self._advance_oldest(gap)
        if self._own_live:
            self.live.discard(slots)
        self.generation += 1

    def replace(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Evicted steps' slots took new steps."""
        self.remove(slots)
        self.insert(slots, keys, priorities)

    def update(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Priorities changed (prioritized sequences keep invalid starts at zero mass)."""
        if self.validity is not None:
            self.validity.on_update(slots)

    def sample(self, n: int):  # noqa: D102
        raise NotImplementedError("the episode index does not sample")

    def clear(self) -> None:
        """Forget every step and stream."""
        self.bind(self.capacity, self.rng)

    # -- replicas (replaystore.shared) -----------------------------------------------------------------
    def apply_rows(self, slots: np.ndarray, rows: tuple, priorities: np.ndarray) -> None:
        """Internal (replaystore.shared): enter steps whose rows another copy of this index computed.

        ``rows`` is ``(streams, ts, episodes, positions, flags)`` of the new steps in ``slots``
        (free in this index, each step newer than every live step of its stream, the stream
        state already loaded with :meth:`load_streams`); ``priorities`` are the slots' priorities
        (for prioritized sequence validity). Same effect as the insert that wrote them. Lock held.
        """
        if len(slots) == 0:
            return
        streams = rows[0]
        self._grow_streams(int(streams.max()))
        plan = StepPlan(streams, np.zeros(len(slots), bool), np.zeros(len(slots), bool), rows=rows)
        n = len(streams)
        if n == 1 or bool((streams == streams[0]).all()):
            plan.shape = "same"
        else:
            ar = np.arange(n)
            self._mark[streams] = ar
            plan.shape = "distinct" if bool((self._mark[streams] == ar).all()) else "general"
        tid = threading.get_ident()
        own = self._pending.get(tid)  # (a writer of this thread waiting for the rate limiter keeps its plan)
        self._pending[tid] = plan
        try:
            self.insert(slots, slots, priorities)
        finally:
            if own is None:
                del self._pending[tid]
            else:
                self._pending[tid] = own

    def refill_live(self) -> None:
        """Internal (replaystore.shared): its own set of live steps holds exactly the slots it has steps in.

        (After the table left ring mode in another process; nothing when it reads another part's set.)
        """
        if self._own_live:
            self.live.clear()
            self.live.add(np.flatnonzero(self.uid >= 0))

    def load_streams(
        self, ids: np.ndarray, next_t: np.ndarray, cur_ep: np.ndarray, cur_pos: np.ndarray, next_episode: int
    ) -> None:
        """Internal (replaystore.shared, restores): set the state of streams ``ids`` and the next episode id.

        As another copy of this index (or a checked checkpoint) has them (trusted input, lock
        held); a change of structure for the caches (the generation moves on).
        """
        if len(ids):
            self._grow_streams(int(ids.max()))
            self.next_t[ids], self.cur_ep[ids], self.cur_pos[ids] = next_t, cur_ep, cur_pos
            self.written = max(self.written, int(next_t.max()))
        self.next_episode = int(next_episode)
        self.generation += 1

    # -- export / import (checkpoints) ----------------------------------------------------------------
    def export_rows(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Per-step arrays of ``slots`` (checkpoint order); unattached steps get ``t = -1``."""
        st, t = self.stream_t(slots)
        t[self.lookup(st, t) != slots] = -1
        return {
            "stream": st,
            "t": t,
            "episode": self.episode_of[slots].astype(np.int64),
            "pos": self.pos_of[slots].astype(np.int64),
            "flags": self.flags[slots] & ENDS,
        }

    def export_streams(self) -> dict:
        """Per-stream state as JSON lists."""
        known = np.flatnonzero(self.next_t > 0)
        return {
            "ids": known.tolist(),
            "next_t": self.next_t[known].tolist(),
            "cur_ep": self.cur_ep[known].tolist(),
            "cur_pos": self.cur_pos[known].tolist(),
            "next_episode": int(self.next_episode),
        }

    def begin_restore(self, rows: dict[str, np.ndarray], streams: dict) -> None:
        """Check and register checkpointed steps for the table's next insert, which re-inserts them.

        ``rows`` and ``streams`` come from :meth:`export_rows` and :meth:`export_streams` through a
        checkpoint (untrusted): raises :class:`~replaystore.CheckpointError` unless they are one consistent
        history (:func:`~replaystore.episodes.consistency.check_index_arrays`) before changing anything.
        """
        check_index_arrays(rows, streams, self.options.stream_limit)
        st, t, ep, pos = (np.asarray(rows[k], dtype=np.int64) for k in ("stream", "t", "episode", "pos"))
        state = (np.asarray(streams[k], dtype=np.int64) for k in ("ids", "next_t", "cur_ep", "cur_pos"))
        self.load_streams(*state, int(streams["next_episode"]))
        flags = np.asarray(rows["flags"], dtype=np.uint8)
        plan = StepPlan(
            st, np.zeros(len(st), bool), np.zeros(len(st), bool), shape="restore", rows=(st, t, ep, pos, flags)
        )
        self._pending[threading.get_ident()] = plan


__all__ = ["DETACHED", "ENDS", "TERMINATED", "TRUNCATED", "UID_SHIFT", "EpisodeIndex", "StepPlan"]
