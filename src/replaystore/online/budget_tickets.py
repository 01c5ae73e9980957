"""A staleness budget's tickets from grant to end: acquired, finished, abandoned, cancelled, expired.

A mixin of :class:`~replaystore.online.budget.StalenessBudget` (its methods act on the budget's
own state, under its lock); a ticket's life is told in :mod:`replaystore.online.budget`'s doc.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequest, OverReservation, Timeout
from .tickets import WEIGHT, Ticket, ticket_ids
from .versions import check_int

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from .tickets import TicketBook


class BudgetTickets:
    """Granting and ending tickets (mixed into ``StalenessBudget``; thread-safe through its lock)."""

    if TYPE_CHECKING:
        ttl: float | None
        version: int
        accepted: int
        paused: bool
        counters: dict[str, int]
        wait_s: float
        _clock: Callable[[], float]
        _lock: threading.Lock
        _cond: threading.Condition
        _book: TicketBook
        _no_expiry_before: float
        _expired_unclaimed: list[int]
        _cancelled_unclaimed: list[int]
        _window_wait: list[float]

        def _check_open(self) -> None: ...
        def _check_request(self, k: Any, weight: Any, overprovision: Any) -> tuple[int, int, int]: ...
        def _check_held(self, ids: list[int]) -> None: ...
        def _grantable(self, k: int, w: int) -> bool: ...
        def _refuse_deadlock(self, holder: str | None, k: int, w: int) -> None: ...
        def limit(self) -> int:
            """See ``StalenessBudget.limit``."""
            ...

    # -- acquiring ---------------------------------------------------------------------------------
    def _grant(self, k: int, w: int, m: int, holder: str | None, now: float) -> list[Ticket]:
        deadline = None if self.ttl is None else now + self.ttl
        if m:
            self.counters["overprovisioned"] += m
        self.counters["acquired"] += k + m
        if deadline is not None:
            self._no_expiry_before = min(self._no_expiry_before, deadline)
        return self._book.grant(k + m, self.version, holder, deadline, w, now, need=k if m else None)

    def try_acquire(
        self, k: int = 1, holder: str | None = None, overprovision: int = 0, weight: int | None = None
    ) -> list[Ticket]:
        """``k`` (+ ``overprovision``) tickets if the budget allows all of them now, else ``[]``.

        Never blocks. See :meth:`acquire` for the arguments.

        Raises:
            InvalidRequest: bad ``k``, ``weight`` or ``overprovision``, or more than the budget can
                ever grant at once.
            WouldDeadlock: see :meth:`acquire`.
            Closed: the budget is closed.
        """
        with self._lock:
            k, w, m = self._check_request(k, weight, overprovision)
            self._check_open()
            now = self._clock()
            self._expire(now)
            self._refuse_deadlock(holder, k + m, w)
            self.counters["acquire_calls"] += 1
            if not self._grantable(k + m, w):
                return []
            self._window_wait.append(0.0)
            return self._grant(k, w, m, holder, now)

    def acquire(
        self,
        k: int = 1,
        timeout: float | None = None,
        holder: str | None = None,
        overprovision: int = 0,
        weight: int | None = None,
    ) -> list[Ticket]:
        """``k`` tickets, waiting until the budget allows all of them (all or nothing).

        Args:
            k: tickets wanted (one per rollout or group the producer will start).
            timeout: seconds to wait (``None``: forever).
            holder: a label (producer id) stored with the tickets; with it, a request that can
                never be granted while the holder keeps its tickets raises :class:`WouldDeadlock`.
            overprovision: extra tickets granted with the ``k`` (all charged to the budget): once
                ``k`` of the batch are finished accepted, the rest are cancelled.
            weight: units each ticket reserves (default: the budget's ``weight``).

        Returns:
            :class:`Ticket` ids (ints carrying their admission ``version``).

        Raises:
            InvalidRequest: bad arguments (nothing waits for an impossible request).
            WouldDeadlock: the holder holds tickets and the request cannot be granted while it does.
            Timeout: not granted within ``timeout``; nothing acquired.
            Closed: the budget was closed while waiting.
        """
        with self._lock:
            k, w, m = self._check_request(k, weight, overprovision)
            self._check_open()
            self._expire(self._clock())
            self._refuse_deadlock(holder, k + m, w)
            self.counters["acquire_calls"] += 1
            start = time.monotonic()
            deadline = None if timeout is None else start + timeout
            try:
                while True:
                    now = self._clock()
                    self._expire(now)
                    if self._grantable(k + m, w):
                        return self._grant(k, w, m, holder, now)
                    self._check_open()
                    self._refuse_deadlock(holder, k + m, w)
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        self.counters["acquire_timeouts"] += 1
                        raise Timeout(
                            f"{k + m} tickets not granted within {timeout:.3g}s: version {self.version}, "
                            f"running {len(self._book)}, accepted {self.accepted}, limit {self.limit()}"
                            f"{', admission paused' if self.paused else ''}"
                        )
                    nxt = self._book.next_deadline()
                    if nxt is not None:  # wake when a ticket may expire
                        step = max(nxt - now, 0.001)
                        remaining = step if remaining is None else min(remaining, step)
                    self._cond.wait(remaining)
            finally:
                waited = time.monotonic() - start
                self.wait_s += waited
                self._window_wait.append(waited)

    # -- ending tickets -------------------------------------------------------------------------------
    def finish(self, tickets: Any, accepted: bool = True, units: Sequence[int] | None = None) -> list[int]:
        """End held tickets: their rollouts finished and were kept (``accepted``) or rejected.

        A rejected rollout does not count against the budget (its capacity comes back).

        Args:
            tickets: a list of tickets, or one ticket.
            accepted: kept (counts against the budget) or rejected.
            units: per ticket, the units its rollout actually used (tokens), at most its reserved
                weight (the default).

        Returns:
            Tickets cancelled because an over-provisioned batch is now full (also reported once by
            :meth:`take_cancelled`).

        Raises:
            UnknownTicket: some ticket is not held (nothing changed).
            InvalidRequest: a ticket that is not an integer id (``finish([t, "x"])``), duplicates, bad ``units``.
            OverReservation: a ticket's ``units`` exceed what it reserved (nothing changed).
        """
        with self._lock:
            self._expire(self._clock())
            ids = ticket_ids(tickets)
            self._check_held(ids)
            if units is not None:
                units = [check_int(u, "units", 0) for u in units]
                if len(units) != len(ids):
                    raise InvalidRequest(f"{len(units)} units for {len(ids)} tickets")
                over = [(t, u) for t, u in zip(ids, units) if u > self._book.records[t][WEIGHT]]
                if over:
                    t, u = over[0]
                    raise OverReservation(
                        f"ticket {t} used {u} units, more than the {self._book.records[t][WEIGHT]} it reserved: "
                        f"the staleness bound needs every rollout within its reservation"
                    )
            recs = self._book.pop(ids)
            cancelled: list[int] = []
            if accepted:
                self.accepted += sum(units) if units is not None else sum(r[WEIGHT] for r in recs)
                self.counters["accepted_total"] += len(ids)
                cancelled = self._cancel(self._book.full_batches(recs))
            else:
                self.counters["rejected"] += len(ids)
            self._cond.notify_all()
            return cancelled

    def abandon(self, tickets: Any) -> None:
        """End held tickets whose rollouts will not finish; their capacity comes back.

        Raises:
            UnknownTicket: some ticket is not held (nothing changed).
            InvalidRequest: a ticket that is not an integer id, duplicates.
        """
        with self._lock:
            self._expire(self._clock())
            ids = ticket_ids(tickets)
            self._check_held(ids)
            self._book.pop(ids)
            self.counters["abandoned"] += len(ids)
            self._cond.notify_all()

    def _cancel(self, ids: list[int]) -> list[int]:
        self._book.cancel(ids)
        self.counters["cancelled"] += len(ids)
        self._cancelled_unclaimed += ids
        if ids:
            self._cond.notify_all()
        return ids

    def cancel_slowest(self, n: int, holder: str | None = None) -> list[int]:
        """Cancel up to ``n`` held tickets, longest-running first (of ``holder``, if given).

        Their capacity comes back; their producers get :class:`TicketCancelled` on later calls.

        Returns:
            The cancelled ticket ids (also reported once by :meth:`take_cancelled`).

        Raises:
            InvalidRequest: ``n`` is not an integer ``>= 0``.
        """
        with self._lock:
            n = check_int(n, "number of tickets to cancel")
            self._expire(self._clock())
            return self._cancel(self._book.longest_running(n, holder))

    def renew(self, tickets: Any) -> None:
        """Restart the time-to-live of held tickets (a producer's heartbeat).

        Raises:
            UnknownTicket: some ticket is not held (expired by now, finished, ...; :class:`TicketCancelled`
                if cancelled); nothing changed.
            InvalidRequest: a ticket that is not an integer id, duplicates (nothing changed).
        """
        with self._lock:
            now = self._clock()
            self._expire(now)
            ids = ticket_ids(tickets)
            self._check_held(ids)
            if self.ttl is not None:
                self._book.renew(ids, now + self.ttl)

    # -- expiry ------------------------------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        # deadlines only grow (renewals) or arrive later than the held ones (grants): a lower bound
        # of them stays one, and saves scanning every ticket at every call
        if self.ttl is None or not self._book or now < self._no_expiry_before:
            return
        gone = self._book.expired(now)
        if gone:
            self._book.pop(gone)
            self.counters["expired"] += len(gone)
            self._expired_unclaimed += gone
            self._cond.notify_all()
        nxt = self._book.next_deadline()
        self._no_expiry_before = float("inf") if nxt is None else nxt

    def expire(self, now: float | None = None) -> list[int]:
        """Abandon the tickets whose time-to-live passed; return every ticket expired since the last call.

        (Expiry also happens inside the other calls; this returns those too, once, so that an owner
        such as :class:`~replaystore.online.RolloutBuffer` can drop what the tickets were building.)
        """
        with self._lock:
            self._expire(self._clock() if now is None else now)
            out, self._expired_unclaimed = self._expired_unclaimed, []
            return out

    def take_cancelled(self) -> list[int]:
        """Every ticket cancelled since the last call (once each)."""
        with self._lock:
            out, self._cancelled_unclaimed = self._cancelled_unclaimed, []
            return out

    def take_ended(self, now: float | None = None) -> tuple[list[int], list[int]]:
        """``(expired, cancelled)``: :meth:`expire` and :meth:`take_cancelled` in one call."""
        with self._lock:
            self._expire(self._clock() if now is None else now)
            out = self._expired_unclaimed, self._cancelled_unclaimed
            self._expired_unclaimed, self._cancelled_unclaimed = [], []
            return out

    def take_waits(self) -> list[float]:
        """The wait of every acquire since the last call (seconds; 0 for an immediate grant)."""
        with self._lock:
            out, self._window_wait = self._window_wait, []
            return out


__all__ = ["BudgetTickets"]
