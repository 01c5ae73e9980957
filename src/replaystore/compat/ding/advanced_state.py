"""The state of DI-engine's ``'advanced'`` buffer: ``state_dict``, what ``load_state_dict`` restores.

The steps every buffer shares (``load_state_dict``'s, the data files) are ``RingBufferBase``'s.
A mixin of :class:`~replaystore.compat.ding.advanced_buffer.AdvancedReplayBuffer` (its methods act
on the buffer's own state, under its lock). A state dict holds the slot list, the per-slot use
counts and used-up flags, the counters and ``beta``; DI-engine's own state dicts (with ``head``,
``sum_tree``...) load too, the trees rebuilt from the items' priorities. Data files hold the
sampleable items, oldest first (:mod:`~replaystore.compat.ding._persist`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ._persist import slot_state
from .priority_index import item_priorities

if TYPE_CHECKING:
    import threading

    from .priority_index import PriorityIndex


class AdvancedState:
    """State dicts and data files (mixed into ``AdvancedReplayBuffer``; thread-safe through its lock)."""

    if TYPE_CHECKING:
        _lock: threading.RLock
        _replay_buffer_size: int
        _instance_name: str
        _data: list
        _ids: list
        _use: np.ndarray
        _retired: np.ndarray
        _index: PriorityIndex
        _tail: int
        _max_priority: float
        _anneal_step: int
        _beta: float
        _next_unique_id: int
        _valid_count: int
        _push_count: int
        _periodic_thruput_monitor: Any

        def _extend(self, items: list, envstep: int = -1, check_rate: bool = True) -> None: ...

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


__all__ = ["AdvancedState"]
