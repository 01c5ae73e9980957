"""Metrics as time series: a :class:`Recorder` reads a source on a period and derives rates.

Each read becomes one *point*: ``{"seq", "t", "ok", "error", "tables": {table: row}, "nodes",
"lock", "online"}``. A table's row holds what a chart needs, derived from the difference to the
previous read (``None`` where there is no previous read, or the counters went back: a restart):

- ``inserts_per_s``, ``samples_per_s`` (items), ``sample_calls_per_s``;
- ``ratio`` (samples / inserts over the interval), ``ratio_total`` (since the start),
  ``ratio_target`` (the rate limiter's ``samples_per_insert``; ``None`` for ``MinSize``);
- ``insert_blocked``, ``sample_blocked``: seconds callers spent blocked by the rate limiter per
  second (a stalled learner shows ``sample_blocked`` near 1 within one period, since ``stats()``
  counts waits still going on), and ``insert_waiting`` / ``sample_waiting``: calls blocked now;
- ``fill`` (size / capacity), ``size``, ``capacity``, ``version``, ``staleness_mean`` (version lag);
- ``evictions_per_s`` (capacity), ``retired_per_s`` (``max_times_sampled``), ``dropped_stale_per_s``
  (``max_staleness``: refused inserts and removals), ``skipped_updates_per_s`` (priority updates
  of keys already gone): items that left or were refused, by reason; ``deletes_per_s`` counts
  every removal (all reasons, and ``delete`` calls);
- ``priority_histogram``, ``times_sampled_histogram``, ``staleness_histogram`` (as in ``stats()``);
- ``shards``: the same row per shard (sharded tables), ``shard_nodes``: each shard's node.

``nodes`` (a fragment service's node-local stores) is as in its ``stats()``: per node ``free_bytes``,
``payloads``, ``leases``, ``leased_fragments``, ``loader_queue``, ... ``online`` is one row per
rollout buffer (:func:`online_row`): its staleness budget, tickets, groups and refusals by reason.

Cost: one ``stats()`` per period (the table's lock for an ``O(size)`` pass over the live
metadata); nothing on the table's ``extend`` / ``sample`` paths.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import Unavailable
from .sources import Source

log = logging.getLogger("replaystore")

#: counters whose rate is reported as ``<name>_per_s``
RATE_COUNTERS = (
    "inserts",
    "samples",
    "sample_calls",
    "evictions",
    "retired",
    "dropped_stale",
    "deletes",
    "skipped_updates",
)


def _rate(now: dict, prev: dict | None, key: str, dt: float) -> float | None:
    if prev is None or dt <= 0 or key not in now or key not in prev:
        return None
    d = now[key] - prev[key]
    return None if d < 0 else d / dt


def _blocked(st: dict, side: str) -> float:
    return float(st.get(f"{side}_blocked_s", 0.0)) + float(st.get(f"{side}_blocked_now_s", 0.0))


def _staleness_mean(hist: dict[str, int]) -> float | None:
    total = sum(hist.values())
    if not total:
        return None
    return sum(int(k.lstrip(">=")) * c for k, c in hist.items()) / total


def table_row(st: dict[str, Any] | None, prev: dict[str, Any] | None, dt: float) -> dict[str, Any] | None:
    """The chart values of one table's ``stats()`` ``st`` given the previous read ``prev``, ``dt`` s before."""
    if st is None:
        return None
    if prev is not None and any(st.get(k, 0) < prev.get(k, 0) for k in ("inserts", "samples")):
        prev = None  # counters went back: a restart (or clear of a limiter); no rates over it
    row: dict[str, Any] = {f"{k}_per_s": _rate(st, prev, k, dt) for k in RATE_COUNTERS}
    d_ins = None if prev is None else st.get("inserts", 0) - prev.get("inserts", 0)
    d_smp = None if prev is None else st.get("samples", 0) - prev.get("samples", 0)
    row["ratio"] = d_smp / d_ins if d_ins else None
    row["ratio_total"] = st.get("sample_to_insert_ratio")
    row["ratio_target"] = (st.get("config") or {}).get("target_sample_to_insert_ratio")
    for side in ("insert", "sample"):
        if prev is None or dt <= 0:
            row[f"{side}_blocked"] = None
        else:
            row[f"{side}_blocked"] = max(0.0, (_blocked(st, side) - _blocked(prev, side)) / dt)
        row[f"{side}_waiting"] = st.get(f"{side}_waiting", 0)
        row[f"{side}_blocked_now_s"] = st.get(f"{side}_blocked_now_s", 0.0)
    cap = st.get("capacity") or 0
    row.update(
        size=st.get("size"),
        capacity=cap,
        fill=st.get("size", 0) / cap if cap else None,
        version=st.get("version"),
        staleness_mean=_staleness_mean(st.get("staleness_histogram") or {}),
        inserts=st.get("inserts"),
        samples=st.get("samples"),
    )
    for k in ("priority_histogram", "times_sampled_histogram", "staleness_histogram"):
        row[k] = st.get(k) or {}
    return row


#: a rollout buffer's counters of groups that left or were refused, by reason (``groups_dropped_<reason>``)
ONLINE_DROP_REASONS = (
    "stale",
    "expired",
    "evicted",
    "abandoned",
    "incomplete",
    "rejected",
    "cancelled",
    "after_training",
)
#: the staleness budget's refusals and losses of tickets, by reason
BUDGET_REASONS = ("rejected", "expired", "abandoned", "discarded", "cancelled", "acquire_timeouts")


def _rates(now: dict, prev: dict | None, keys: Any, dt: float, prefix: str = "") -> dict[str, float | None]:
    return {k: _rate(now, prev, prefix + k, dt) for k in keys}


def online_row(st: dict[str, Any] | None, prev: dict[str, Any] | None, dt: float) -> dict[str, Any] | None:
    """The chart values of one rollout buffer's ``stats()`` ``st`` given the previous read ``prev``.

    ``groups`` (ready), ``pending_groups``, ``version``, ``groups_admitted_per_s``,
    ``groups_sampled_per_s``; ``dropped_per_s``: ``{reason: groups/s}`` (:data:`ONLINE_DROP_REASONS`);
    ``rejected_per_s``: ``{reason given to reject(): groups/s}``. With a staleness budget: ``tickets``
    (running now), ``budget_limit``, ``budget_accepted``, ``budget_capacity`` (what it can still
    grant), ``budget_paused``, ``producer_wait`` (seconds producers waited per second) and
    ``budget_lost_per_s``: ``{reason: tickets/s}`` (:data:`BUDGET_REASONS`). Rates are ``None``
    without a previous read or across a restart (counters that went back).
    """
    if st is None:
        return None
    if prev is not None and st.get("rollouts_added", 0) < prev.get("rollouts_added", 0):
        prev = None  # counters went back: a restart
    row: dict[str, Any] = {k: st.get(k) for k in ("groups", "pending_groups", "version")}
    row.update({f"{k}_per_s": _rate(st, prev, k, dt) for k in ("groups_admitted", "groups_sampled")})
    row["dropped_per_s"] = _rates(st, prev, ONLINE_DROP_REASONS, dt, "groups_dropped_")
    reasons = st.get("rejected") if isinstance(st.get("rejected"), dict) else {}
    old = None if prev is None else {**dict.fromkeys(reasons, 0), **(prev.get("rejected") or {})}
    row["rejected_per_s"] = _rates(reasons, old, reasons, dt)  # a reason new since prev was at 0
    budget = st.get("budget")
    if isinstance(budget, dict):
        pb = None if prev is None else prev.get("budget")
        row.update(
            tickets=budget.get("running"),
            budget_limit=budget.get("limit"),
            budget_accepted=budget.get("accepted"),
            budget_capacity=budget.get("capacity"),
            budget_paused=budget.get("paused"),
            producer_wait=_rate(budget, pb, "producer_wait_s", dt),
            budget_lost_per_s=_rates(budget, pb, BUDGET_REASONS, dt),
        )
    return row


class Recorder:
    """Reads ``source`` every ``period`` seconds on a daemon thread; keeps the last ``history`` points.

    Args:
        source: a :mod:`replaystore.metrics.sources` source (or anything with ``read()``).
        period: seconds between reads.
        history: points kept (the page's time window is ``period * history``).
        max_duty: the largest fraction of one core reads may use: a read that cost ``r`` CPU
            seconds delays the next one to ``max(period, r / max_duty)`` (a 1M-item table's
            ``stats()`` costs ~30 ms: reads every 1.5 s at the default 0.02). A remote source
            (a Ray service) costs this process little; its ``stats()`` runs in the service.

    ``points(since)`` and ``latest()`` are thread-safe. A read that raises
    :class:`~replaystore.errors.Unavailable` (or anything else) makes a point with ``ok=False`` and
    the message; reading goes on, so a restarted service reappears by itself. Listeners added with
    :meth:`subscribe` get ``(point, snapshot)`` after each successful read (exporters); their errors
    are logged, never raised.
    """

    def __init__(self, source: Source, period: float = 1.0, history: int = 600, max_duty: float = 0.02) -> None:
        if period <= 0:
            raise ValueError(f"period must be > 0, got {period}")
        if not 0 < max_duty <= 1:
            raise ValueError(f"max_duty must be in (0, 1], got {max_duty}")
        self.source = source
        self.period = float(period)
        self.max_duty = float(max_duty)
        self.read_s = 0.0  # what the last read cost (CPU seconds of the reading thread)
        self._points: deque[dict[str, Any]] = deque(maxlen=int(history))
        self._last: tuple[float, dict[str, Any]] | None = None
        self._snapshot: dict[str, Any] | None = None
        self._seq = 0
        self._lock = threading.Lock()
        self._listeners: list[Callable[[dict[str, Any], dict[str, Any]], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def subscribe(self, fn: Callable[[dict[str, Any], dict[str, Any]], None]) -> None:
        """Call ``fn(point, snapshot)`` after every successful read."""
        self._listeners.append(fn)

    def start(self) -> Recorder:
        """Start reading on a daemon thread (one read happens at once); returns self."""
        if self._thread is None:
            self.poll()
            self._thread = threading.Thread(target=self._run, name="replaystore-metrics", daemon=True)
            self._thread.start()
        return self

    @property
    def effective_period(self) -> float:
        """Seconds between reads now: ``period``, stretched so reads take at most ``max_duty`` of the time."""
        return max(self.period, self.read_s / self.max_duty)

    def _run(self) -> None:
        while not self._stop.wait(self.effective_period):
            self.poll()

    def poll(self) -> dict[str, Any]:
        """Read the source once now and append the point; returns it."""
        mono, cpu = time.monotonic(), time.thread_time()
        try:
            snap = self.source.read()
        except Unavailable as e:
            return self._append({"ok": False, "error": str(e)}, None)
        except Exception as e:  # noqa: BLE001 - a dashboard outlives its source's errors
            return self._append({"ok": False, "error": f"{type(e).__name__}: {e}"}, None)
        finally:
            self.read_s = time.thread_time() - cpu
        prev_mono, prev = self._last if self._last is not None else (mono, None)
        dt = mono - prev_mono
        point: dict[str, Any] = {"ok": True, "error": None, "tables": {}}
        for name, t in snap["tables"].items():
            p = None if prev is None else prev["tables"].get(name)
            row = table_row(t["stats"], None if p is None else p["stats"], dt)
            if "shards" in t:
                old = [] if p is None else p.get("shards", [])
                row["shards"] = [table_row(s, old[i] if i < len(old) else None, dt) for i, s in enumerate(t["shards"])]
                row["shard_nodes"] = t.get("nodes")
            point["tables"][name] = row
        point["nodes"] = (snap.get("fragments") or {}).get("nodes")
        point["lock"] = self._lock_row(snap.get("lock"), None if prev is None else prev.get("lock"), dt)
        online, prev_online = snap.get("online") or {}, (None if prev is None else prev.get("online")) or {}
        point["online"] = {b: online_row(st, prev_online.get(b), dt) for b, st in online.items()} or None
        point["errors"] = snap.get("errors") or []
        self._last = (mono, snap)
        return self._append(point, snap)

    @staticmethod
    def _lock_row(lock: dict | None, prev: dict | None, dt: float) -> dict | None:
        if lock is None:
            return None
        out = dict(lock)
        out["acquisitions_per_s"] = _rate(lock, prev, "acquisitions", dt)
        return out

    def _append(self, point: dict[str, Any], snap: dict[str, Any] | None) -> dict[str, Any]:
        with self._lock:
            self._seq += 1
            point["seq"] = self._seq
            point["t"] = time.time()
            self._points.append(point)
            if snap is not None:
                self._snapshot = snap
        if snap is not None:
            for fn in self._listeners:
                try:
                    fn(point, snap)
                except Exception:  # noqa: BLE001 - exporters must not stop the recorder
                    log.exception("metrics listener %r failed", fn)
        return point

    def points(self, since: int = 0) -> list[dict[str, Any]]:
        """The kept points with ``seq > since``, oldest first."""
        with self._lock:
            return [p for p in self._points if p["seq"] > since]

    @property
    def seq(self) -> int:
        """The sequence number of the newest point (0 before the first)."""
        return self._seq

    def latest(self) -> dict[str, Any] | None:
        """The last successful snapshot of the source (raw stats), or ``None``."""
        with self._lock:
            return self._snapshot

    def close(self) -> None:
        """Stop reading and close the source. Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self.source.close()

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
