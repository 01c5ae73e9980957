"""Waiting on the rate limiter: a blocking call waits with a timeout (or warns once), and is counted.

A mixin of :class:`~replaystore.table.Table` (its methods run with the table's lock held); the
contract is :meth:`Waits._wait`'s. The waits going on are counted for ``stats()``
(``insert_waiting``, ``sample_blocked_now_s``...).
"""

from __future__ import annotations

import time
import warnings

from ..errors import BlockingWarning, Timeout
from .state import BLOCKED


class Waits:
    """Blocking calls' waits (a mixin of :class:`~replaystore.table.Table`; lock held)."""

    def _wait(self, ready, timeout: float | None, what: str, counter: str) -> None:
        """Wait on the table's condition until ``ready()``; raise Timeout at the deadline, Closed if it closes.

        Without a timeout, warns once (:class:`~replaystore.BlockingWarning`) after
        :attr:`blocking_warning_s` seconds, and goes on waiting.
        """
        if ready():
            return
        timeout = self.default_timeout if timeout is None else timeout
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        warn_at = None if deadline is not None else start + self.blocking_warning_s
        self._waiting += 1  # (and when, for stats(): _waits_now)
        self.__dict__.setdefault("_waits_since", {c: [] for c in BLOCKED})[counter].append(start)
        try:
            while not ready():
                self._check_open()
                now = time.monotonic()
                if deadline is not None:
                    remaining = deadline - now
                    if remaining <= 0:
                        limiter = self.rate_limiter
                        raise Timeout(
                            f"{what} on table {self.name!r} blocked by {limiter!r} for "
                            f"{timeout:.3g}s (size {self._state.size}, inserts {limiter.inserts}, "
                            f"samples {limiter.samples})"
                        )
                elif warn_at is not None and now >= warn_at:
                    warn_at = remaining = None
                    self._warn_blocked(what, now - start)
                else:
                    remaining = None if warn_at is None else warn_at - now
                self._cond.wait(remaining)
            self._check_open()
        finally:
            self._waiting -= 1
            self._waits_since[counter].remove(start)
            setattr(self._state, counter, getattr(self._state, counter) + time.monotonic() - start)

    def _warn_blocked(self, what: str, waited: float) -> None:
        limiter = self.rate_limiter
        warnings.warn(
            f"{what} on table {self.name!r} has waited {waited:.0f}s with no timeout for {limiter!r} "
            f"(size {self._state.size}, inserts {limiter.inserts}, samples {limiter.samples}) and goes on "
            "waiting; a call that another thread cannot unblock never returns: pass timeout= (or "
            "default_timeout=) to get a Timeout instead",
            BlockingWarning,
            stacklevel=4,
        )

    def _wait_for_sample(self, n: int, timeout: float | None) -> None:
        """Flush staged adds; block (lock held) until the table is open, non-empty and admits ``n`` samples."""
        if self._stager is not None and self._stager.n:
            self._flush_pending()
        st = self._state
        if st.closed:
            self._check_open()
        limiter = self.rate_limiter
        if not (st.size > 0 and limiter.can_sample(n)):
            limiter.check_sample_size(n)
            self._wait(lambda: st.size > 0 and limiter.can_sample(n), timeout, f"sample of {n}", "sample_blocked_s")

    def _waits_now(self) -> dict[str, float]:
        """Calls of this process blocked by the rate limiter now: how many, and seconds waited so far."""
        now = time.monotonic()
        out: dict[str, float] = {}
        waits = self.__dict__.get("_waits_since", {})
        for counter in BLOCKED:
            starts = waits.get(counter, ())
            side = counter.split("_", 1)[0]
            out[f"{side}_waiting"] = len(starts)
            out[f"{side}_blocked_now_s"] = float(sum(now - t for t in starts))
        return out


__all__ = ["Waits"]
