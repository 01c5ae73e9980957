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
  (``TERMINATED | TRUNCATED``, and ``DETACHED``, see below);
- per stream: the next ``t``, the open episode (``-1`` when the next step starts a new one) and
  the next position in it, and a ring ``t -> slot``: a power-of-two region of one flat array
  (``ring[ring_off[s] + (t & (ring_len[s] - 1))]``, int32 slots while the capacity fits). A ring
  entry is trusted only when the slot it names still holds that stream and ``t`` (its ``uid``:
  slots are reused, ``(stream, t)`` never is), so removals cost nothing here and ``B x L``
  positions are resolved with one vectorised expression.

Per stream, ``n_live`` counts its live steps a ring reaches and ``oldest_t`` is a lower bound of
their positions (exact while removals take the oldest steps, as FIFO eviction does). A stream with
``n_live == next_t - oldest_t`` is *gapless*: every position from ``oldest_t`` to its newest step is
a live step (pigeonhole), so a window whose two ends are live needs no check in between
(:meth:`EpisodeIndex.gapless`, :meth:`EpisodeIndex.ring_window`).

A ring is grown (doubling, to at least twice the span of the stream's live positions) when a new
step would overwrite a live one. Its length is capped at the first power of two >= twice the table
capacity; a stream whose live positions span more than that (possible only with a non-FIFO remover
keeping a very old step alive) *detaches* its oldest steps: they stay items of the table but are no
longer part of any sequence. Steps dropped from a ring when it is re-laid out are flagged
``DETACHED`` (and not counted in ``n_live``); steps whose ring entry a newer step overwrote are
unreachable the same way (their stream then has a gap, so no fast path trusts its ring).

Writers hand their rows over as a :class:`StepPlan` registered for the writing thread; the insert
hook turns it into positions when the table writes the rows (after any wait for the rate limiter,
so concurrent writers never interleave their plans).
"""

from __future__ import annotations

import threading

import numpy as np

from ..errors import EpisodeError
from ..samplers.base import Selector
from ..samplers.dense import DenseSet
from ..storage.columns import runs_view
from .config import Episodes

#: a step's ``uid`` is ``stream << UID_SHIFT | t``: one gather verifies a ring entry
UID_SHIFT = 40
_T_MASK = (1 << UID_SHIFT) - 1
TERMINATED = np.uint8(1)
TRUNCATED = np.uint8(2)
ENDS = TERMINATED | TRUNCATED
DETACHED = np.uint8(4)  # flag of a live step of no stream (only restored from old checkpoints: t = _T_MASK)
_INT32_MAX = np.iinfo(np.int32).max
_MIN_RING = 16


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


class StepPlan:
    """Rows a writer is about to insert: their streams and end flags (validated).

    ``new_episode`` forces the first row of each stream to start a new episode (``add_episode``).
    ``same_stream`` promises that every row has the same stream id.
    ``rows`` (restore only) gives explicit per-row ``(stream, t, episode, pos, flags)``.
    """

    __slots__ = ("streams", "terminated", "truncated", "new_episode", "accepted", "computed", "rows",
                 "committed", "same_stream", "shape")

    def __init__(self, streams: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                 new_episode: bool = False, rows: tuple | None = None, same_stream: bool = False) -> None:
        self.streams = streams
        self.terminated = terminated
        self.truncated = truncated
        self.new_episode = new_episode
        self.accepted: np.ndarray | None = None
        self.computed: tuple | None = None
        self.rows = rows
        self.committed = False
        self.same_stream = same_stream  # every row has the same stream id
        self.shape = "general"  # set by the plan's computation: "same", "distinct" or "general"


class EpisodeIndex(Selector):
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
        self._slot_dtype = np.int32 if c <= _INT32_MAX else np.int64
        self.live = self._shared_live if self._shared_live is not None else DenseSet(c)
        self._own_live = self._shared_live is None
        # bumped on every change of the live steps (caches key on it); never reset, so caches of
        # the index before a clear() cannot be mistaken for current ones
        self.generation = getattr(self, "generation", -1) + 1
        self.n_detached = 0  # live steps marked detached (see the module doc)
        self._ov: dict[int, int] = {}  # overflow: slot -> uid of live steps their ring no longer holds
        self._ov_sorted: tuple[np.ndarray, np.ndarray] | None = None  # (uids sorted, their slots)
        self._in_ov: np.ndarray | None = None  # per slot: in the overflow map (allocated at first use)
        self._gapless_at = (-1, False)  # (generation, all_gapless()) cache
        self.next_episode = 0
        self.ring_cap = _pow2_at_least(2 * c)
        self.ring = np.full(1024, -1, dtype=self._slot_dtype)
        self.ring_used = 0
        self._streams_alloc(self.options.max_streams or 8)
        self.written = int(self.next_t.max())  # grows by every plan's rows: bounds every stream's next position

    def share_live(self, live: DenseSet | None) -> None:
        """Read the live steps from ``live``, a set another part of the table keeps.

        (The ring's or the Uniform sampler's.) ``None``: keep a set of its own, empty (the caller
        adds the live steps).
        """
        if live is None:
            self.live, self._shared_live, self._own_live = DenseSet(self.capacity), None, True
        else:
            self.live, self._shared_live, self._own_live = live, live, False

    def _streams_alloc(self, n: int) -> None:
        old = getattr(self, "next_t", None)
        k = 0 if old is None else len(old)
        arrays = {"next_t": 0, "cur_ep": -1, "cur_pos": 0, "ring_off": 0, "ring_len": 0, "lo_t": 0,
                  "n_live": 0, "oldest_t": 0}
        for name, fill in arrays.items():
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
        arrays = (self.uid, self.episode_of, self.pos_of, self.flags, self.ring, self.next_t, self.cur_ep,
                  self.cur_pos, self.ring_off, self.ring_len, self.lo_t, self.n_live, self.oldest_t, self._mark)
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
        if self.written > _T_MASK:
            self._check_positions(plan)
        top = int(plan.streams[0] if plan.same_stream else plan.streams.max()) if n else 0
        if top >= self.n_streams:
            self._streams_alloc(min(self.options.stream_limit, _pow2_at_least(top + 1)))
        self._pending[threading.get_ident()] = plan

    def _check_positions(self, plan: StepPlan) -> None:
        known = plan.streams[plan.streams < self.n_streams]
        if len(known):
            us, counts = np.unique(known, return_counts=True)
            worst = int((self.next_t[us] + counts).max())
            if worst > _T_MASK:
                self.written -= len(plan.streams)
                raise EpisodeError(f"a stream would reach position {worst - 1}: positions must stay below "
                                   "2**40 - 1 per stream (write to a new stream id)")

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

    def _compute(self, plan: StepPlan) -> tuple:
        """Per-row ``(ts, episodes, pos, flags)`` and the streams' next state, for all rows.

        Three shapes of batch have a short path: one row, rows of one stream (a scalar stream id,
        ``add_episode``), rows of distinct streams (one row per environment of a vectorised env).
        """
        if plan.computed is not None:
            return plan.computed
        streams = plan.streams
        n = len(streams)
        flags = plan.terminated.astype(np.uint8) * TERMINATED | plan.truncated.astype(np.uint8) * TRUNCATED
        ends = flags != 0
        if n == 1:
            plan.shape = "same"
            s = int(streams[0])
            t = int(self.next_t[s])
            ep, pos, new = int(self.cur_ep[s]), int(self.cur_pos[s]), 0
            if ep < 0 or plan.new_episode:
                ep, pos, new = self.next_episode, 0, 1
            end = bool(ends[0])
            plan.computed = (np.array([t]), np.array([ep]), np.array([pos]), flags, streams,
                             (t + 1, -1 if end else ep, 0 if end else pos + 1), self.next_episode + new)
            return plan.computed
        if plan.same_stream:
            plan.shape = "same"
            s = int(streams[0])
            ar = np.arange(n)
            ts = self.next_t[s] + ar
            starts = np.empty(n, dtype=bool)
            starts[0] = self.cur_ep[s] < 0 or plan.new_episode
            starts[1:] = ends[:-1]
            c = np.cumsum(starts)
            eps = np.where(c > 0, self.next_episode + c - 1, self.cur_ep[s])
            last_start = np.maximum.accumulate(np.where(starts, ar, -1))
            pos = np.where(last_start >= 0, ar - last_start, self.cur_pos[s] + ar)
            end = bool(ends[-1])
            state = (self.next_t[s] + n, -1 if end else int(eps[-1]), 0 if end else int(pos[-1]) + 1)
            plan.computed = (ts, eps, pos, flags, streams[:1], state, self.next_episode + int(c[-1]))
            return plan.computed
        ar = np.arange(n)
        mark = self._mark
        mark[streams] = ar
        if bool((mark[streams] == ar).all()):  # distinct streams
            plan.shape = "distinct"
            ts = self.next_t[streams]
            starts = (self.cur_ep[streams] < 0) | plan.new_episode
            c = np.cumsum(starts)
            eps = np.where(starts, self.next_episode + c - 1, self.cur_ep[streams])
            pos = np.where(starts, 0, self.cur_pos[streams])
            state = (ts + 1, np.where(ends, -1, eps), np.where(ends, 0, pos + 1))
            plan.computed = (ts, eps, pos, flags, streams, state, self.next_episode + int(c[-1]))
            return plan.computed
        plan.shape = "general"
        order = np.argsort(streams, kind="stable")
        ss = streams[order]
        first = np.ones(n, dtype=bool)
        first[1:] = ss[1:] != ss[:-1]
        gidx = np.flatnonzero(first)
        gid = np.cumsum(first) - 1
        rank = ar - gidx[gid]
        us = ss[gidx]
        counts = np.diff(np.append(gidx, n))
        ts = self.next_t[us][gid] + rank
        es = ends[order]
        starts = np.empty(n, dtype=bool)
        starts[0] = False
        starts[1:] = es[:-1]
        starts[gidx] = (self.cur_ep[us] < 0) | plan.new_episode
        c = np.cumsum(starts)
        c_before_group = (c[gidx] - starts[gidx])[gid]
        in_new = c - c_before_group > 0
        eps = np.where(in_new, self.next_episode + c - 1, self.cur_ep[us][gid])
        last_start = np.maximum.accumulate(np.where(starts, ar, -1))
        pos = np.where(last_start >= gidx[gid], ar - last_start, self.cur_pos[us][gid] + rank)
        last = gidx + counts - 1
        lend = es[last]
        state = (self.next_t[us] + counts, np.where(lend, -1, eps[last]), np.where(lend, 0, pos[last] + 1))
        out_t, out_e, out_p = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
        out_t[order], out_e[order], out_p[order] = ts, eps, pos
        plan.computed = (out_t, out_e, out_p, flags, us, state, self.next_episode + int(c[-1]))
        return plan.computed

    def finish(self, plan: StepPlan) -> None:
        """Advance the streams of a plan whose rows were all refused (stale): they leave holes."""
        if plan.committed or plan.rows is not None:
            return
        _, _, _, _, us, state, next_episode = self._compute(plan)
        self.next_t[us], self.cur_ep[us], self.cur_pos[us] = state
        self.next_episode = next_episode
        plan.committed = True
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
            ts, eps, pos, flags, us, state, next_episode = self._compute(plan)
            streams = plan.streams
            self.next_t[us], self.cur_ep[us], self.cur_pos[us] = state
            self.next_episode = next_episode
            plan.committed = True
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
            if plan.rows is not None:  # restored detached steps have t = -1
                top = max(top, int(pos.max()))
            if top > _INT32_MAX or self.next_episode > _INT32_MAX:
                self._widen(top, self.next_episode)
        self.episode_of[slots] = eps
        self.pos_of[slots] = pos
        self.flags[slots] = flags
        self.uid[slots] = (streams << UID_SHIFT) | (ts & _T_MASK)  # restored detached: t = -1 -> _T_MASK
        if plan.rows is not None:  # restored steps that were detached stay detached
            on = ts >= 0
            self.flags[slots[~on]] |= DETACHED
            self.n_detached += int((~on).sum())
            self._count_in(streams[on], ts[on], "general")
            self._ring_put(slots[on], streams[on], ts[on], restore=True)
        else:
            self._count_in(streams, ts, plan.shape)
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
        self._count_out(slots)
        if self._ov:
            self._overflow_drop(slots)
        self.episode_of[slots] = -1
        self.uid[slots] = -1
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

    # -- gapless streams --------------------------------------------------------------------------------
    def _count_in(self, streams: np.ndarray, ts: np.ndarray, shape: str) -> None:
        """Count new attached steps (each newer than every live step of its stream)."""
        if len(streams) == 0:
            return
        if len(streams) == 1 or shape == "same":
            s = int(streams[0])
            if self.n_live[s] == 0:
                self.oldest_t[s] = int(ts.min())
            self.n_live[s] += len(ts)
            return
        if shape == "distinct":
            empty = self.n_live[streams] == 0
            self.oldest_t[streams[empty]] = ts[empty]
            self.n_live[streams] += 1
            return
        us, inv, counts = np.unique(streams, return_inverse=True, return_counts=True)
        lo = np.full(len(us), np.iinfo(np.int64).max)
        np.minimum.at(lo, inv, ts)
        empty = self.n_live[us] == 0
        self.oldest_t[us[empty]] = lo[empty]
        self.n_live[us] += counts

    def _count_out(self, slots: np.ndarray) -> None:
        """Uncount leaving steps; ``oldest_t`` advances when its stream's oldest step leaves.

        It moves past the leaving steps when they are exactly the oldest ones, else one position,
        and then on to the next live step when the stream has a gap (so a stream whose holes all
        left is gapless again).
        """
        uid = self.uid[slots]
        counted = uid >= 0  # free slots and detached steps were not counted
        if self.n_detached:
            detached = (self.flags[slots] & DETACHED) != 0
            self.n_detached -= int(detached.sum())
            counted &= ~detached
        uid = uid[counted]
        if len(uid) == 0:
            return
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
                if left != self.next_t[s] - new and not self._live_at(s, new):
                    self._advance_oldest(np.array([s]))
            return
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
        if gap.any():
            self._advance_oldest(us[gap])

    def _live_at(self, s: int, t: int) -> bool:
        """Whether position ``t`` of stream ``s`` is a live step its ring holds (scalar, cheap)."""
        ln = int(self.ring_len[s])
        if ln == 0:
            return False
        slot = int(self.ring[int(self.ring_off[s]) + (t & (ln - 1))])
        return slot >= 0 and int(self.uid[slot]) == (s << UID_SHIFT | t)

    def _advance_oldest(self, streams: np.ndarray) -> None:
        """Move ``oldest_t`` of ``streams`` (which have live steps) on to their oldest live step.

        Scans blocks of positions with :meth:`lookup`; a stream whose next live step is further
        than the blocks reach keeps a lower bound (it has a gap either way).
        """
        for width in (8, 64, 512):
            t0 = self.oldest_t[streams]
            ts = t0[:, None] + np.arange(width)
            found = (self.lookup(streams[:, None], ts) >= 0) & (ts < self.next_t[streams][:, None])
            has = found.any(axis=1)
            self.oldest_t[streams] = np.where(has, t0 + found.argmax(axis=1), t0 + width)
            streams = streams[~has]
            if len(streams) == 0:
                return

    def all_gapless(self) -> bool:
        """Whether every stream is gapless and no live step is detached (cheap while streams are few).

        ``False`` may also mean "not known cheaply" (many stream ids): test :meth:`gapless` of the
        streams at hand then.
        """
        if self._gapless_at[0] == self.generation:
            return self._gapless_at[1]
        ok = (not self.n_detached and len(self.next_t) <= 64
              and bool((self.n_live == self.next_t - self.oldest_t).all()))
        self._gapless_at = (self.generation, ok)
        return ok

    def gapless(self, streams: np.ndarray) -> np.ndarray:
        """Which ``streams`` have no gap: a live step at every position from their oldest on.

        Every position from ``oldest_t`` to the newest written one holds a live, ring-reachable
        step (no deleted, out-of-order evicted, refused or detached step in between).
        """
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
        if self._ov:  # live steps their ring no longer holds (see the module doc)
            miss = out < 0
            if miss.any():
                out[miss] = self._overflow_find(np.broadcast_to(want, out.shape)[miss])
        return out

    def _overflow_find(self, uids: np.ndarray) -> np.ndarray:
        """The slots of the overflow steps ``uids`` (``-1`` where not there)."""
        if self._ov_sorted is None:
            slots = np.fromiter(self._ov.keys(), dtype=np.int64, count=len(self._ov))
            u = self.uid[slots]
            order = np.argsort(u)
            self._ov_sorted = (u[order], slots[order])
        su, ss = self._ov_sorted
        i = np.minimum(np.searchsorted(su, uids), len(su) - 1)
        return np.where(su[i] == uids, ss[i], -1)

    def _overflow_add(self, slots: np.ndarray) -> None:
        """Live steps their stream's ring is about to lose: find them through the overflow map."""
        if len(slots):
            self._ov.update(dict.fromkeys(slots.tolist(), 0))
            if self._in_ov is None:
                self._in_ov = np.zeros(self.capacity, dtype=bool)
            self._in_ov[slots] = True
            self._ov_sorted = None

    def _overflow_drop(self, slots: np.ndarray) -> None:
        """Forget leaving ``slots`` that were overflow steps."""
        gone = slots[self._in_ov[slots]]
        if len(gone):
            for sl in gone.tolist():
                del self._ov[sl]
            self._in_ov[gone] = False
            self._ov_sorted = None

    @property
    def n_overflow(self) -> int:
        """Live steps found through the overflow map.

        Steps kept far behind their stream's newest one by deletes, retirements or a non-FIFO remover.
        """
        return len(self._ov)

    def attached(self, slots: np.ndarray) -> np.ndarray:
        """Which live ``slots`` are reachable through their stream's ring."""
        st, t = self.stream_t(slots)
        return self.lookup(st, t) == slots

    def _ring_put(self, slots: np.ndarray, streams: np.ndarray, ts: np.ndarray, shape: str = "general",
                  restore: bool = False) -> None:
        """Enter new steps in their rings (``restore``: steps of any age, into an empty index)."""
        if len(slots) == 0:
            return
        if len(slots) == 1 or shape == "same":
            s, lo, hi = int(streams[0]), int(ts[0]), int(ts[-1])
            if self.ring_len[s] == 0 or hi - self.lo_t[s] >= self.ring_len[s]:
                self._ensure(s, lo, hi)
            self.ring[self.ring_off[s] + (ts & (self.ring_len[s] - 1))] = slots
            return
        if shape == "distinct":
            ln = self.ring_len[streams]
            need = (ln == 0) | (ts - self.lo_t[streams] >= ln)
            if need.any():
                for i in np.flatnonzero(need).tolist():
                    self._ensure(int(streams[i]), int(ts[i]), int(ts[i]))
                ln = self.ring_len[streams]
            self.ring[self.ring_off[streams] + (ts & (ln - 1))] = slots
            return
        us, inv = np.unique(streams, return_inverse=True)
        hi = np.full(len(us), np.iinfo(np.int64).min)
        lo = np.full(len(us), np.iinfo(np.int64).max)
        np.maximum.at(hi, inv, ts)
        np.minimum.at(lo, inv, ts)
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

        The ring grows (doubling) to twice the span of its live steps and the new positions, up to
        ``ring_cap``; live steps further than ``ring_cap / 2`` behind ``t_hi`` then move to the
        overflow map (they stay live and reachable through :meth:`lookup`). ``lo_t[s]`` becomes the
        oldest position the ring holds, so the next call comes at least ``ring_len / 2`` positions
        later (amortised O(1) per step).
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
            if self._ov:
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
        checkpoint (untrusted): raises ``ValueError`` on inconsistent input before changing anything.
        """
        st, t, ep, pos, fl = (np.asarray(rows[k]) for k in ("stream", "t", "episode", "pos", "flags"))
        ids = np.asarray(streams["ids"], dtype=np.int64)
        nxt, cur_ep, cur_pos = (np.asarray(streams[k], dtype=np.int64) for k in ("next_t", "cur_ep", "cur_pos"))
        next_episode = int(streams["next_episode"])
        limit = self.options.stream_limit
        if not (ids.ndim == 1 and nxt.shape == cur_ep.shape == cur_pos.shape == ids.shape):
            raise ValueError("episode stream state has inconsistent lengths")
        if len(ids) and (ids.min() < 0 or ids.max() >= limit or len(np.unique(ids)) != len(ids)
                         or (nxt < 1).any() or (nxt > _T_MASK).any() or (cur_pos < 0).any()
                         or (cur_ep >= next_episode).any()):
            raise ValueError("episode stream state is out of range")
        if len(st):
            if st.min() < 0 or st.max() >= limit or not np.isin(st, ids).all():
                raise ValueError("a step names a stream the stream state does not know")
            if t.min() < -1 or ep.min() < 0 or ep.max() >= next_episode or pos.min() < 0 or fl.max() > 3:
                raise ValueError("step positions, episode ids or flags are out of range")
            top = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
            np.maximum.at(top, st, t)
            if (top[ids] >= nxt).any():
                raise ValueError("a step's position is not below its stream's next position")
        if len(ids):
            top_id = int(ids.max())
            if top_id >= self.n_streams:
                self._streams_alloc(_pow2_at_least(top_id + 1))
            self.next_t[ids], self.cur_ep[ids], self.cur_pos[ids] = nxt, cur_ep, cur_pos
            self.written = int(nxt.max())
        self.next_episode = next_episode
        plan = StepPlan(st.astype(np.int64), np.zeros(len(st), bool), np.zeros(len(st), bool),
                        rows=(st.astype(np.int64), t.astype(np.int64), ep.astype(np.int64),
                              pos.astype(np.int64), fl.astype(np.uint8)))
        self._pending[threading.get_ident()] = plan
