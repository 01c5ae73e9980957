"""OnlineMetrics: what staleness handling does to the data, made visible.

Per report window (and in total since start) it counts:

- ``trained_staleness``: staleness of every rollout that was sampled for training (a histogram in
  versions, by the buffer's staleness end);
- ``generated_by_length``, ``trained_by_length``, ``dropped_by_length``: rollouts per length bucket
  that arrived, that were sampled, and that were dropped (stale, expired, evicted unsampled,
  abandoned) - the length bias of dropping shows as a difference between these;
- ``dropped``: groups dropped, by reason;
- ``rejected``: groups rejected after scoring (``RolloutBuffer.reject``), by the caller's reason;
- ``producer_wait_s``: how long producers waited for admission (mean and max per acquire).

Not thread-safe by itself: the owning buffer calls it under its lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidRequest

DROP_REASONS = ("stale", "expired", "evicted", "abandoned", "incomplete", "rejected", "cancelled")
_STALENESS_BINS = 16


def bucket_names(edges: Sequence[int]) -> list[str]:
    """Names of the buckets cut at ``edges``: ``"0-15"``, ``"16-63"``, ..., ``">=1024"``."""
    names, lo = [], 0
    for e in edges:
        names.append(f"{lo}-{e - 1}")
        lo = e
    names.append(f">={lo}")
    return names


class OnlineMetrics:
    """Histograms and counters of an online buffer (see the module doc).

    Args:
        length_buckets: increasing positive bucket edges for lengths (default 16, 64, 256, 1024).
    """

    def __init__(self, length_buckets: Sequence[int] = (16, 64, 256, 1024)) -> None:
        edges = [int(e) for e in length_buckets]
        if not edges or any(e <= 0 for e in edges) or any(a >= b for a, b in zip(edges, edges[1:])):
            raise InvalidRequest(f"length_buckets must be increasing positive integers, got {list(length_buckets)!r}")
        self.edges = np.asarray(edges, dtype=np.int64)
        self.names = bucket_names(edges)
        self.total: dict[str, Counter] = {
            k: Counter()
            for k in (
                "generated_by_length",
                "trained_by_length",
                "dropped_by_length",
                "trained_staleness",
                "dropped",
                "rejected",
            )
        }
        self.window: dict[str, Counter] = {k: Counter() for k in self.total}
        self._waits: list[float] = []

    def _count(self, kind: str, names: Iterable[str]) -> None:
        c = Counter(names)
        self.total[kind].update(c)
        self.window[kind].update(c)

    def _buckets(self, lengths: Iterable[int]) -> list[str]:
        idx = np.searchsorted(self.edges, np.asarray(list(lengths), dtype=np.int64), side="right")
        return [self.names[i] for i in idx.tolist()]

    def generated(self, lengths: Iterable[int]) -> None:
        """Rollouts that arrived."""
        self._count("generated_by_length", self._buckets(lengths))

    def trained(self, lengths: Iterable[int], staleness: Iterable[int]) -> None:
        """Rollouts sampled for training, with their staleness."""
        self._count("trained_by_length", self._buckets(lengths))
        s = np.clip(np.asarray(list(staleness), dtype=np.int64), 0, _STALENESS_BINS - 1)
        self._count("trained_staleness", [str(i) if i < _STALENESS_BINS - 1 else f">={i}" for i in s.tolist()])

    def dropped(self, reason: str, lengths: Iterable[int]) -> None:
        """One group dropped for ``reason`` (see ``DROP_REASONS``), with its rollouts' lengths."""
        self._count("dropped", [reason])
        self._count("dropped_by_length", self._buckets(lengths))

    def rejected(self, reason: str, lengths: Iterable[int]) -> None:
        """One group rejected after scoring for ``reason`` (also counted as dropped ``"rejected"``)."""
        self._count("rejected", [reason])
        self.dropped("rejected", lengths)

    def waits(self, seconds: Iterable[float]) -> None:
        """Producer waits for admission, one per acquire."""
        self._waits += list(seconds)

    def snapshot(self, which: str = "total") -> dict[str, Any]:
        """The histograms as nested dicts of ints (``which``: ``"total"`` or ``"window"``)."""
        src = self.total if which == "total" else self.window
        return {k: dict(sorted(v.items())) for k, v in src.items()}

    def report(self) -> dict[str, Any]:
        """The window's histograms and producer waits; starts a new window."""
        out = self.snapshot("window")
        w = self._waits
        out["producer_wait_mean_s"] = float(np.mean(w)) if w else 0.0
        out["producer_wait_max_s"] = float(np.max(w)) if w else 0.0
        out["acquires"] = len(w)
        self.window = {k: Counter() for k in self.total}
        self._waits = []
        return out


__all__ = ["DROP_REASONS", "OnlineMetrics", "bucket_names"]
