"""``NaiveReplayBuffer`` (a FIFO ring of any items, uniform sampling) and its variants.

``ElasticReplayBuffer`` samples only from the most recent items, ``SequenceReplayBuffer`` samples
windows of consecutive items.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ._config import CompatError
from .base_buffer import RingBufferBase, choose
from .registry import BUFFER_REGISTRY


@BUFFER_REGISTRY.register("naive")
class NaiveReplayBuffer(RingBufferBase):
    """A thread-safe FIFO ring of arbitrary items with uniform sampling.

    Args:
        cfg: a dict or EasyDict merged over :meth:`default_config` (``replay_buffer_size``,
            ``deepcopy``, ``enable_track_used_data``, ``periodic_thruput_seconds``).
        tb_logger: a TensorBoard ``SummaryWriter`` for the throughput monitor (else logging only).
        exp_name: experiment name (kept for DI-engine's signature; nothing is written to disk).
        instance_name: name used in logs and TensorBoard tags.
    """

    config = dict(
        type="naive",
        replay_buffer_size=10000,
        deepcopy=False,
        enable_track_used_data=False,
        periodic_thruput_seconds=60,
    )

    def _configure(self) -> None:
        self._data: list[Any] = [None] * self._replay_buffer_size
        self._tail = 0
        self._valid_count = 0
        self._push_count = 0

    # -- push -------------------------------------------------------------------------------------
    def push(self, data: Any, cur_collector_envstep: int = -1) -> None:
        """Insert one item, or each item of a list, overwriting the oldest slots.

        Any object is accepted except ``None`` (it would be indistinguishable from an empty
        slot). With ``deepcopy`` the buffer stores copies. ``cur_collector_envstep`` is unused.

        Raises:
            TypeError: an item is ``None``, or (with ``enable_track_used_data``) not a dict with a
                ``'data_id'``. Nothing is stored then.
        """
        items = data if isinstance(data, list) else [data]
        self._extend(items)

    def _extend(self, items: list) -> None:
        for i, d in enumerate(items):
            if d is None:
                raise TypeError(f"cannot push None (item {i}): None marks an empty slot")
        self._check_tracked(items)
        if not items:
            return
        if self._deepcopy:
            items = copy.deepcopy(items)
        n = self._replay_buffer_size
        with self._lock:
            evicted = []
            added = 0
            tail = self._tail
            slots = (tail + np.arange(len(items))) % n
            for s, d in zip(slots.tolist(), items):
                old = self._data[s]
                if old is None:
                    added += 1
                else:
                    evicted.append(old)
                self._data[s] = d
            self._tail = (tail + len(items)) % n
            self._valid_count += added
            self._push_count += len(items)
            self._discard(evicted)
            self._periodic_thruput_monitor.record(pushed=len(items), valid=self._valid_count)

    # -- sample -----------------------------------------------------------------------------------
    def _filled(self) -> int:
        """Slots ``[0, filled)`` hold the data (the ring fills from slot 0)."""
        return self._replay_buffer_size if self._valid_count == self._replay_buffer_size else self._tail

    def sample(
        self, size: int, cur_learner_iter: int, sample_range: slice | None = None, replace: bool = False
    ) -> list | None:
        """``size`` items drawn uniformly, or ``None`` (logged) when that is impossible.

        Args:
            size: number of items; 0 returns ``[]``.
            cur_learner_iter: unused (DI-engine's signature).
            sample_range: a slice of the physical slots ``[0, filled)`` to draw from, e.g.
                ``slice(-10, None)``: the last 10 slots. Slots follow push order until the ring
                wraps; Python slice rules apply (negative and ``None`` bounds, steps).
            replace: draw with replacement (duplicates are the same object).

        Returns:
            The items (deep copies with ``deepcopy``), or ``None`` if the buffer is empty or holds
            (in ``sample_range``) fewer than ``size`` items without ``replace``.
        """
        size = int(size)
        if size == 0:
            return []
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        with self._lock:
            if not self._sample_check(size, replace):
                return None
            slots = self._get_indices(size, sample_range, replace)
            if slots is None:
                return None
            out = self._sample_with_indices(slots)
        self._periodic_thruput_monitor.record(sampled=len(out))
        return out

    def _usable(self) -> int:
        """How many items sampling draws from."""
        return self._valid_count

    def _sample_check(self, size: int, replace: bool) -> bool:
        usable = self._usable()
        if usable <= 0:
            self._logger.info("The buffer is empty (or an elastic buffer's size is 0)")
            return False
        if usable < size and not replace:
            self._logger.info("Not enough items to sample %d without replacement (have %d)", size, usable)
            return False
        return True

    def _get_indices(self, size: int, sample_range: slice | None, replace: bool) -> list[int] | None:
        cand = range(self._filled())
        if sample_range is not None:
            if not isinstance(sample_range, slice):
                raise TypeError(f"sample_range must be a slice, got {type(sample_range).__name__}")
            cand = cand[sample_range]
        if len(cand) == 0 or (len(cand) < size and not replace):
            self._logger.info(
                "sample_range %s holds %d items, cannot sample %d%s",
                sample_range,
                len(cand),
                size,
                "" if replace else " without replacement",
            )
            return None
        pos = choose(len(cand), size, replace)
        return (cand.start + cand.step * pos).tolist()

    def _sample_with_indices(self, slots: list[int]) -> list:
        data = self._data
        if self._deepcopy:
            return [copy.deepcopy(data[s]) for s in slots]
        return [data[s] for s in slots]

    # -- the rest of the interface ----------------------------------------------------------------
    def update(self, info: Any) -> None:
        """Do nothing: the naive buffer has no priorities (DI-engine's signature)."""
        self._logger.debug("NaiveReplayBuffer.update does nothing")

    def clear(self) -> None:
        """Remove every item; reset tail, count and ``push_count`` (tracked files are deleted)."""
        with self._lock:
            live = [d for d in self._data if d is not None]
            self._data = [None] * self._replay_buffer_size
            self._valid_count = 0
            self._push_count = 0
            self._tail = 0
            self._discard(live)
            self._periodic_thruput_monitor.record(valid=0)

    def state_dict(self) -> dict:
        """``{'data', 'tail', 'valid_count', 'push_count'}``; ``data`` is a copy of the slot list."""
        with self._lock:
            return {
                "data": list(self._data),
                "tail": self._tail,
                "valid_count": self._valid_count,
                "push_count": self._push_count,
            }

    def _push_loaded(self, items: list) -> None:
        self._extend(items)

    def _load_slots(self, state: Mapping, data: list, tail: int) -> None:
        with self._lock:
            self._data = data
            self._tail = tail
            self._valid_count = sum(d is not None for d in data)
            self._push_count = int(state.get("push_count", self._valid_count))
            self._periodic_thruput_monitor.record(valid=self._valid_count)


@BUFFER_REGISTRY.register("elastic")
class ElasticReplayBuffer(NaiveReplayBuffer):
    """A naive buffer that samples only from its most recent ``set_buffer_size(envstep)`` items.

    ``cfg.set_buffer_size`` (required) maps a collector env step to the number of recent items to
    sample from; :meth:`update` re-evaluates it for a new env step.
    """

    config = {**NaiveReplayBuffer.config, "type": "elastic"}

    def _configure(self) -> None:
        super()._configure()
        fn = self._cfg.get("set_buffer_size")
        if not callable(fn):
            raise CompatError("ElasticReplayBuffer needs cfg.set_buffer_size: a callable envstep -> size")
        self._set_buffer_size: Callable[[int], int] = fn
        self._current_buffer_size = int(fn(0))

    def update(self, envstep: int) -> None:  # type: ignore[override]
        """Set the number of recent items to sample from to ``set_buffer_size(envstep)``."""
        self._current_buffer_size = int(self._set_buffer_size(envstep))

    @property
    def current_buffer_size(self) -> int:
        """How many of the most recent items sampling draws from (before capping by the count)."""
        return self._current_buffer_size

    def _usable(self) -> int:
        return min(self._valid_count, self._current_buffer_size)

    def _get_indices(self, size: int, sample_range: slice | None, replace: bool) -> list[int] | None:
        if sample_range is not None:
            raise CompatError("ElasticReplayBuffer does not support sample_range")
        back = choose(self._usable(), size, replace)
        return ((self._tail - 1 - back) % self._replay_buffer_size).tolist()


@BUFFER_REGISTRY.register("sequence")
class SequenceReplayBuffer(NaiveReplayBuffer):
    """A naive buffer that samples windows of ``sequence`` consecutive items.

    As in DI-engine, the slots are cut into chunks of :attr:`chunk_len` (500) items, taken to be
    episodes; a window never crosses a chunk boundary.
    """

    config = {**NaiveReplayBuffer.config, "type": "sequence"}
    #: slots per episode chunk (DI-engine hard-codes 500)
    chunk_len = 500

    def sample(
        self,
        batch: int,
        sequence: int,
        cur_learner_iter: int,  # type: ignore[override]
        sample_range: slice | None = None,
        replace: bool = False,
    ) -> list | None:
        """``batch`` windows (lists) of ``sequence`` consecutive items, or ``None`` (logged).

        Returns ``None`` when the buffer holds fewer than ``batch * sequence`` items (without
        ``replace``) or no chunk holds a whole window. ``sample_range`` is not supported.
        """
        batch, sequence = int(batch), int(sequence)
        if batch == 0:
            return []
        if batch < 0 or sequence < 1:
            raise ValueError(f"batch must be >= 0 and sequence >= 1, got {batch}, {sequence}")
        if sample_range is not None:
            raise NotImplementedError("sample_range is not supported by SequenceReplayBuffer")
        with self._lock:
            if not self._sample_check(batch * sequence, replace):
                return None
            filled = self._filled()
            chunks = math.ceil(filled / self.chunk_len)
            lengths = np.minimum(self.chunk_len, filled - np.arange(chunks) * self.chunk_len)
            eligible = np.flatnonzero(lengths >= sequence)
            if len(eligible) == 0:
                self._logger.info("No chunk holds a window of %d items", sequence)
                return None
            chunk = eligible[np.random.randint(0, len(eligible), size=batch)]
            offsets = np.floor(np.random.random(batch) * (lengths[chunk] - sequence + 1)).astype(np.int64)
            starts = (chunk * self.chunk_len + offsets).tolist()
            if self._deepcopy:
                out = [copy.deepcopy(self._data[s : s + sequence]) for s in starts]
            else:
                out = [self._data[s : s + sequence] for s in starts]
        self._periodic_thruput_monitor.record(sampled=len(out))
        return out
