"""FrameStackStorage: stacked-frame observations stored one frame each (Atari-style replay).

An Atari transition carries ``obs`` and ``next_obs`` as stacks of the last ``S`` frames (e.g.
``uint8[4, 84, 84]``); consecutive transitions share ``S - 1`` frames of ``obs`` and ``S`` of
``next_obs``, so a naive table stores every frame ``2 * S`` times. This storage keeps one ring of
single frames and, per item, the ring position of its newest ``obs`` frame:

- an item that continues the previous one (that item did not end an episode and its newest
  ``next_obs`` frame equals this item's newest ``obs`` frame) adds **one** frame: its newest
  ``next_obs`` frame;
- any other item starts a *segment* and adds its whole ``obs`` stack plus that frame, so stacks
  never mix frames across episode boundaries (or across streams that were interleaved by mistake).

``read`` rebuilds stacks with one gather of ``S + 1`` frames per item: ``obs`` is frames
``[end - S + 1, end]`` and ``next_obs`` is ``[end - S + 2, end + 1]``. The two returned arrays are
overlapping views of that gather (writing into one changes the other); everything else is a copy.

Contract specifics:

- Items must arrive in time order of **one** stream (one environment); a vectorised environment
  needs one table per environment (or its steps would look like constant segment starts).
- Only the ``Fifo`` remover is allowed (the Table checks ``requires_fifo``): frames are freed in
  insertion order. When the frame ring is full, the storage asks the table to evict extra oldest
  items (:meth:`evictions_needed`); with very short episodes a table can therefore hold fewer
  items than its capacity unless ``frame_capacity`` is raised.
- The other fields are ordinary columns. ``end_keys`` name boolean fields (``done``, or
  ``terminated`` and ``truncated``) whose truth ends an episode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import CapacityError, InvalidArgument, SpecError
from ..placement import allocate
from ..staging import AddStager
from .columns import ColumnStorage
from .spec import Field

_SCALAR_TRUTH = (bool, np.bool_, int, float)
PLAN = "\x00frame-plan"  # key of a ready-made write plan in staged columns (not a valid field name)


class FrameStackStorage(ColumnStorage):
    """Column storage whose ``obs``/``next_obs`` frame stacks share one ring of single frames.

    Args:
        capacity: number of item slots.
        obs_key: the stacked observation field, shaped ``(S, *frame_shape)`` per item.
        next_obs_key: the stacked next-observation field, shaped as ``obs_key``.
        end_keys: fields whose truth marks the last item of an episode.
        spec: optional spec (else inferred from the first item).
        frame_capacity: frames in the ring (default ``capacity + capacity // 64 + 4 * S + 8``).
    """

    kind = "frames"
    requires_fifo = True
    #: the mutable scalars a shared table publishes (the scalar hook of :mod:`replaystore.placement`)
    SCALARS = ("_wpos", "_last_next", "_last_ended", "_log_head", "_log_tail")

    def __init__(
        self,
        capacity: int,
        obs_key: str = "obs",
        next_obs_key: str = "next_obs",
        end_keys: Sequence[str] = ("done",),
        spec: Mapping | None = None,
        frame_capacity: int | None = None,
    ) -> None:
        self.obs_key = obs_key
        self.next_obs_key = next_obs_key
        self.end_keys = tuple(end_keys)
        self._frame_capacity_arg = frame_capacity
        self.frames: np.ndarray | None = None
        # per-slot state through the placement hook (a shared table puts it in its segment)
        self._obs_end = allocate("frames.obs_end", (int(capacity),), np.int64, -1)  # ring position per slot
        # insertion-ordered log of (slot, first referenced frame) to find the low-water mark
        self._log_slot = allocate("frames.log_slot", (2 * int(capacity) + 2,), np.int64)
        self._log_first = allocate("frames.log_first", (2 * int(capacity) + 2,), np.int64)
        self._log_head = self._log_tail = 0
        self._alive = allocate("frames.alive", (int(capacity),), np.bool_)
        # where the write in progress ends (set before it writes frames: crash recovery's bound)
        self._writing = allocate("frames.writing", (1,), np.int64)
        self._wpos = 0  # absolute position of the next frame to write
        self._last_next = -1  # absolute position of the newest next_obs frame written
        self._last_ended = True
        self._plan_cache: tuple | None = None
        super().__init__(capacity, spec)

    # -- spec -------------------------------------------------------------------------------------
    def _adopt(self, spec: dict[str, Field]) -> None:
        for key in (self.obs_key, self.next_obs_key, *self.end_keys):
            if key not in spec:
                raise SpecError(f"frame-stack storage needs a field {key!r}; the items have {sorted(spec)}")
        obs, nxt = spec[self.obs_key], spec[self.next_obs_key]
        if obs != nxt or len(obs.shape) < 2:
            raise SpecError(
                f"{self.obs_key!r} and {self.next_obs_key!r} must be stacks of the same shape (S, ...): "
                f"got {obs} and {nxt}"
            )
        self.spec = spec
        self._nested = False
        self.stack = obs.shape[0]
        frame_capacity = self._frame_capacity_arg or self.capacity + self.capacity // 64 + 4 * self.stack + 8
        if frame_capacity < 2 * (self.stack + 1):
            raise InvalidArgument(f"frame_capacity {frame_capacity} is too small for stacks of {self.stack}")
        self.frame_capacity = int(frame_capacity)
        self.stage_rows = max(1, (self.frame_capacity - self.stack) // (self.stack + 1))
        self.frames = allocate("frames.ring", (self.frame_capacity, *obs.shape[1:]), obs.dtype)
        self.columns = {p: self._allocate(p, f) for p, f in spec.items() if p not in (self.obs_key, self.next_obs_key)}

    # -- planning -------------------------------------------------------------------------------------
    def _batch(self, columns: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(obs, next_obs, ends)`` with a leading batch axis, whatever ``prepare`` produced."""
        obs = columns[self.obs_key]
        nxt = columns[self.next_obs_key]
        if obs.ndim == len(self.spec[self.obs_key].shape):  # a single item
            obs, nxt = obs[None], nxt[None]
        ends = np.zeros(len(obs), dtype=bool)
        for key in self.end_keys:
            ends |= np.asarray(columns[key], dtype=bool).reshape(len(obs), -1).any(axis=1)
        return obs, nxt, ends

    def _segment_starts(self, obs: np.ndarray, nxt: np.ndarray, ends: np.ndarray) -> np.ndarray:
        starts = np.ones(len(obs), dtype=bool)
        if len(obs) > 1:
            same = (obs[1:, -1] == nxt[:-1, -1]).reshape(len(obs) - 1, -1).all(axis=1)
            starts[1:] = ~(same & ~ends[:-1])
        if not self._last_ended and self._last_next >= 0:  # the newest frame is never overwritten
            starts[0] = not np.array_equal(obs[0, -1], self.frames[self._last_next % self.frame_capacity])
        return starts

    def _plan(self, columns: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(starts, start_stacks, next_newest, ends)``: what :meth:`write` stores for a batch.

        Full stacks (from ``extend``/``prepare``) are planned here; :class:`FrameStager` hands in
        its plan ready-made under the ``PLAN`` key, having copied only the frames it needs.
        """
        if PLAN in columns:
            return columns[PLAN]
        cached = self._plan_cache
        if cached is not None and cached[0] is columns:
            return cached[1]
        obs, nxt, ends = self._batch(columns)
        starts = self._segment_starts(obs, nxt, ends)
        plan = (starts, obs[starts], nxt[:, -1], ends)
        self._plan_cache = (columns, plan)
        return plan

    def _frames_needed(self, columns: dict[str, Any]) -> int:
        starts = self._plan(columns)[0]
        return int(len(starts) + self.stack * starts.sum())

    def make_stager(self, rows: int) -> "FrameStager":
        """A stager that copies one frame per continuing item instead of two stacks."""
        return FrameStager(self, rows)

    def _live_entry(self, pos: int) -> bool:
        """Whether log entry ``pos`` still describes the item in its slot (slots are reused)."""
        i = pos % len(self._log_slot)
        slot = self._log_slot[i]
        return self._alive[slot] and self._obs_end[slot] - self.stack + 1 == self._log_first[i]

    def _low_water(self) -> int:
        while self._log_head < self._log_tail and not self._live_entry(self._log_head):
            self._log_head += 1
        if self._log_head == self._log_tail:
            return self._wpos
        return int(self._log_first[self._log_head % len(self._log_slot)])

    def evictions_needed(self, prepared: tuple, n: int) -> int:
        """How many of the oldest live items must leave so that ``prepared`` fits the frame ring.

        Raises:
            ValueError: the batch alone needs more frames than the ring holds.
        """
        columns, new_spec = prepared
        if self.spec is None:
            return 0
        needed = self._frames_needed(columns)
        if needed > self.frame_capacity - self.stack:
            raise CapacityError(
                f"a batch needing {needed} frames does not fit a frame ring of {self.frame_capacity}; "
                "insert smaller batches or raise frame_capacity"
            )
        free = self.frame_capacity - (self._wpos - self._low_water())
        if needed <= free:
            return 0
        # walk the live log from the oldest until enough frames are free
        size = len(self._log_slot)
        evict = 0
        pos = self._log_head
        while pos < self._log_tail:
            if self._live_entry(pos):
                evict += 1
                nxt = pos + 1
                while nxt < self._log_tail and not self._live_entry(nxt):
                    nxt += 1
                low = self._wpos if nxt == self._log_tail else int(self._log_first[nxt % size])
                if self.frame_capacity - (self._wpos - low) >= needed:
                    return evict
                pos = nxt
            else:
                pos += 1
        return evict

    # -- Storage interface -----------------------------------------------------------------------------
    def write(self, slots: slice | np.ndarray, prepared: tuple) -> None:
        """Write the frames of new items (one per continuing item, ``S + 1`` per segment start)."""
        super().write(slots, prepared)  # (the spec on the first write, and the other columns)
        slot_arr = np.arange(slots.start, slots.stop) if isinstance(slots, slice) else np.atleast_1d(slots)
        starts, start_stacks, next_newest, ends = self._plan(prepared[0])
        self._plan_cache = None
        S, F = self.stack, self.frame_capacity
        count = 1 + S * starts
        offset = np.cumsum(count) - count
        obs_end = self._wpos + offset + S * starts - 1
        total = int(offset[-1] + count[-1])
        self._writing[0] = self._wpos + total
        if starts.any():
            first = obs_end[starts] - S + 1
            pos = (first[:, None] + np.arange(S)) % F
            self.frames[pos.ravel()] = start_stacks.reshape(-1, *self.frames.shape[1:])
        self.frames[(obs_end + 1) % F] = next_newest
        self._obs_end[slot_arr] = obs_end
        self._alive[slot_arr] = True
        k = len(slot_arr)
        size = len(self._log_slot)
        if self._log_tail - self._log_head + k > size:
            self._compact_log()
        idx = (self._log_tail + np.arange(k)) % size
        self._log_slot[idx] = slot_arr
        self._log_first[idx] = obs_end - S + 1
        self._log_tail += k
        self._wpos += total
        self._last_next = int(obs_end[-1] + 1)
        self._last_ended = bool(ends[-1])

    def _compact_log(self) -> None:
        """Keep only the log entries of live items (at most ``capacity``), oldest first."""
        size = len(self._log_slot)
        pos = np.arange(self._log_head, self._log_tail) % size
        slot, first = self._log_slot[pos], self._log_first[pos]
        live = self._alive[slot] & (self._obs_end[slot] - self.stack + 1 == first)
        n = int(live.sum())
        self._log_slot[:n], self._log_first[:n] = slot[live], first[live]
        self._log_head, self._log_tail = 0, n

    def release(self, slots: np.ndarray) -> None:
        """Freed slots stop holding frames back (frames are reused in insertion order)."""
        self._alive[slots] = False  # (obs_end stays: crash recovery may revive a slot whose release was not published)

    # -- crash recovery (a shared table whose writer died inside the lock) -----------------------------
    def intact_after_crash(self, slots: np.ndarray, scalars: Mapping[str, int], intent: int) -> np.ndarray | None:
        """Internal (shared recovery): which of ``slots`` (published live items) still hold all their frames.

        ``scalars`` are this storage's published values (``SCALARS``). A process that died inside a
        write noted first where its frames end (``frames.writing``): from the published write
        position up to there it may have overwritten the oldest frames of the ring. An item that
        references any of them, or whose position is past the published ones (its slot was
        rewritten), is torn. (``intent`` is not needed: the note is exact.)
        """
        if self.spec is None:
            return None
        S, F = self.stack, self.frame_capacity
        wpos = int(scalars["_wpos"])
        written = min(max(int(self._writing[0]) - wpos, 0), F)
        end = self._obs_end[slots]
        return (end - S + 1 >= wpos + written - F) & (end + 1 < wpos)

    def rebuild_after_crash(self, slots: np.ndarray, scalars: Mapping[str, int]) -> dict[str, int]:
        """Internal (shared recovery): the scalars to publish after rebuilding from the kept ``slots``.

        Sets the published ``scalars``, then rebuilds the alive flags and the log from ``slots``
        (in insertion order).
        """
        for name in self.SCALARS:
            setattr(self, name, int(scalars[name]))
        self._plan_cache = None
        if self.spec is not None:
            slots = np.asarray(slots, dtype=np.int64)
            n = len(slots)
            self._alive[:] = False
            self._alive[slots] = True
            self._log_slot[:n] = slots
            self._log_first[:n] = self._obs_end[slots] - self.stack + 1
            self._log_head, self._log_tail = 0, n
        return {name: int(getattr(self, name)) for name in self.SCALARS}

    def read(self, slots: np.ndarray) -> dict[str, Any]:
        """Other columns gathered as usual; stacks rebuilt from one gather of ``S + 1`` frames each."""
        out = {p: col.take(slots, axis=0) for p, col in self.columns.items()}
        if self.spec is None:  # nothing written yet: no fields to read
            return out
        S = self.stack
        idx = (self._obs_end.take(slots)[:, None] + np.arange(-S + 1, 2)) % self.frame_capacity
        g = self.frames.take(idx.ravel(), axis=0).reshape(len(slots), S + 1, *self.frames.shape[1:])
        out[self.obs_key] = g[:, :S]
        out[self.next_obs_key] = g[:, 1:]
        return out

    def describe(self) -> dict:
        """As :meth:`ColumnStorage.describe`, plus the frame-stack options."""
        d = super().describe()
        d.update(
            obs_key=self.obs_key,
            next_obs_key=self.next_obs_key,
            end_keys=list(self.end_keys),
            frame_capacity=self._frame_capacity_arg,
        )
        return d

    def export(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Every field of ``slots`` with the stacks materialised (checkpoints re-deduplicate on load)."""
        out = self.read(slots)
        out[self.obs_key] = np.ascontiguousarray(out[self.obs_key])
        out[self.next_obs_key] = np.ascontiguousarray(out[self.next_obs_key])
        return out

    @property
    def frames_written(self) -> int:
        """Frames written since the storage was made (items that continue the previous one add 1, others ``S + 1``)."""
        return int(self._wpos)

    @property
    def nbytes(self) -> int:
        """Bytes held by the frame ring and the other columns."""
        return int(super().nbytes + (self.frames.nbytes if self.frames is not None else 0))


class FrameStager(AddStager):
    """Stages single adds for a :class:`FrameStackStorage`, copying only the frames it will keep.

    A continuing item costs one frame copy (its newest ``next_obs`` frame) instead of two whole
    stacks; a segment start also copies its ``obs`` stack. The continuity test is the storage's
    (:mod:`replaystore.storage.frames`), applied against the previous staged item or its last frame.
    """

    def __init__(self, storage: FrameStackStorage, rows: int) -> None:
        super().__init__(storage.spec, rows, skip=(storage.obs_key, storage.next_obs_key))
        self.storage = storage
        field = storage.spec[storage.obs_key]
        self.field = field
        frame_shape = field.shape[1:]
        self.next_newest = np.empty((rows, *frame_shape), dtype=field.dtype)
        self.start_stacks = np.empty((rows, *field.shape), dtype=field.dtype)
        self.starts = np.zeros(rows, dtype=bool)
        self.ends = np.zeros(rows, dtype=bool)
        self.m = 0

    def try_stage(self, item: Any, priority: float, version: int) -> bool:
        """Stage ``item``; ``False`` (nothing staged) if it needs the general path."""
        st = self.storage
        if type(item) is not dict:
            return False
        obs, nxt = item.get(st.obs_key), item.get(st.next_obs_key)
        f = self.field
        for a in (obs, nxt):
            if type(a) is not np.ndarray or a.dtype != f.dtype or a.shape != f.shape:
                return False
        try:
            end = False
            for k in st.end_keys:
                v = item[k]
                end = end or (bool(v) if type(v) in _SCALAR_TRUTH else bool(np.any(v)))
        except KeyError:
            return False
        i = self.n
        if i:
            prev_end, prev_frame = self.ends[i - 1], self.next_newest[i - 1]
        elif st._last_next >= 0:
            prev_end, prev_frame = st._last_ended, st.frames[st._last_next % st.frame_capacity]
        else:
            prev_end, prev_frame = True, None
        # bytes comparison: a memcmp of two frame copies, several times faster than array_equal
        start = prev_end or obs[-1].tobytes() != prev_frame.tobytes()
        if not super().try_stage(item, priority, version):
            return False
        self.next_newest[i] = nxt[-1]
        self.starts[i] = start
        self.ends[i] = end
        if start:
            self.start_stacks[self.m] = obs
            self.m += 1
        return True

    def take(self) -> tuple[tuple, int, np.ndarray, np.ndarray]:
        """As :meth:`AddStager.take`, with the frame plan under the ``PLAN`` key."""
        n, m = self.n, self.m
        (columns, spec), n, priorities, versions = super().take()
        columns[PLAN] = (self.starts[:n], self.start_stacks[:m], self.next_newest[:n], self.ends[:n])
        self.m = 0
        return (columns, spec), n, priorities, versions
