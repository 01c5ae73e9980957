"""The Table's ``stats()``: counters, gauges and a staleness histogram in one plain dict."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..episodes import whole as _whole

_STALENESS_BINS = 16


class StatsMethods:
    """``stats()`` (a mixin of :class:`~replaystore.table.Table`)."""

    def stats(self) -> dict[str, Any]:
        """A plain dict of counters and gauges (every key: docs/getting_started.md, the API table). Thread-safe."""
        with self._cond:
            self._flush_pending()
            st = self._state
            live = np.flatnonzero(self._index.key_of_slot >= 0)
            out: dict[str, Any] = {"name": self.name, "size": st.size, "capacity": self.capacity}
            out.update(st.counters())
            out.update(st.blocked())
            out["version"] = st.version
            out["max_priority_seen"] = st.max_priority
            if self._episodes is not None:  # what a sharded table needs to act as one table
                out["episodes_complete"] = len(_whole.complete_episodes(self._episodes)[0])
                out["next_stream"] = self._episodes.fresh_stream()
            inserts = self.rate_limiter.inserts
            out["sample_to_insert_ratio"] = self.rate_limiter.samples / inserts if inserts else 0.0
            if len(live):
                ts = self._times_sampled[live]
                pr = self._priority[live]
                age = st.version - self._version[live]
                out.update(
                    times_sampled_mean=float(ts.mean()),
                    times_sampled_max=int(ts.max()),
                    priority_min=float(pr.min()),
                    priority_max=float(pr.max()),
                    priority_mean=float(pr.mean()),
                )
                clipped = np.clip(age, 0, _STALENESS_BINS - 1)
                hist = np.bincount(clipped, minlength=_STALENESS_BINS)
                out["staleness_histogram"] = {
                    (str(i) if i < _STALENESS_BINS - 1 else f">={i}"): int(c) for i, c in enumerate(hist) if c
                }
            else:
                out.update(
                    times_sampled_mean=0.0,
                    times_sampled_max=0,
                    priority_min=0.0,
                    priority_max=0.0,
                    priority_mean=0.0,
                    staleness_histogram={},
                )
            return out
