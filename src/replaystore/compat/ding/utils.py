"""Helpers of DI-engine's replay buffers: ids, used-data removal, monitors and rate control."""

from __future__ import annotations

import logging
import os
import queue
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ._config import CompatError

_log = logging.getLogger("replaystore.compat.ding")


def generate_id(name: str, data_id: int) -> str:
    """The unique id of a pushed item: ``'{name}_{data_id}'``."""
    return f"{name}_{data_id}"


# -- used data removal ------------------------------------------------------------------------------
def remove_file(path: str | os.PathLike) -> bool:
    """Delete the file or directory tree at ``path``, without a shell; return whether it existed.

    ``s3://...`` paths are removed with ``aws s3 rm --recursive`` run as an argument list (no shell,
    so no word splitting, globbing or command injection). Local paths are deleted literally: a
    directory (not a symlink to one) with :func:`shutil.rmtree`, anything else with
    :func:`os.remove`. A missing path is not an error. An empty path, ``.``, ``..``, a path
    containing NUL or one that resolves to the filesystem root is refused with :class:`CompatError`.
    """
    p = os.fspath(path)
    if not isinstance(p, str):
        p = os.fsdecode(p)
    if not p or "\0" in p or os.path.basename(os.path.normpath(p)) in (".", ".."):
        raise CompatError(f"refusing to remove {p!r}")
    if p.lower().startswith("s3"):
        aws = shutil.which("aws")
        if aws is None:
            _log.warning("cannot remove %r: the aws command is not installed", p)
            return False
        subprocess.run(
            [aws, "s3", "rm", "--recursive", p],
            check=False,
            shell=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return True
    if os.path.realpath(p) == os.path.realpath(os.sep) or os.path.normpath(p) in (os.sep, "//"):
        raise CompatError(f"refusing to remove the filesystem root ({p!r})")
    if not os.path.lexists(p):
        return False
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    else:
        os.remove(p)
    return True


_STOP = object()


class UsedDataRemover:
    """Deletes the files of data that left a buffer, on a background thread.

    Items are dicts whose ``'data_id'`` is a path (DI-engine's parallel mode keeps only metadata in
    the buffer and the payload in that file). :meth:`add_used_data` queues one; the thread started
    by :meth:`start` deletes it with :func:`remove_file`; :meth:`close` stops and joins the thread,
    then deletes whatever is still queued. ``close`` is idempotent; after it, items are deleted
    synchronously.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the deleting thread (once)."""
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="ding-used-data-remover", daemon=True)
            self._thread.start()

    def add_used_data(self, data: Any) -> None:
        """Queue the file of ``data`` (a dict with a ``'data_id'`` path) for deletion.

        Raises:
            CompatError: ``data`` is not a dict with ``'data_id'``.
        """
        if not isinstance(data, Mapping) or "data_id" not in data:
            raise CompatError(f"used data must be a dict with a 'data_id', got {type(data).__name__}")
        if self._closed:
            self._remove(data["data_id"])
        else:
            self._queue.put(data["data_id"])

    def _remove(self, path: Any) -> None:
        try:
            remove_file(path)
        except Exception as exc:  # noqa: BLE001 - a bad path must not kill the thread
            _log.warning("could not remove used data %r: %s", path, exc)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            self._remove(item)

    def close(self) -> None:
        """Stop and join the thread, then delete what is still queued. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            thread.join()
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                self._remove(item)

    @property
    def pending(self) -> int:
        """How many paths are queued and not yet deleted."""
        return self._queue.qsize()


# -- monitors -------------------------------------------------------------------------------------
#: how :meth:`SampledDataAttrMonitor.report` combines a window, by the name's suffix
_WINDOWED: dict[str, Callable[[deque], float]] = {"avg": lambda w: sum(w) / len(w), "max": max, "min": min}


class SampledDataAttrMonitor:
    """Moving statistics of sampled items over the last ``expire`` sample calls.

    Each call records the batch's ``use_avg``, ``use_max``, ``priority_avg``, ``priority_max``,
    ``priority_min``, ``staleness_avg`` and ``staleness_max``; :meth:`report` averages the ``*_avg``
    values and takes the max (min) of the ``*_max`` (``*_min``) values over the window, as
    DI-engine's ``LoggedModel`` does.

    Args:
        time_: accepted for DI-engine's signature ``(TickTime(), expire)`` and ignored.
        expire: window length, in sample calls.
    """

    NAMES = ("use_avg", "use_max", "priority_avg", "priority_max", "priority_min", "staleness_avg", "staleness_max")

    def __init__(self, time_: Any = None, expire: int | float = 5) -> None:
        n = max(1, int(expire))
        self.expire = n
        self._windows: dict[str, deque] = {k: deque(maxlen=n) for k in self.NAMES}

    def record(self, **values: float) -> None:
        """Append one sample call's statistics (keyword per name in :attr:`NAMES`)."""
        for k, v in values.items():
            self._windows[k].append(v)

    def report(self) -> dict[str, float]:
        """The windowed statistics, keyed by the names in :attr:`NAMES` (0 while empty)."""
        return {k: _WINDOWED[k.rsplit("_", 1)[1]](w) if w else 0 for k, w in self._windows.items()}


class SampleReporter:
    """What a prioritized buffer reports about its samples (DI-engine's sampled-data monitor).

    Every sample call is recorded in a :class:`SampledDataAttrMonitor`; every ``print_freq``-th
    call (the first included) logs the windowed statistics and ``beta``, and writes them to
    ``tb_logger`` (tags ``{name}_iter/...`` by learner iteration and ``{name}_step/...`` by
    collector env step, each when known, i.e. not -1). Not thread-safe (the buffer holds its lock).
    """

    def __init__(
        self, average_range: int | float, print_freq: int, logger: logging.Logger, tb_logger: Any, name: str
    ) -> None:
        self.monitor = SampledDataAttrMonitor(None, expire=average_range)
        self.print_freq = max(1, int(print_freq))
        self.count = 0
        self.logger, self.tb_logger, self.name = logger, tb_logger, name

    def record(self, use: list, prio: list, stal: list, beta: float, learner_iter: int, envstep: int) -> None:
        """Record one sample call: per item its use count, priority and staleness (non-empty lists)."""
        pr = np.asarray(prio, dtype=np.float64)
        st = np.asarray(stal, dtype=np.float64)
        self.monitor.record(
            use_avg=sum(use) / len(use),
            use_max=max(use),
            priority_avg=float(pr.mean()),
            priority_max=float(pr.max()),
            priority_min=float(pr.min()),
            staleness_avg=float(st.mean()),
            staleness_max=float(st.max()),
        )
        if self.count % self.print_freq == 0:
            stats = self.monitor.report()
            stats["beta"] = beta
            self.logger.info(
                "=== Sample data %d Times === %s", self.count, ", ".join(f"{k}={v:.4g}" for k, v in stats.items())
            )
            tb = self.tb_logger
            if tb is not None:
                for k, v in stats.items():
                    if learner_iter != -1:
                        tb.add_scalar(f"{self.name}_iter/{k}", v, learner_iter)
                    if envstep != -1:
                        tb.add_scalar(f"{self.name}_step/{k}", v, envstep)
        self.count += 1


class PeriodicThruputMonitor:
    """Every ``cfg.seconds`` seconds, log how many items were pushed, sampled, removed and held.

    The counts go to ``logger`` (INFO) and, when a TensorBoard ``SummaryWriter`` is given, to
    ``'{name}_sec/pushed_in'``, ``'{name}_sec/sampled_out'``, ``'{name}_sec/removed'`` and
    ``'{name}_sec/current_have'`` against the report number; the first three are then reset. The
    thread starts in the constructor and :meth:`close` stops and joins it (idempotent).
    """

    def __init__(self, name: str, cfg: Any, logger: logging.Logger | None = None, tb_logger: Any = None) -> None:
        seconds = float(cfg["seconds"] if isinstance(cfg, Mapping) else cfg.seconds)
        if not seconds > 0:
            raise CompatError(f"periodic thruput seconds must be > 0, got {seconds}")
        self.name = name
        self.seconds = seconds
        self._logger = logger if logger is not None else _log
        self._tb_logger = tb_logger
        self._lock = threading.Lock()
        self.push_data_count = 0
        self.sample_data_count = 0
        self.remove_data_count = 0
        self.valid_count = 0
        self.print_times = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ding-thruput-{name}", daemon=True)
        self._thread.start()

    def record(self, pushed: int = 0, sampled: int = 0, removed: int = 0, valid: int | None = None) -> None:
        """Add to the counters (thread-safe)."""
        with self._lock:
            self.push_data_count += pushed
            self.sample_data_count += sampled
            self.remove_data_count += removed
            if valid is not None:
                self.valid_count = valid

    def emit(self, seconds_passed: float | None = None) -> dict[str, int]:
        """Write one report now, reset the counters and return what was written."""
        with self._lock:
            counts = {
                "pushed_in": self.push_data_count,
                "sampled_out": self.sample_data_count,
                "removed": self.remove_data_count,
                "current_have": self.valid_count,
            }
            self.push_data_count = self.sample_data_count = self.remove_data_count = 0
            step = self.print_times
            self.print_times += 1
        passed = self.seconds if seconds_passed is None else seconds_passed
        self._logger.info(
            "In the past %.1f seconds, buffer %s: %s",
            passed,
            self.name,
            ", ".join(f"{k}={v}" for k, v in counts.items()),
        )
        if self._tb_logger is not None:
            for k, v in counts.items():
                self._tb_logger.add_scalar(f"{self.name}_sec/{k}", v, step)
        return counts

    def _run(self) -> None:
        start = time.monotonic()
        poll = min(1.0, self.seconds * 0.2)
        while not self._stop.wait(poll):
            passed = time.monotonic() - start
            if passed >= self.seconds:
                try:
                    self.emit(passed)
                except Exception as exc:  # noqa: BLE001 - a broken writer must not kill the thread
                    self._logger.warning("thruput monitor of %s failed to write: %s", self.name, exc)
                start = time.monotonic()

    def close(self) -> None:
        """Stop and join the reporting thread. Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def alive(self) -> bool:
        """Whether the reporting thread is running."""
        return self._thread.is_alive()


def _decayed(attr: str, doc: str) -> property:
    """A :class:`ThruputController` counter as a property: read and set after decaying it to now."""

    def get(self: ThruputController) -> float:
        with self._lock:
            self._advance()
            return getattr(self, attr)

    def set_(self: ThruputController, value: float) -> None:
        with self._lock:
            self._advance()
            setattr(self, attr, float(value))

    return property(get, set_, doc=doc)


class ThruputController:
    """Limits the ratio of pushed to sampled items over a decaying time window.

    Both counters decay continuously by ``0.01 ** (t / window_seconds)`` (so after
    ``window_seconds`` an old count weighs 1%); DI-engine decays them once a second on a thread,
    this computes the same decay from timestamps and starts no thread.

    - :meth:`can_push` refuses when ``(pushed + n) / sampled > push_sample_rate_limit.max`` (never
      while ``sampled < 1e-5``).
    - :meth:`can_sample` refuses when ``pushed / (sampled + n) < push_sample_rate_limit.min``.

    Args:
        cfg: ``{'push_sample_rate_limit': {'max': .., 'min': ..}, 'window_seconds': ..}``.
        clock: a monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, cfg: Any, clock: Callable[[], float] = time.monotonic) -> None:
        limit = cfg["push_sample_rate_limit"]
        self.max_rate = float(limit["max"])
        self.min_rate = float(limit["min"])
        if not self.min_rate >= 0:
            raise CompatError(f"push_sample_rate_limit.min must be >= 0, got {self.min_rate}")
        if not self.max_rate >= self.min_rate:
            raise CompatError(f"push_sample_rate_limit.max ({self.max_rate}) must be >= min ({self.min_rate})")
        window = float(cfg["window_seconds"])
        if not window > 0:
            raise CompatError(f"window_seconds must be > 0, got {window}")
        self.window_seconds = window
        self._decay = 0.01 ** (1.0 / window)
        self._clock = clock
        self._t = clock()
        self._push = 0.0
        self._sample = 0.0
        self._lock = threading.Lock()

    def _advance(self) -> None:
        now = self._clock()
        dt = now - self._t
        if dt > 0:
            f = self._decay**dt
            self._push *= f
            self._sample *= f
            self._t = now

    history_push_count = _decayed("_push", "Decayed count of pushed items.")
    history_sample_count = _decayed("_sample", "Decayed count of sampled items.")

    def add(self, pushed: int = 0, sampled: int = 0) -> None:
        """Count pushed and sampled items."""
        with self._lock:
            self._advance()
            self._push += pushed
            self._sample += sampled

    def can_push(self, push_size: int) -> tuple[bool, str]:
        """Whether ``push_size`` more items keep push/sample within the maximum, and why."""
        with self._lock:
            self._advance()
            push, sample = self._push, self._sample
        if abs(sample) < 1e-5:
            return True, "can push: nothing sampled in the window"
        rate = (push + push_size) / sample
        if rate > self.max_rate:
            return False, f"push({push:.1f}+{push_size}) / sample({sample:.1f}) > limit max({self.max_rate})"
        return True, "can push"

    def can_sample(self, sample_size: int) -> tuple[bool, str]:
        """Whether sampling ``sample_size`` items keeps push/sample above the minimum, and why."""
        with self._lock:
            self._advance()
            push, sample = self._push, self._sample
        denom = sample + sample_size
        rate = push / denom if denom > 0 else float("inf")
        if rate < self.min_rate:
            return False, f"push({push:.1f}) / sample({sample:.1f}+{sample_size}) < limit min({self.min_rate})"
        return True, "can sample"

    def close(self) -> None:
        """Nothing to stop (no thread); kept for DI-engine's interface."""
