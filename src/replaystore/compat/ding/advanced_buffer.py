"""``AdvancedReplayBuffer``: prioritized replay with use and staleness limits, rate control, monitors.

This module keeps the items, the counters and DI-engine's contracts (the class and its methods
state them); the slot ring is :class:`~replaystore.compat.ding.base_buffer.RingBufferBase`'s, the
sampling weights live in :class:`~replaystore.compat.ding.priority_index.PriorityIndex`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._config import CompatError
from ._persist import slot_state
from .base_buffer import RingBufferBase
from .priority_index import PriorityIndex, collect_iter, item_priorities
from .registry import BUFFER_REGISTRY
from .utils import SampleReporter, ThruputController

_EPS = 1e-5


@BUFFER_REGISTRY.register("advanced")
class AdvancedReplayBuffer(RingBufferBase):
    """Prioritized replay buffer of dict items (DI-engine's ``'advanced'`` buffer).

    Pushing an item writes into it (or into its copy, with ``deepcopy``) ``replay_unique_id``
    (``'{instance_name}_{n}'``), ``replay_buffer_idx`` (its slot) and, if it has none,
    ``priority`` (the largest priority reported so far, 1.0 initially). Sampling adds
    ``staleness`` (``cur_learner_iter - collect_iter``; -1 without ``collect_iter``), ``use``
    (times sampled, this draw included) and ``IS`` (``(P(i) / P_min) ** -beta``).

    Args:
        cfg: a dict or EasyDict merged over :meth:`default_config`.
        tb_logger: a TensorBoard ``SummaryWriter`` for the monitors (else logging only).
        exp_name: experiment name (DI-engine's signature; nothing is written to disk).
        instance_name: prefix of the unique ids; name in logs and TensorBoard tags.

    Raises:
        CompatError: an invalid config (``alpha`` or ``beta`` outside ``[0, 1]``,
            ``sample_min_limit_ratio < 1``, a non-positive size, ``max_use`` or ``anneal_step``).
    """

    config = dict(
        type="advanced",
        replay_buffer_size=4096,
        max_use=float("inf"),
        max_staleness=float("inf"),
        alpha=0.6,
        beta=0.4,
        anneal_step=int(1e5),
        enable_track_used_data=False,
        deepcopy=False,
        thruput_controller=dict(
            push_sample_rate_limit=dict(max=float("inf"), min=0),
            window_seconds=30,
            sample_min_limit_ratio=1,
        ),
        monitor=dict(
            sampled_data_attr=dict(average_range=5, print_freq=200),
            periodic_thruput=dict(seconds=60),
        ),
    )

    def _thruput_seconds(self) -> float:
        return float(self._cfg.monitor.periodic_thruput.seconds)

    def _configure(self) -> None:
        cfg = self._cfg
        n = self._replay_buffer_size
        alpha = float(cfg.alpha)
        self._beta = float(cfg.beta)
        if not 0 <= alpha <= 1:
            raise CompatError(f"alpha must be in [0, 1], got {cfg.alpha}")
        if not 0 <= self._beta <= 1:
            raise CompatError(f"beta must be in [0, 1], got {cfg.beta}")
        self._anneal_step = int(cfg.anneal_step)
        if self._anneal_step < 0:
            raise CompatError(f"anneal_step must be >= 0, got {cfg.anneal_step}")
        self._beta_init = self._beta
        self._max_use = float(cfg.max_use)
        if not self._max_use > 0:
            raise CompatError(f"max_use must be > 0, got {cfg.max_use}")
        self._max_staleness = float(cfg.max_staleness)
        tc = cfg.thruput_controller
        self._sample_min_limit_ratio = float(tc.sample_min_limit_ratio)
        if not self._sample_min_limit_ratio >= 1:
            raise CompatError(f"sample_min_limit_ratio must be >= 1, got {tc.sample_min_limit_ratio}")
        limit = tc.push_sample_rate_limit
        limited = float(limit["max"]) != math.inf or float(limit["min"]) != 0
        self._thruput_controller = ThruputController(tc) if limited else None
        mon = cfg.monitor.sampled_data_attr
        self._sample_reporter = SampleReporter(
            mon.average_range, mon.print_freq, self._logger, self._tb_logger, self._instance_name
        )
        self._cur_collector_envstep = -1
        self._eps = _EPS

        self._data: list[Any] = [None] * n
        self._ids: list[str | None] = [None] * n
        self._use = np.zeros(n, dtype=np.int64)
        self._retired = np.zeros(n, dtype=bool)
        self._index = PriorityIndex(n, alpha, math.isfinite(self._max_staleness))
        self._tail = 0
        self._valid_count = 0
        self._push_count = 0
        self._next_unique_id = 0
        self._max_priority = 1.0

    # -- properties -------------------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        """The priority exponent: an item's weight is ``priority ** alpha`` (applies to later writes)."""
        return self._index.alpha

    @alpha.setter
    def alpha(self, alpha: float) -> None:
        self._index.alpha = float(alpha)

    @property
    def beta(self) -> float:
        """The importance-sampling exponent (annealed towards 1 by every sample call)."""
        return self._beta

    @beta.setter
    def beta(self, beta: float) -> None:
        self._beta = float(beta)

    @property
    def max_priority(self) -> float:
        """Largest priority reported through :meth:`update` (1.0 after construction or ``clear``)."""
        return self._max_priority

    # -- push -------------------------------------------------------------------------------------
    def push(self, data: Any, cur_collector_envstep: int = -1) -> None:
        """Insert a dict, or each dict of a list, overwriting the oldest slots.

        The push is dropped (and logged) if the throughput controller refuses it.

        Raises:
            TypeError: an item is not a dict (or, with ``enable_track_used_data``, has no
                ``'data_id'``). CompatError: a priority is negative, NaN or infinite. Nothing is
                stored when either is raised.
        """
        items = data if isinstance(data, list) else [data]
        self._extend(items, cur_collector_envstep, check_rate=True)

    def _extend(self, items: list, envstep: int = -1, check_rate: bool = True) -> None:
        for i, d in enumerate(items):
            if not isinstance(d, dict):
                raise TypeError(f"AdvancedReplayBuffer stores dicts; item {i} is {type(d).__name__}")
        self._check_tracked(items)
        given, missing = item_priorities(items)
        k = len(items)
        if k == 0:
            return
        if check_rate and self._thruput_controller is not None:
            ok, why = self._thruput_controller.can_push(k)
            if not ok:
                self._logger.info("Refuse to push %d items because %s", k, why)
                return
        if self._deepcopy:
            items = copy.deepcopy(items)
        n = self._replay_buffer_size
        with self._lock:
            tail = self._tail
            uid0 = self._next_unique_id
            maxp = self._max_priority
            name = self._instance_name
            data, ids, retired = self._data, self._ids, self._retired
            first = max(0, k - n)  # items before it are overwritten within this call
            gone = items[:first]
            replaced = 0
            prios = [maxp if p is None else p for p in given] if missing else given
            slots = []
            for j, d in enumerate(items):
                s = (tail + j) % n
                uid = f"{name}_{uid0 + j}"
                d["replay_unique_id"] = uid
                d["replay_buffer_idx"] = s
                if given[j] is None:
                    d["priority"] = maxp
                if j >= first:
                    old = data[s]
                    if old is not None:
                        gone.append(old)
                        replaced += not retired[s]
                    data[s] = d
                    ids[s] = uid
                    slots.append(s)
            written = items[first:]
            if len(slots) == 1:
                s = slots[0]
                self._use[s] = 0
                retired[s] = False
            else:
                self._use[slots] = 0
                retired[slots] = False
            self._index.set_priorities(slots, prios[first:])
            self._index.set_collect(slots, written)
            self._valid_count += len(slots) - replaced
            self._tail = (tail + k) % n
            self._push_count += k
            self._next_unique_id += k
            self._cur_collector_envstep = envstep
            self._discard(gone)
            if self._thruput_controller is not None:
                self._thruput_controller.add(pushed=k)
            self._periodic_thruput_monitor.record(pushed=k, removed=len(gone), valid=self._valid_count)

    def _remove(self, slots: np.ndarray) -> int:
        """Empty distinct occupied slots; return how many valid items left."""
        if len(slots) == 0:
            return 0
        gone = []
        valid = 0
        for s in slots.tolist():
            gone.append(self._data[s])
            valid += not self._retired[s]
            self._data[s] = None
            self._ids[s] = None
        self._use[slots] = 0
        self._retired[slots] = False
        self._index.neutralise(slots)
        self._valid_count -= valid
        self._discard(gone)
        self._periodic_thruput_monitor.record(removed=len(gone), valid=self._valid_count)
        return valid

    # -- sample -----------------------------------------------------------------------------------
    def sample(self, size: int, cur_learner_iter: int, sample_range: slice | None = None) -> list | None:
        """``size`` items drawn in proportion to ``priority ** alpha``, or ``None`` (logged).

        Before drawing, items whose staleness reached ``max_staleness`` are removed. ``None`` is
        returned when ``count() / size < sample_min_limit_ratio``, when the throughput controller
        refuses, or when ``sample_range`` holds no sampleable item. Draws are stratified (one per
        ``1/size`` of the mass) and may repeat an item; repeats are deep copies. After the draw,
        items used ``max_use`` times leave the buffer and ``beta`` moves towards 1 by
        ``(1 - beta_0) / anneal_step``.

        Args:
            size: number of items; 0 returns ``[]``.
            cur_learner_iter: the learner's iteration, for staleness.
            sample_range: a slice of the physical slots ``range(replay_buffer_size)`` to draw
                from (Python slice rules; step 1). Slot ``k % replay_buffer_size`` holds the
                ``k``-th pushed item, so ``slice(-10, None)`` is the last 10 slots.
        """
        size = int(size)
        if size == 0:
            return []
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        with self._lock:
            stale = self._index.stale_slots(cur_learner_iter - self._max_staleness)  # collect_iter <= it
            self._remove(stale)
            why = None
            if self._valid_count / size < self._sample_min_limit_ratio:
                why = (
                    f"not enough data: valid({self._valid_count}) / sample({size}) < "
                    f"sample_min_limit_ratio({self._sample_min_limit_ratio})"
                )
            elif self._thruput_controller is not None:
                ok, info = self._thruput_controller.can_sample(size)
                if not ok:
                    why = info
            mass = None
            if why is None:
                mass = self._index.mass_range(sample_range)
                if mass is None or not mass[1] > mass[0]:
                    why = f"no sampleable data in sample_range {sample_range}"
            if why is not None:
                self._logger.info("Refuse to sample %d (removed %d stale items): %s", size, len(stale), why)
                return None
            slots = self._index.draw(size, *mass)
            out = self._sample_with_indices(slots, cur_learner_iter)
            return out

    def _sample_with_indices(self, slots: np.ndarray, cur_learner_iter: int) -> list:
        is_list = self._index.is_weights(slots, self._beta)
        np.add.at(self._use, slots, 1)
        use_list = self._use[slots].tolist()
        data = self._data
        deep = self._deepcopy
        default_ci = cur_learner_iter + 1
        out: list = []
        seen: dict[int, dict] = {}
        stal: list = []
        prio: list = []
        for j, s in enumerate(slots.tolist()):
            d = seen.get(s)
            if d is not None and not deep:
                d = copy.deepcopy(d)
            else:
                d = copy.deepcopy(data[s]) if deep else data[s]
                d["staleness"] = cur_learner_iter - collect_iter(d, default_ci)
                d["use"] = use_list[j]
                d["IS"] = is_list[j]
                d["replay_buffer_idx"] = s
                seen[s] = d
            out.append(d)
            stal.append(d["staleness"])
            prio.append(d["priority"])
        if math.isfinite(self._max_use):  # items used max_use times leave
            done = np.unique(slots[self._use[slots] >= self._max_use])
            if not self._enable_track_used_data:
                self._remove(done)
            elif len(done):  # with tracking they keep their slot (and file), flagged
                fresh = done[~self._retired[done]]
                self._retired[fresh] = True
                self._index.neutralise(fresh)
                self._valid_count -= len(fresh)
                self._periodic_thruput_monitor.record(valid=self._valid_count)
        if self._anneal_step != 0:
            self._beta = min(1.0, self._beta + (1.0 - self._beta_init) / self._anneal_step)
        if self._thruput_controller is not None:
            self._thruput_controller.add(sampled=len(out))
        self._periodic_thruput_monitor.record(sampled=len(out))
        self._sample_reporter.record(use_list, prio, stal, self._beta, cur_learner_iter, self._cur_collector_envstep)
        return out

    # -- update -----------------------------------------------------------------------------------
    def update(self, info: Mapping) -> None:
        """Set priorities: ``info`` has lists ``replay_unique_id``, ``replay_buffer_idx``, ``priority``.

        An entry is applied only if its slot still holds the item with that unique id (and the item
        has not been used up); others are skipped. The stored priority is ``priority + 1e-5``;
        ``max_priority`` becomes the largest applied ``priority``. Without ``'priority'`` in
        ``info`` nothing happens.

        Raises:
            CompatError: a priority is negative, NaN or infinite (nothing is applied).
        """
        if "priority" not in info:
            return
        p = np.asarray(info["priority"], dtype=np.float64).reshape(-1)
        ids = list(info["replay_unique_id"])
        idxs = list(info["replay_buffer_idx"])
        k = min(len(p), len(ids), len(idxs))
        p = p[:k]
        if k and not (np.isfinite(p).all() and (p >= 0).all()):
            raise CompatError(f"priorities must be finite and >= 0, got {p[~(np.isfinite(p) & (p >= 0))][:5]}")
        n = self._replay_buffer_size
        with self._lock:
            applied: dict[int, float] = {}
            stored = self._ids
            retired = self._retired
            p_list = p.tolist()
            for j in range(k):
                s = int(idxs[j])
                if 0 <= s < n and stored[s] is not None and stored[s] == ids[j] and not retired[s]:
                    applied[s] = p_list[j]
                else:
                    self._logger.debug("skip priority update of %r at slot %s: no longer in the buffer", ids[j], s)
            if not applied:
                return
            slots = np.fromiter(applied, dtype=np.int64, count=len(applied))
            new_p = np.fromiter(applied.values(), dtype=np.float64, count=len(applied))
            stored_p = (new_p + self._eps).tolist()
            for s, v in zip(slots.tolist(), stored_p):
                self._data[s]["priority"] = v
            self._index.set_priorities(slots, new_p + self._eps)
            self._max_priority = max(self._max_priority, float(new_p.max()))

    # -- the rest of the interface ----------------------------------------------------------------
    def clear(self) -> None:
        """Remove every item (tracked files are deleted); reset tail and ``max_priority`` to 1.0."""
        with self._lock:
            gone = [d for d in self._data if d is not None]
            n = self._replay_buffer_size
            self._data = [None] * n
            self._ids = [None] * n
            self._use[:] = 0
            self._retired[:] = False
            self._index.clear()
            self._valid_count = 0
            self._tail = 0
            self._max_priority = 1.0
            self._discard(gone)
            self._periodic_thruput_monitor.record(removed=len(gone), valid=0)

    # -- state (the steps every buffer shares are RingBufferBase's) ---------------------------------
    def state_dict(self) -> dict:
        """The buffer's state: slot list, per-slot use counts and used-up flags, counters, beta."""
        with self._lock:
            return {
                "data": list(self._data),
                "use_count": self._use.tolist(),
                "retired": self._retired.tolist(),
                "tail": self._tail,
                "max_priority": self._max_priority,
                "anneal_step": self._anneal_step,
                "beta": self._beta,
                "next_unique_id": self._next_unique_id,
                "valid_count": self._valid_count,
                "push_count": self._push_count,
            }

    def _push_loaded(self, items: list) -> None:
        self._extend(items, check_rate=False)

    def _load_slots(self, _state_dict: Mapping, data: list, tail: int) -> None:
        use_arr, retired = slot_state(_state_dict, data)
        with self._lock:
            self._max_priority = float(_state_dict.get("max_priority", self._max_priority))
            live = np.flatnonzero([d is not None for d in data])
            next_id = int(_state_dict.get("next_unique_id", 0))
            for s in live.tolist():
                d = data[s]
                if d.get("replay_unique_id") is None:
                    d["replay_unique_id"] = f"{self._instance_name}_{next_id}"
                    next_id += 1
                if d.get("priority") is None:
                    d["priority"] = self._max_priority
                d["replay_buffer_idx"] = s
            prios = np.asarray(item_priorities([data[s] for s in live.tolist()])[0], dtype=np.float64)
            self._data = data
            self._ids = [None if d is None else str(d["replay_unique_id"]) for d in data]
            self._use = use_arr.copy()
            self._retired = retired & np.array([d is not None for d in data], dtype=bool)
            self._index.clear()
            active = ~self._retired[live]
            act = live[active]
            self._index.set_priorities(act, prios[active])
            self._index.set_collect(act, [data[s] for s in act.tolist()])
            self._valid_count = int(active.sum())
            self._tail = tail
            self._push_count = int(_state_dict.get("push_count", self._valid_count))
            self._next_unique_id = next_id
            self._beta = float(_state_dict.get("beta", self._beta))
            self._anneal_step = int(_state_dict.get("anneal_step", self._anneal_step))
            self._periodic_thruput_monitor.record(valid=self._valid_count)

    def _sampleable(self, slot: int) -> bool:
        return self._data[slot] is not None and not self._retired[slot]
