"""StalenessBudget: admission of rollouts by a version budget (AReaL's rule), so nothing goes stale.

Dropping stale data when the trainer samples biases training toward short rollouts (the long ones
are the ones that go stale). Pacing holds producers back instead: a producer asks for permission
(a *ticket*) before it starts a rollout, and gets it only while

    (max_staleness + version + 1) * batch_size - (accepted + running) > 0

where ``version`` is the trainer's policy version, ``batch_size`` the number of rollouts (groups)
the trainer consumes per version, ``running`` the tickets held and ``accepted`` the rollouts that
finished and were kept. A trainer that consumes ``batch_size`` rollouts per version, oldest first,
then never sees one more than ``max_staleness`` versions behind the version it started under
(:class:`~replaystore.online.RolloutBuffer` adds the one missing piece: a sample waits for a
running rollout that would otherwise go stale).

Each ticket is held until it is finished (:meth:`StalenessBudget.finish`: accepted, or rejected)
or abandoned. A ticket acquired with a time-to-live is abandoned automatically once its holder has
not renewed it for that long (a producer that died gives its permissions back). Accepted rollouts
that leave the buffer untrained (dropped, evicted) are given back with :meth:`discard`.

Thread-safe: one lock; :meth:`acquire` waits on a condition and is woken by every change that can
raise the capacity (a version, a finish, an abandon, an expiry, a discard). The state is a
JSON-able dict (:meth:`state` / :meth:`load_state`) so a service can journal it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from ..errors import Closed, InvalidRequest, Timeout, UnknownTicket
from .versions import check_int

_COUNTERS = ("acquired", "accepted_total", "rejected", "abandoned", "expired", "discarded",
             "acquire_calls", "acquire_timeouts")


class StalenessBudget:
    """AReaL's staleness admission control as a reusable object (see the module doc).

    Args:
        batch_size: rollouts (or groups) the trainer consumes per policy version (``>= 1``).
        max_staleness: versions a rollout may lag behind the trainer when it is trained (``>= 0``).
        max_running: at most this many tickets held at once (``None``: no limit besides the budget).
        ttl: seconds a ticket stays valid without :meth:`renew` (``None``: forever). Expired
            tickets are abandoned and their capacity comes back.
        version: the initial policy version.
        clock: wall-clock function for ticket deadlines (``time.time``; deadlines survive restarts).

    Raises:
        InvalidRequest: a non-integer or out-of-range argument.
    """

    def __init__(self, batch_size: int, max_staleness: int, max_running: int | None = None,
                 ttl: float | None = None, version: int = 0, clock: Any = time.time) -> None:
        self.batch_size = check_int(batch_size, "batch_size", 1)
        self.max_staleness = check_int(max_staleness, "max_staleness", 0)
        self.max_running = None if max_running is None else check_int(max_running, "max_running", 1)
        if ttl is not None and not ttl > 0:
            raise InvalidRequest(f"ttl must be > 0 seconds or None, got {ttl!r}")
        self.ttl = None if ttl is None else float(ttl)
        self.version = check_int(version, "version")
        self._clock = clock
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self.accepted = 0  # rollouts accepted and not discarded (AReaL's ``accepted``)
        self._tickets: dict[int, list] = {}  # id -> [version at admission, holder, deadline or None]
        self._next_id = 0
        self._expired_unclaimed: list[int] = []
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self.wait_s = 0.0  # total seconds producers waited in acquire
        self._window_wait: list[float] = []  # per-acquire waits since the last take_waits()

    # -- queries ----------------------------------------------------------------------------------
    @property
    def running(self) -> int:
        """Tickets held now."""
        return len(self._tickets)

    def limit(self) -> int:
        """The budget's total: ``(max_staleness + version + 1) * batch_size``."""
        return (self.max_staleness + self.version + 1) * self.batch_size

    def _capacity(self) -> int:
        cap = self.limit() - (self.accepted + len(self._tickets))
        if self.max_running is not None:
            cap = min(cap, self.max_running - len(self._tickets))
        return cap

    def capacity(self) -> int:
        """How many tickets could be acquired now (may be negative after a discard is undone)."""
        with self._lock:
            self._expire(self._clock())
            return self._capacity()

    def held(self, ticket: int) -> bool:
        """Whether ``ticket`` is held (acquired, not finished, abandoned or expired)."""
        with self._lock:
            return ticket in self._tickets

    def version_of(self, ticket: int) -> int:
        """The policy version under which ``ticket`` was admitted. :class:`UnknownTicket` if not held."""
        with self._lock:
            try:
                return self._tickets[ticket][0]
            except KeyError:
                raise UnknownTicket(f"ticket {ticket!r} is not held") from None

    def oldest_running_version(self) -> int | None:
        """The admission version of the oldest ticket held, or ``None`` when none is."""
        with self._lock:
            self._expire(self._clock())
            return min((t[0] for t in self._tickets.values()), default=None)

    def oldest_running_id(self) -> int | None:
        """The smallest (oldest) ticket id held, or ``None`` when none is."""
        with self._lock:
            self._expire(self._clock())
            return min(self._tickets, default=None)

    def _max_request(self) -> int:
        n = (self.max_staleness + 1) * self.batch_size
        return n if self.max_running is None else min(n, self.max_running)

    def _check_k(self, k: Any) -> int:
        k = check_int(k, "number of tickets", 1)
        if k > self._max_request():
            raise InvalidRequest(f"{k} tickets can never be granted at once: the budget admits at most "
                                 f"{self._max_request()} ((max_staleness + 1) * batch_size"
                                 f"{'' if self.max_running is None else ', max_running'})")
        return k

    def _check_held(self, tickets: Iterable[Any]) -> list[int]:
        ids = list(tickets)
        if len(set(ids)) != len(ids):
            raise InvalidRequest(f"duplicate tickets in {ids!r}")
        missing = [t for t in ids if t not in self._tickets]
        if missing:
            raise UnknownTicket(f"tickets {missing[:5]!r} are not held (never acquired, already finished "
                                f"or abandoned, or expired)")
        return ids

    # -- acquiring ---------------------------------------------------------------------------------
    def _grant(self, k: int, holder: str | None, now: float) -> list[int]:
        ids = list(range(self._next_id, self._next_id + k))
        self._next_id += k
        deadline = None if self.ttl is None else now + self.ttl
        for i in ids:
            self._tickets[i] = [self.version, holder, deadline]
        self.counters["acquired"] += k
        return ids

    def try_acquire(self, k: int = 1, holder: str | None = None) -> list[int]:
        """``k`` tickets if the budget allows all of them now, else ``[]`` (never blocks).

        Raises:
            InvalidRequest: ``k`` is not a positive integer, or larger than the budget can ever grant.
            Closed: the budget was closed.
        """
        with self._lock:
            k = self._check_k(k)
            self._check_open()
            now = self._clock()
            self._expire(now)
            self.counters["acquire_calls"] += 1
            if self._capacity() < k:
                return []
            self._window_wait.append(0.0)
            return self._grant(k, holder, now)

    def acquire(self, k: int = 1, timeout: float | None = None, holder: str | None = None) -> list[int]:
        """``k`` ticket ids, waiting until the budget allows all of them (all or nothing).

        Args:
            k: tickets wanted (one per rollout or group the producer will start).
            timeout: seconds to wait (``None``: forever).
            holder: a label (producer id) stored with the tickets.

        Raises:
            InvalidRequest: bad ``k`` (nothing waits for an impossible request).
            Timeout: not granted within ``timeout``; nothing acquired.
            Closed: the budget was closed while waiting.
        """
        with self._lock:
            k = self._check_k(k)
            self._check_open()
            self.counters["acquire_calls"] += 1
            start = time.monotonic()
            deadline = None if timeout is None else start + timeout
            try:
                while True:
                    now = self._clock()
                    self._expire(now)
                    if self._capacity() >= k:
                        return self._grant(k, holder, now)
                    self._check_open()
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        self.counters["acquire_timeouts"] += 1
                        raise Timeout(f"{k} tickets not granted within {timeout:.3g}s: version {self.version}, "
                                      f"running {len(self._tickets)}, accepted {self.accepted}, "
                                      f"limit {self.limit()}")
                    nxt = self._next_deadline(now)
                    if nxt is not None:  # wake when a ticket may expire
                        step = max(nxt - now, 0.001)
                        remaining = step if remaining is None else min(remaining, step)
                    self._cond.wait(remaining)
            finally:
                waited = time.monotonic() - start
                self.wait_s += waited
                self._window_wait.append(waited)

    # -- ending tickets -------------------------------------------------------------------------------
    def finish(self, tickets: Iterable[int], accepted: bool = True) -> None:
        """End held tickets: their rollouts finished and were kept (``accepted``) or rejected.

        A rejected rollout does not count against the budget (its capacity comes back).

        Raises:
            UnknownTicket: some ticket is not held (nothing changed). InvalidRequest: duplicates.
        """
        with self._lock:
            ids = self._check_held(tickets)
            for i in ids:
                del self._tickets[i]
            if accepted:
                self.accepted += len(ids)
                self.counters["accepted_total"] += len(ids)
            else:
                self.counters["rejected"] += len(ids)
            self._cond.notify_all()

    def abandon(self, tickets: Iterable[int]) -> None:
        """End held tickets whose rollouts will not finish; their capacity comes back.

        Raises:
            UnknownTicket: some ticket is not held (nothing changed). InvalidRequest: duplicates.
        """
        with self._lock:
            ids = self._check_held(tickets)
            for i in ids:
                del self._tickets[i]
            self.counters["abandoned"] += len(ids)
            self._cond.notify_all()

    def renew(self, tickets: Iterable[int]) -> None:
        """Restart the time-to-live of held tickets (a producer's heartbeat).

        Raises:
            UnknownTicket: some ticket is not held (already expired?); nothing changed.
        """
        with self._lock:
            ids = self._check_held(tickets)
            if self.ttl is not None:
                deadline = self._clock() + self.ttl
                for i in ids:
                    self._tickets[i][2] = deadline

    def discard(self, n: int) -> None:
        """``n`` accepted rollouts left without being trained on (dropped, evicted): give them back.

        Raises:
            InvalidRequest: ``n`` is not an integer in ``[0, accepted]``.
        """
        with self._lock:
            n = check_int(n, "discarded rollouts")
            if n > self.accepted:
                raise InvalidRequest(f"cannot discard {n} rollouts: only {self.accepted} are accepted")
            self.accepted -= n
            self.counters["discarded"] += n
            if n:
                self._cond.notify_all()

    def set_version(self, version: int) -> None:
        """Set the trainer's policy version (it may only grow); wakes waiting producers.

        Raises:
            InvalidRequest: not an integer, or lower than the current version.
        """
        with self._lock:
            v = check_int(version, "version")
            if v < self.version:
                raise InvalidRequest(f"version may only grow: {v} < {self.version}")
            self.version = v
            self._cond.notify_all()

    # -- expiry ------------------------------------------------------------------------------------------
    def _next_deadline(self, now: float) -> float | None:
        if self.ttl is None or not self._tickets:
            return None
        return min(t[2] for t in self._tickets.values())

    def _expire(self, now: float) -> None:
        if self.ttl is None or not self._tickets:
            return
        gone = [i for i, t in self._tickets.items() if t[2] <= now]
        if gone:
            for i in gone:
                del self._tickets[i]
            self.counters["expired"] += len(gone)
            self._expired_unclaimed += gone
            self._cond.notify_all()

    def expire(self, now: float | None = None) -> list[int]:
        """Abandon the tickets whose time-to-live passed; return every ticket expired since the last call.

        (Expiry also happens inside the other calls; this returns those too, once, so that an owner
        such as :class:`~replaystore.online.RolloutBuffer` can drop what the tickets were building.)
        """
        with self._lock:
            self._expire(self._clock() if now is None else now)
            out, self._expired_unclaimed = self._expired_unclaimed, []
            return out

    def take_waits(self) -> list[float]:
        """The wait of every acquire since the last call (seconds; 0 for an immediate grant)."""
        with self._lock:
            out, self._window_wait = self._window_wait, []
            return out

    # -- lifecycle and persistence ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise Closed("the staleness budget is closed")

    def close(self) -> None:
        """Wake every waiting :meth:`acquire` with :class:`Closed`; later acquires raise it too."""
        with self._lock:
            self._closed = True
            self._cond.notify_all()

    def stats(self) -> dict[str, Any]:
        """Counters and gauges: version, running, accepted, capacity, limit, wait seconds, ..."""
        with self._lock:
            self._expire(self._clock())
            return {**self.counters, "version": self.version, "running": len(self._tickets),
                    "accepted": self.accepted, "capacity": self._capacity(), "limit": self.limit(),
                    "producer_wait_s": self.wait_s}

    def state(self) -> dict[str, Any]:
        """JSON-able state (tickets with their deadlines, counters, version) for a journal."""
        with self._lock:
            return {"version": self.version, "accepted": self.accepted, "next_id": self._next_id,
                    "tickets": {str(i): list(t) for i, t in self._tickets.items()},
                    "counters": dict(self.counters), "wait_s": self.wait_s}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state` output (a restarted service). Tickets keep their deadlines."""
        with self._lock:
            self.version = int(state["version"])
            self.accepted = int(state["accepted"])
            self._next_id = int(state["next_id"])
            self._tickets = {int(i): list(t) for i, t in state["tickets"].items()}
            self.counters.update(state["counters"])
            self.wait_s = float(state["wait_s"])
            self._cond.notify_all()

    def __repr__(self) -> str:
        return (f"StalenessBudget(batch_size={self.batch_size}, max_staleness={self.max_staleness}, "
                f"version={self.version}, running={len(self._tickets)}, accepted={self.accepted})")


__all__ = ["StalenessBudget"]
