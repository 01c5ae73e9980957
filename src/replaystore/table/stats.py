"""The Table's ``stats()``: counters, gauges and a staleness histogram in one plain dict."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

_STALENESS_BINS = 16
#: the histograms of priorities (powers of two below the largest) and times sampled have this many bins
_HIST_BINS = 16


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
            out.update(self._waits_now())
            out["version"] = st.version
            out["max_priority_seen"] = st.max_priority
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
                hist = np.bincount(np.minimum(ts, _HIST_BINS - 1), minlength=_HIST_BINS)
                out["times_sampled_histogram"] = {
                    (str(i) if i < _HIST_BINS - 1 else f">={i}"): int(c) for i, c in enumerate(hist) if c
                }
                out["priority_histogram"] = _priority_histogram(pr)
            else:
                out.update(
                    times_sampled_mean=0.0,
                    times_sampled_max=0,
                    priority_min=0.0,
                    priority_max=0.0,
                    priority_mean=0.0,
                    staleness_histogram={},
                    times_sampled_histogram={},
                    priority_histogram={},
                )
            out["config"] = self._config_summary()
            return out

    def _waits_now(self) -> dict[str, float]:
        """Calls of this process blocked by the rate limiter now: how many, and seconds waited so far."""
        now = time.monotonic()
        out: dict[str, float] = {}
        for counter, starts in self._waits_since.items():
            side = counter.split("_", 1)[0]
            out[f"{side}_waiting"] = len(starts)
            out[f"{side}_blocked_now_s"] = float(sum(now - t for t in starts))
        return out

    def _config_summary(self) -> dict[str, Any]:
        """The table's parts as JSON-able values (for dashboards), and the limiter's target ratio."""
        limiter = self.rate_limiter
        lcfg = limiter.config()
        return {
            "sampler": repr(self.sampler),
            "remover": repr(self.remover),
            "rate_limiter": lcfg,
            "target_sample_to_insert_ratio": None if lcfg["type"] == "MinSize" else limiter.samples_per_insert,
            "max_times_sampled": self.max_times_sampled,
            "max_staleness": self.max_staleness,
            "episodes": self._episodes is not None,
        }


def _priority_histogram(pr: np.ndarray) -> dict[str, int]:
    """Counts of priorities by power of two: ``{"2^e": n}`` for ``[2^e, 2^(e+1))``.

    ``_HIST_BINS`` bins, ending at the largest priority's; smaller ones (and zeros) count in the
    lowest bin, ``"<2^e"``.
    """
    top = float(pr.max())
    if top <= 0:
        return {"0": int(len(pr))}
    _, emax = np.frexp(top)  # top in [2^(emax-1), 2^emax)
    _, e = np.frexp(pr)
    lo = int(emax) - _HIST_BINS
    idx = np.clip(e.astype(np.int64) - 1 - lo, 0, _HIST_BINS - 1)
    idx[pr <= 0] = 0
    hist = np.bincount(idx, minlength=_HIST_BINS)
    return {(f"2^{lo + i}" if i else f"<2^{lo + 1}"): int(c) for i, c in enumerate(hist) if c}
