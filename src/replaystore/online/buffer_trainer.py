"""The trainer side of :class:`~replaystore.online.RolloutBuffer`: samples, versions, version signals.

A part of the ``RolloutBuffer`` class (its state lives in :mod:`.buffer`): drawing whole groups
(by count, or by tokens with ``batch_tokens``), the waits that keep pacing exact, publishing a new
policy version, and the signals producers use to learn of one (:meth:`TrainerCalls.wait_for_version`,
the async iterator :meth:`TrainerCalls.versions`) to interrupt or continue a partial rollout.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ..errors import Closed, InvalidRequest, Timeout
from .groups import RolloutBatch
from .versions import check_int


class TrainerCalls:
    """Trainer-side methods of :class:`~replaystore.online.RolloutBuffer` (thread-safe, validated first)."""

    budget: Any

    def _straggler(self, n: int) -> bool:
        """Whether the sample must wait for running groups (pacing with ``fifo`` or ``in_order``).

        ``fifo``: a running group is on its last version in the window. ``in_order``: one of the
        ``n`` oldest outstanding groups is still running.
        """
        if self.budget is None:
            return False
        if self.pick == "fifo":
            oldest = self.budget.oldest_running_version()
            return oldest is not None and oldest <= self.version - self.max_staleness
        if self.pick == "in_order":
            first_running = self.budget.oldest_running_id()
            if first_running is None:
                return False
            return sum(1 for g in self._complete.values() if g.order < first_running) < n
        return False

    def _sample_size(self, num_groups: Any, tokens: Any) -> tuple[int | None, int | None]:
        if num_groups is None:
            t = tokens if tokens is not None else self.batch_tokens
            if t is None:
                raise InvalidRequest("sample() needs num_groups (or tokens, or a buffer with batch_tokens)")
            return None, check_int(t, "tokens", 1)
        if tokens is not None:
            raise InvalidRequest("give num_groups or tokens, not both")
        n = check_int(num_groups, "num_groups", 1)
        if n > self.capacity:
            raise InvalidRequest(f"{n} groups can never be held by capacity {self.capacity}")
        if self.budget is not None and not self.tokens and n > (self.max_staleness + 1) * self.batch_size:
            raise InvalidRequest(
                f"{n} groups can never be admitted at once: the budget admits "
                f"(max_staleness + 1) * batch_size = {(self.max_staleness + 1) * self.batch_size}"
            )
        return n, None

    def _ready(self, n: int | None, tokens: int | None) -> bool:
        if n is not None:
            return len(self._complete) >= n and not self._straggler(n)
        return bool(self._complete) and self._tokens >= tokens and not self._straggler(1)

    def sample(
        self, num_groups: int | None = None, timeout: float | None = None, tokens: int | None = None
    ) -> RolloutBatch:
        """Draw distinct complete groups with the pick policy; wait while too few exist.

        ``num_groups`` groups; or, with ``num_groups=None``, whole groups in pick order until their
        tokens (sum of lengths) reach ``tokens`` (default ``batch_tokens``): a variable batch size.
        With a token budget, the tokens taken beyond ``tokens`` are credited to the budget's limit
        (:meth:`StalenessBudget.credit`), so whole groups that overshoot never stall pacing.
        With pacing and ``"fifo"``/``"in_order"``, also waits for running groups that would
        otherwise go stale at the next version. Groups reaching ``max_reuse`` samples are retired.

        Raises:
            InvalidRequest: bad or missing sizes, or more groups than the buffer (or the budget)
                could ever provide.
            Timeout: not enough complete groups within ``timeout`` seconds (``None``: wait forever).
            Closed: the buffer was closed.
        """
        n, want_tokens = self._sample_size(num_groups, tokens)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        with self._lock:
            self._check_open()
            while True:
                self._expire(self._clock())
                if self._ready(n, want_tokens):
                    break
                self._check_open()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    self._commit()
                    waiting = " (waiting for running groups, see pick)" if self._straggler(n or 1) else ""
                    what = f"{n} groups" if n is not None else f"{want_tokens} tokens"
                    raise Timeout(
                        f"sample of {what} from {self.name!r}: {len(self._complete)} complete "
                        f"({self._tokens} tokens), {len(self._pending)} pending after "
                        f"{timeout:.3g}s{waiting}"
                    )
                # wake periodically so expiring tickets and timed-out groups are noticed
                self._cond.wait(0.05 if remaining is None else min(remaining, 0.05))
            keys = self.table.sample(n if n is not None else len(self._complete), timeout=0).keys.tolist()
            if n is None:
                total, cut = 0, 0
                while cut < len(keys) and total < want_tokens:
                    total += self._complete[keys[cut]].tokens
                    cut += 1
                keys = keys[:cut]
                if self.tokens and self.budget is not None and total > want_tokens:
                    self.budget.credit(total - want_tokens)  # whole groups overshot: see StalenessBudget.credit
            return self._take_batch(keys)

    def _take_batch(self, keys: list[int]) -> RolloutBatch:
        groups = [self._complete[k] for k in keys]
        retired = []
        for key, g in zip(keys, groups):
            g.times_sampled += 1
            self._mark_done(g.group_id, fate="sampled")
            if g.times_sampled >= self.max_reuse:
                retired.append(key)
                self._take_out(key)
                self.counters["groups_retired"] += 1
            else:
                self._stage(self._jkey[key], g)
        if retired:
            self.table.delete(retired)
        batch = RolloutBatch(groups, self.version)
        self.metrics.trained(batch.lengths.tolist(), batch.staleness(self.staleness_end).tolist())
        self.counters["groups_sampled"] += len(groups)
        self.counters["rollouts_sampled"] += len(batch.rollouts)
        self.counters["sample_calls"] += 1
        self._commit()
        return batch

    def set_version(self, version: int) -> int:
        """Set the trainer's policy version (it may only grow); drop groups that became stale.

        Wakes :meth:`wait_for_version` and :meth:`versions` waiters and waiting producers.

        Returns:
            How many complete groups were dropped.

        Raises:
            InvalidRequest: not an integer, or lower than the current version.
        """
        with self._lock:
            self._check_open()
            v = check_int(version, "version")
            if v < self.version:
                raise InvalidRequest(f"version may only grow: {v} < {self.version}")
            self.version = v
            if self.budget is not None:
                self.budget.set_version(v)
            dropped = 0
            if self.drop_stale:
                stale = [k for k, g in self._complete.items() if self._is_stale(g)]
                for k in stale:
                    self._remove(k, "stale")
                dropped = len(stale)
            self.table.set_version(v)
            self._cond.notify_all()
            self._commit()
            return dropped

    def wait_for_version(self, version: int, timeout: float | None = None) -> int:
        """Wait until the policy version is at least ``version``; return the version then.

        A version already reached (the trainer got there first, the usual race) returns at once:
        a producer that saw version ``v`` waits for ``v + 1`` and learns the newest version.

        Raises:
            InvalidRequest: ``version`` is not an integer ``>= 0`` (nothing changed).
            Timeout: not reached within ``timeout`` seconds (``None``: wait forever).
            Closed: the buffer was closed (also while waiting).
        """
        v = check_int(version, "version")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                self._check_open()
                if self.version >= v:
                    return self.version
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise Timeout(
                        f"version {v} of {self.name!r} not reached within {timeout:.3g}s (version {self.version})"
                    )
                self._cond.wait(remaining)

    async def versions(
        self, after: int | None = None, timeout: float | None = None, poll: float = 0.5
    ) -> AsyncIterator[int]:
        """An async iterator of version changes; ends when the buffer closes.

        Yields each newer version it sees (several changes between two reads yield the newest only).

        Args:
            after: start after this version (default: the current one).
            timeout: raise :class:`Timeout` if no new version comes within this many seconds.
            poll: the longest a worker thread waits at once (the iterator can be cancelled between).
        """
        seen = self.version if after is None else check_int(after, "version")
        wait = functools.partial(asyncio.to_thread, self.wait_for_version)
        async for v in follow_versions(wait, seen, timeout, poll, self.name):
            yield v


async def follow_versions(
    wait: Callable[[int, float], Awaitable[int]], seen: int, timeout: float | None, poll: float, name: str
) -> AsyncIterator[int]:
    """Each newer version after ``seen``, from ``await wait(version, seconds)`` (``wait_for_version``).

    Each wait lasts at most ``poll`` seconds; ends when ``wait`` raises :class:`Closed`; raises
    :class:`Timeout` if no new version comes within ``timeout`` seconds (``None``: never).
    """
    while True:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = poll if deadline is None else min(poll, max(0.0, deadline - time.monotonic()))
            try:
                v = await wait(seen + 1, step)
                break
            except Closed:
                return
            except Timeout:
                if deadline is not None and time.monotonic() >= deadline:
                    raise Timeout(f"no version after {seen} of {name!r} within {timeout:.3g}s") from None
        seen = v
        yield v


__all__ = ["TrainerCalls", "follow_versions"]
