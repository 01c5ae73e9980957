"""The Table's ``stats()``: counters, gauges and a staleness histogram in one plain dict."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..episodes import whole as _whole
from ..rows import widen_rows

#: bins of the staleness, times-sampled and priority (powers of two below the largest) histograms
_HIST_BINS = 16
_TINY = float(np.finfo(np.float64).tiny)  # the smallest normal float64


class StatsMethods:
    """``stats()`` (a mixin of :class:`~replaystore.table.Table`)."""

    def stats(self) -> dict[str, Any]:
        """A plain dict of counters and gauges (every key: docs/getting_started.md, the API table). Thread-safe.

        The lock is held to read the counters and copy the live items' metadata rows (one slice copy
        in ring mode); the gauges and histograms are computed from the copy after it is released.
        """
        with self._flushed():
            st = self._state
            out: dict[str, Any] = {"name": self.name, "size": st.size, "capacity": self.capacity}
            out.update(st.counters())
            out.update(st.blocked())
            out.update(self._waits_now())
            out["version"] = version = st.version
            out["max_priority_seen"] = st.max_priority
            if self._episodes is not None:  # what a sharded table needs to act as one table
                out["episodes_complete"] = len(_whole.complete_episodes(self._episodes)[0])
                out["next_stream"] = self._episodes.fresh_stream()
            inserts = self.rate_limiter.inserts
            out["sample_to_insert_ratio"] = self.rate_limiter.samples / inserts if inserts else 0.0
            rows = self._live_rows()
        if len(rows):
            ts = rows[:, 1]
            pr = rows[:, 3].view(np.float64)
            out.update(
                times_sampled_mean=float(ts.mean()),
                times_sampled_max=int(ts.max()),
                priority_min=float(pr.min()),
                priority_max=float(pr.max()),
                priority_mean=float(pr.mean()),
            )
            age = np.subtract(version, rows[:, 2])
            for name, values in (("staleness_histogram", age), ("times_sampled_histogram", ts)):
                hist = np.bincount(np.clip(values, 0, _HIST_BINS - 1), minlength=_HIST_BINS)
                out[name] = {(str(i) if i < _HIST_BINS - 1 else f">={i}"): int(c) for i, c in enumerate(hist) if c}
            out["priority_histogram"] = _priority_histogram(rows[:, 3], out["priority_min"], out["priority_max"])
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

    def _live_rows(self) -> np.ndarray:
        """The live items' sample rows (``rows.widen_rows``; lock held): slices in ring mode, else a gather."""
        st = self._state
        if st.ring_mode and st.ring_hi - st.ring_lo == st.size:
            cap = self.capacity
            start = (st.ring_lo - st.ring_base) % cap
            end = start + st.size
            keys = np.arange(st.ring_lo, st.ring_hi, dtype=np.int64)
            if end <= cap:
                return widen_rows(self._meta[start:end], keys)
            return widen_rows(np.concatenate((self._meta[start:], self._meta[: end - cap])), keys)
        live = np.flatnonzero(self._index.key_of_slot >= 0)
        return widen_rows(self._meta[live], self._index.key_of_slot[live])

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


def _priority_histogram(bits: np.ndarray, pmin: float, pmax: float) -> dict[str, int]:
    """Counts of priorities by power of two: ``{"2^e": n}`` for ``[2^e, 2^(e+1))``.

    ``_HIST_BINS`` bins, ending at the largest priority's; smaller ones (zeros, and negative
    priorities a non-prioritized table may hold) count in the lowest bin, ``"<2^e"``. ``bits``:
    the priorities' float64 bits (a strided column is fine: one pass over the exponent fields).
    """
    if pmax <= 0:
        return {"0": int(len(bits))}
    if pmin < 0 or 0 < pmin < _TINY or pmax < 2.0**-1000:  # (negative, subnormal, tiny) the exact slow path
        pr = bits.view(np.float64).copy()
        e = np.frexp(pr)[1].astype(np.int64) - 1  # p in [2^e, 2^(e+1))
        lo = int(e[pr > 0].max()) - (_HIST_BINS - 2)
        idx = np.clip(e - lo + 1, 0, _HIST_BINS - 1)
        idx[pr <= 0] = 0
        hist = np.bincount(idx, minlength=_HIST_BINS)
        return {(f"2^{lo + i - 1}" if i else f"<2^{lo}"): int(c) for i, c in enumerate(hist) if c}
    e = bits >> 52  # the biased exponent (sign bit clear, zeros 0)
    counts = np.bincount(e, minlength=2048)
    top = int(np.float64(pmax).view(np.int64) >> 52)
    lo = top - (_HIST_BINS - 2)  # the lowest exponent with a bin of its own (>= 1: pmax >= 2^-1000)
    out = {f"<2^{lo - 1023}": int(counts[:lo].sum())}
    out.update({f"2^{b - 1023}": int(counts[b]) for b in range(lo, top + 1)})
    return {k: c for k, c in out.items() if c}
