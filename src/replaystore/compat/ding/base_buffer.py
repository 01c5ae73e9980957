"""``IBuffer``, the interface of DI-engine's legacy replay buffers, and their shared machinery."""

from __future__ import annotations

import copy
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ._config import CompatError, EasyDict, deep_merge_dicts
from ._persist import dump_items, load_items
from .utils import PeriodicThruputMonitor, UsedDataRemover


class IBuffer(ABC):
    """The buffer interface: push, update, sample, clear, count, state and file round trips.

    Subclasses set the class attribute ``config`` (their defaults); :meth:`default_config` returns
    a deep copy of it as an :class:`EasyDict` with ``cfg_type = '<ClassName>Dict'``.
    """

    config: ClassVar[dict] = {}

    @classmethod
    def default_config(cls) -> EasyDict:
        """A fresh copy of this class's default config, with ``cfg_type`` set."""
        cfg = EasyDict(copy.deepcopy(cls.config))
        cfg.cfg_type = cls.__name__ + "Dict"
        return cfg

    @abstractmethod
    def push(self, data: Any, cur_collector_envstep: int = -1) -> None:
        """Insert one item, or every item of a list."""

    @abstractmethod
    def update(self, info: Any) -> None:
        """Update item information (priorities for the advanced buffer)."""

    @abstractmethod
    def sample(self, size: int, cur_learner_iter: int) -> list | None:
        """``size`` items, or ``None`` when the buffer cannot serve them now."""

    @abstractmethod
    def clear(self) -> None:
        """Remove every item."""

    @abstractmethod
    def count(self) -> int:
        """Number of valid (sampleable) items."""

    @abstractmethod
    def save_data(self, file_name: str) -> None:
        """Write the items to a file."""

    @abstractmethod
    def load_data(self, file_name: str) -> None:
        """Push the items of a file written by :meth:`save_data`."""

    @abstractmethod
    def state_dict(self) -> dict:
        """Everything needed to reproduce the buffer."""

    @abstractmethod
    def load_state_dict(self, _state_dict: dict) -> None:
        """Restore a :meth:`state_dict`, or push the items of ``{'data': [...]}``."""

    def start(self) -> None:
        """Start background work (the used-data remover); a no-op by default."""

    def close(self) -> None:
        """Stop background work; a no-op by default."""


def positive_int(value: Any, what: str) -> int:
    """``value`` as an int >= 1, or :class:`CompatError`."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise CompatError(f"{what} must be a positive integer, got {value!r}") from None
    if n != value or n < 1:
        raise CompatError(f"{what} must be a positive integer, got {value!r}")
    return n


def choose(n: int, size: int, replace: bool) -> np.ndarray:
    """``size`` positions in ``range(n)``, uniformly, drawn from NumPy's global generator.

    Uses the global generator (like DI-engine) so that ``np.random.seed`` reproduces runs. Without
    replacement and for ``size`` much smaller than ``n`` it draws with rejection of repeats, which
    gives the same distribution as ``np.random.choice(n, size, replace=False)`` in O(size) instead
    of O(n).
    """
    if replace:
        return np.random.randint(0, n, size=size)
    if size > n:
        raise CompatError(f"cannot draw {size} distinct items out of {n}")
    if 4 * size > n:
        return np.random.permutation(n)[:size]
    chosen: dict[int, None] = {}
    while len(chosen) < size:
        for x in np.random.randint(0, n, size=2 * (size - len(chosen))).tolist():
            chosen[x] = None  # (a repeat keeps its first position)
            if len(chosen) == size:
                break
    return np.fromiter(chosen, dtype=np.int64, count=size)


class RingBufferBase(IBuffer):
    """Machinery shared by the buffers: config merge, lock, logging, monitor thread, remover.

    Subclasses keep a ring of ``replay_buffer_size`` slots: item ``k`` (counting every pushed item)
    goes to slot ``k % replay_buffer_size``, overwriting what was there.
    """

    def __init__(
        self,
        cfg: Mapping | None = None,
        tb_logger: Any = None,
        exp_name: str | None = "default_experiment",
        instance_name: str | None = "buffer",
    ) -> None:
        self._end_flag = True  # until fully constructed: close() has nothing to stop
        if cfg is not None and not isinstance(cfg, Mapping):
            raise TypeError(f"cfg must be a dict or EasyDict, got {type(cfg).__name__}")
        self._cfg = deep_merge_dicts(self.default_config(), cfg)  # (a partial config, or None)
        self._exp_name = exp_name
        self._instance_name = "buffer" if instance_name is None else str(instance_name)
        self._replay_buffer_size = positive_int(self._cfg.replay_buffer_size, "replay_buffer_size")
        self._deepcopy = bool(self._cfg.get("deepcopy", False))
        self._enable_track_used_data = bool(self._cfg.get("enable_track_used_data", False))
        self._lock = threading.RLock()
        self._logger = logging.getLogger(f"replaystore.compat.ding.{self._instance_name}")
        self._tb_logger = tb_logger
        self._used_data_remover = UsedDataRemover() if self._enable_track_used_data else None
        self._periodic_thruput_monitor = PeriodicThruputMonitor(
            self._instance_name, EasyDict(seconds=self._thruput_seconds()), self._logger, tb_logger
        )
        self._end_flag = False
        try:
            self._configure()
        except Exception:
            self._shutdown()  # the monitor's thread started above
            raise

    @abstractmethod
    def _configure(self) -> None:
        """The subclass's own state and config checks (a failure stops what the base started)."""

    def _thruput_seconds(self) -> float:
        return float(self._cfg.get("periodic_thruput_seconds", 60))

    # -- shared helpers ---------------------------------------------------------------------------
    def _check_tracked(self, items: list) -> None:
        if self._enable_track_used_data:
            for i, d in enumerate(items):
                if not isinstance(d, Mapping) or "data_id" not in d:
                    raise TypeError(
                        f"with enable_track_used_data every item must be a dict with a 'data_id' "
                        f"(the path of its file); item {i} is {type(d).__name__}"
                    )

    def _discard(self, items: list) -> None:
        """Hand items that left the buffer to the used-data remover (when tracking)."""
        if self._used_data_remover is not None:
            for d in items:
                self._used_data_remover.add_used_data(d)

    def _sampleable(self, slot: int) -> bool:
        """Whether ``slot`` holds a sampleable item."""
        return self._data[slot] is not None

    @abstractmethod
    def _push_loaded(self, items: list) -> None:
        """Push items read from a file or a ``{'data': [...]}`` state dict."""

    @abstractmethod
    def _load_slots(self, state: Mapping, data: list, tail: int) -> None:
        """Restore a full :meth:`state_dict` whose slot list is ``data`` (one per slot) and tail ``tail``."""

    # -- persistence ------------------------------------------------------------------------------
    def load_state_dict(self, _state_dict: Mapping, deepcopy: bool = False) -> None:
        """Restore a :meth:`state_dict`; ``{'data': [...]}`` alone pushes those items instead.

        The second form loads demonstrations (the advanced buffer gives them its unique ids and,
        without ``collect_iter``, a staleness of -1). The advanced buffer also accepts a full state
        dict of DI-engine's (with ``head``, ``sum_tree``...): its trees are rebuilt from the
        priorities.

        Args:
            _state_dict: the state.
            deepcopy: copy the state's items instead of sharing them.

        Raises:
            CompatError: ``'data'`` is missing, or its length differs from ``replay_buffer_size``,
                or the tail is out of range.
        """
        if "data" not in _state_dict:
            raise CompatError("state dict has no 'data'")
        data = list(_state_dict["data"])
        if deepcopy:
            data = copy.deepcopy(data)
        if set(_state_dict) == {"data"}:
            self._push_loaded([d for d in data if d is not None])
            return
        n = self._replay_buffer_size
        if len(data) != n:
            raise CompatError(f"state dict holds {len(data)} slots, this buffer has {n}")
        tail = int(_state_dict.get("tail", 0))
        if not 0 <= tail < n:
            raise CompatError(f"tail {tail} out of range [0, {n})")
        self._load_slots(_state_dict, data, tail)

    def save_data(self, file_name: str) -> None:
        """Write the sampleable items, oldest first, to ``file_name`` (pickle; atomic; parents created)."""
        with self._lock:
            n, t = self._replay_buffer_size, self._tail
            items = [self._data[s] for s in (*range(t, n), *range(t)) if self._sampleable(s)]
        dump_items(items, file_name)

    def load_data(self, file_name: str) -> None:
        """Push the items of a file written by :meth:`save_data` (or DI-engine's hickle dump).

        The advanced buffer's items keep their priorities and get new unique ids; its throughput
        controller is bypassed.
        """
        self._push_loaded(load_items(file_name))

    def count(self) -> int:
        """Number of valid (sampleable) items."""
        return self._valid_count

    @property
    def replay_buffer_size(self) -> int:
        """Capacity in items."""
        return self._replay_buffer_size

    @property
    def push_count(self) -> int:
        """Items pushed (since the last ``clear`` for the naive buffers)."""
        return self._push_count

    def start(self) -> None:
        """Start the used-data remover's thread when ``enable_track_used_data`` is set."""
        if self._used_data_remover is not None:
            self._used_data_remover.start()

    def close(self) -> None:
        """Clear the buffer (files of tracked data are deleted), stop every thread, flush TensorBoard.

        Idempotent. A TensorBoard writer passed in is flushed, not closed: the caller owns it.
        """
        if getattr(self, "_end_flag", True):
            return
        self._end_flag = True
        try:
            self.clear()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        """Stop the threads and flush TensorBoard, without touching the data."""
        self._end_flag = True
        self._periodic_thruput_monitor.close()
        if self._used_data_remover is not None:
            self._used_data_remover.close()
        if self._tb_logger is not None and hasattr(self._tb_logger, "flush"):
            self._tb_logger.flush()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._end_flag

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - never raise from a finalizer
            pass
