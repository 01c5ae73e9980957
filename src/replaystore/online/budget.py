"""StalenessBudget: admission of rollouts by a version budget (AReaL's rule), so nothing goes stale.

Dropping stale data when the trainer samples biases training toward short rollouts (the long ones
are the ones that go stale). Pacing holds producers back instead: a producer asks for permission
(a *ticket*) before it starts a rollout, and gets it only while

    (max_staleness + version + 1) * batch_size - (accepted + running) > 0

where ``version`` is the trainer's policy version, ``batch_size`` the units the trainer consumes
per version (groups, or tokens for a token budget), ``running`` the units reserved by held tickets
(1 per ticket, or its reserved tokens) and ``accepted`` the units of rollouts that finished and
were kept. A trainer that consumes ``batch_size`` units per version, oldest first, then never sees
one more than ``max_staleness`` versions behind the version it started under
(:class:`~replaystore.online.RolloutBuffer` adds the one missing piece: a sample waits for a
running rollout that would otherwise go stale).

Overshoot credit (token budgets): a trainer that takes whole groups until their tokens reach
``batch_size`` takes more than ``batch_size`` units per version. Without a credit the limit grows by
``batch_size`` per version while the trainer consumes more, the units held plus the capacity
shrink, and both sides end up waiting for each other (the buffer holds fewer units than a sample
wants, the capacity is less than a reservation). :meth:`credit` adds the overshoot to the limit,
``limit = (max_staleness + version + 1) * batch_size + credited``, so the limit stays
``(max_staleness + 1) * batch_size`` ahead of what the trainer consumed; the staleness bound still
holds when the trainer asks for at least ``batch_size`` units per version, oldest first (a unit
admitted at version ``v`` lies within the first ``(max_staleness + 1) * batch_size`` units after
what was consumed before ``v``, and by the end of version ``v + max_staleness`` the trainer has
consumed at least that many more).

Each ticket is held until it is finished (:meth:`StalenessBudget.finish`: accepted, or rejected),
abandoned or cancelled. A ticket acquired with a time-to-live is abandoned once its holder has not
renewed it for that long (a producer that died gives its permissions back); expiry is judged by the
clock at every call, so an expired ticket is never renewed, finished or reported held. Accepted
rollouts that leave untrained (dropped, evicted, rejected after scoring) are given back with
:meth:`discard`.

Over-provisioning: ``acquire(k, overprovision=m)`` grants ``k + m`` tickets (all charged to the
budget) as one batch; once ``k`` of them are finished accepted, the others are cancelled (their
capacity comes back; their producers learn it from :class:`~replaystore.TicketCancelled`).
:meth:`cancel_slowest` cancels the longest-running tickets on demand. :meth:`pause` stops
admission (evaluation, checkpoints) until :meth:`resume`.

Thread-safe: one lock; :meth:`acquire` waits on a condition and is woken by every change that can
raise the capacity (a version, a finish, an abandon, an expiry, a cancel, a discard, a resume).
The state is a JSON-able dict (:meth:`state` / :meth:`load_state`) so a service can journal it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import Closed, InvalidRequest, OverReservation, TicketCancelled, Timeout, WouldDeadlock
from .tickets import VERSION, WEIGHT, Ticket, TicketBook, ticket_ids
from .versions import check_int

_COUNTERS = (
    "acquired",
    "accepted_total",
    "rejected",
    "abandoned",
    "expired",
    "discarded",
    "cancelled",
    "overprovisioned",
    "acquire_calls",
    "acquire_timeouts",
)
TRAINER_WAITS = (None, "fifo", "in_order")


class StalenessBudget:
    """AReaL's staleness admission control as a reusable object (see the module doc).

    Args:
        batch_size: units the trainer consumes per policy version (``>= 1``): groups, or tokens.
        max_staleness: versions a rollout may lag behind the trainer when it is trained (``>= 0``).
        max_running: at most this many tickets held at once (``None``: no limit besides the budget).
        ttl: seconds a ticket stays valid without :meth:`renew` (``None``: forever). Expired
            tickets are abandoned and their capacity comes back.
        version: the initial policy version.
        clock: wall-clock function for ticket deadlines (``time.time``; deadlines survive restarts).
        weight: units a ticket reserves by default (1 for a group budget; the most tokens a group
            can produce for a token budget). ``acquire(weight=...)`` overrides it.
        trainer_waits: ``"fifo"`` or ``"in_order"`` when the trainer waits for running groups (the
            buffer's pick); used to refuse an acquire that would deadlock (:class:`WouldDeadlock`).

    Raises:
        InvalidRequest: a non-integer or out-of-range argument.
    """

    def __init__(
        self,
        batch_size: int,
        max_staleness: int,
        max_running: int | None = None,
        ttl: float | None = None,
        version: int = 0,
        clock: Callable[[], float] = time.time,
        weight: int = 1,
        trainer_waits: str | None = None,
    ) -> None:
        self.batch_size = check_int(batch_size, "batch_size", 1)
        self.max_staleness = check_int(max_staleness, "max_staleness", 0)
        self.max_running = None if max_running is None else check_int(max_running, "max_running", 1)
        if ttl is not None and not ttl > 0:
            raise InvalidRequest(f"ttl must be > 0 seconds or None, got {ttl!r}")
        self.ttl = None if ttl is None else float(ttl)
        self.version = check_int(version, "version")
        self.weight = check_int(weight, "weight", 1)
        if trainer_waits not in TRAINER_WAITS:
            raise InvalidRequest(f"trainer_waits must be one of {TRAINER_WAITS}, got {trainer_waits!r}")
        self.trainer_waits = trainer_waits
        self._clock = clock
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self.paused = False
        self.accepted = 0  # units accepted and not discarded (AReaL's ``accepted``)
        self.credited = 0  # units samples took beyond what they asked for (see credit())
        self._book = TicketBook()
        self._no_expiry_before = float("-inf")  # a lower bound of the held tickets' deadlines
        self._expired_unclaimed: list[int] = []
        self._cancelled_unclaimed: list[int] = []
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self.wait_s = 0.0  # total seconds producers waited in acquire
        self._window_wait: list[float] = []  # per-acquire waits since the last take_waits()

    # -- queries ----------------------------------------------------------------------------------
    @property
    def running(self) -> int:
        """Tickets held now."""
        return len(self._book)

    @property
    def running_units(self) -> int:
        """Units reserved by the tickets held now (``running`` for a group budget)."""
        return self._book.weight

    def limit(self) -> int:
        """The budget's total: ``(max_staleness + version + 1) * batch_size + credited``."""
        return (self.max_staleness + self.version + 1) * self.batch_size + self.credited

    def _capacity(self) -> int:
        cap = self.limit() - (self.accepted + self._book.weight)
        if self.max_running is not None:
            cap = min(cap, (self.max_running - len(self._book)) * self.weight)
        return cap

    def _grantable(self, k: int, w: int) -> bool:
        if self.paused or self.limit() - (self.accepted + self._book.weight) < k * w:
            return False
        return self.max_running is None or len(self._book) + k <= self.max_running

    def capacity(self) -> int:
        """Units that could be reserved now (tickets, for a group budget); may be negative."""
        with self._lock:
            self._expire(self._clock())
            return self._capacity()

    def held(self, ticket: int) -> bool:
        """Whether ``ticket`` is held (acquired, not finished, abandoned, cancelled or expired by now)."""
        with self._lock:
            self._expire(self._clock())
            return ticket in self._book

    def version_of(self, ticket: int) -> int:
        """The policy version under which ``ticket`` was admitted.

        Raises:
            UnknownTicket: not held (:class:`TicketCancelled` if it was cancelled).
        """
        with self._lock:
            self._expire(self._clock())
            self._check_held([ticket])
            return self._book.records[int(ticket)][VERSION]

    def weight_of(self, ticket: int) -> int:
        """The units ``ticket`` reserved (its tokens, for a token budget).

        Raises:
            UnknownTicket: not held (:class:`TicketCancelled` if it was cancelled).
        """
        with self._lock:
            self._expire(self._clock())
            self._check_held([ticket])
            return self._book.records[int(ticket)][WEIGHT]

    def require_held(self, tickets: Any) -> list[int]:
        """The ids of ``tickets`` (one or a list) if every one is held now (expiry judged by the clock).

        Raises:
            UnknownTicket: one is not held (:class:`TicketCancelled` if it was cancelled).
            InvalidRequest: not ticket ids, or duplicates.
        """
        with self._lock:
            self._expire(self._clock())
            ids = ticket_ids(tickets)
            self._check_held(ids)
            return ids

    def oldest_running_version(self) -> int | None:
        """The admission version of the oldest ticket held, or ``None`` when none is."""
        with self._lock:
            self._expire(self._clock())
            return self._book.oldest_version()

    def oldest_running_id(self) -> int | None:
        """The smallest (oldest) ticket id held, or ``None`` when none is."""
        with self._lock:
            self._expire(self._clock())
            return self._book.oldest_id()

    def _max_units(self) -> int:
        return (self.max_staleness + 1) * self.batch_size

    def _check_request(self, k: Any, weight: Any, overprovision: Any) -> tuple[int, int, int]:
        k = check_int(k, "number of tickets", 1)
        w = self.weight if weight is None else check_int(weight, "ticket weight", 1)
        m = check_int(overprovision, "overprovision", 0)
        if (k + m) * w > self._max_units() or (self.max_running is not None and k + m > self.max_running):
            raise InvalidRequest(
                f"{k + m} tickets of {w} units can never be granted at once: the budget admits "
                f"at most {self._max_units()} units ((max_staleness + 1) * batch_size)"
                f"{'' if self.max_running is None else f' and {self.max_running} tickets'}"
            )
        return k, w, m

    def _check_held(self, ids: list[int]) -> None:
        gone = [t for t in ids if self._book.was_cancelled(t)]
        if gone:
            raise TicketCancelled(f"tickets {gone[:5]!r} were cancelled (over-provisioning): stop generating")
        self._book.check_held(ids)

    def _refuse_deadlock(self, holder: str | None, k: int, w: int) -> None:
        """:class:`WouldDeadlock` if the request is not grantable now and never will be while its holder waits."""
        if not self._grantable(k, w):
            why = self._deadlock(holder, k, w)
            if why is not None:
                raise WouldDeadlock(why)

    def _deadlock(self, holder: str | None, k: int, w: int) -> str | None:
        """Why ``holder``'s request can never be granted while it holds its tickets, or ``None``."""
        return self._book.deadlock(
            holder, k, w, self._max_units(), self.max_running, self.trainer_waits, self.version - self.max_staleness
        )

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
                ever grant at once. WouldDeadlock: see :meth:`acquire`. Closed.
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
            UnknownTicket: some ticket is not held (nothing changed). InvalidRequest: a ticket that
                is not an integer id (``finish([t, "x"])``), duplicates, bad ``units``.
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
            UnknownTicket: some ticket is not held (nothing changed). InvalidRequest: a ticket that
                is not an integer id, duplicates.
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

    def discard(self, n: int) -> None:
        """``n`` accepted units left without being trained on (dropped, evicted, rejected): give them back.

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

    def credit(self, n: int) -> None:
        """Raise the limit by ``n`` units the trainer consumed beyond what it asked for (a sample's overshoot).

        A token sample takes whole groups until their tokens reach the target, so it may take more;
        crediting that overshoot keeps the budget from stalling (see the module doc). Wakes waiting
        producers.

        Raises:
            InvalidRequest: ``n`` is not an integer ``>= 0`` (nothing changed).
        """
        with self._lock:
            n = check_int(n, "credited units")
            self.credited += n
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

    def pause(self) -> None:
        """Stop admitting (waiting acquires wait on; ``try_acquire`` returns ``[]``) until :meth:`resume`.

        Raises:
            InvalidRequest: already paused (nothing changed).
        """
        with self._lock:
            if self.paused:
                raise InvalidRequest("admission is already paused")
            self.paused = True

    def resume(self) -> None:
        """Admit again after :meth:`pause`; wakes waiting producers.

        Raises:
            InvalidRequest: not paused (nothing changed).
        """
        with self._lock:
            if not self.paused:
                raise InvalidRequest("admission is not paused")
            self.paused = False
            self._cond.notify_all()

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
        """Counters and gauges: version, running, accepted, capacity, limit, wait seconds, paused, ..."""
        with self._lock:
            self._expire(self._clock())
            return {
                **self.counters,
                "version": self.version,
                "running": len(self._book),
                "running_units": self._book.weight,
                "accepted": self.accepted,
                "capacity": self._capacity(),
                "limit": self.limit(),
                "credited": self.credited,
                "producer_wait_s": self.wait_s,
                "paused": self.paused,
            }

    def _scalars(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "accepted": self.accepted,
            "credited": self.credited,
            "counters": dict(self.counters),
            "wait_s": self.wait_s,
            "paused": self.paused,
        }

    def state(self) -> dict[str, Any]:
        """JSON-able state (tickets with their deadlines, counters, version, batches) for a journal."""
        with self._lock:
            return {**self._scalars(), **self._book.state()}

    def track_changes(self) -> None:
        """Start recording which tickets change, for :meth:`journal` (off by default: nothing kept)."""
        with self._lock:
            self._book.tracking = True

    def journal(self) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        """``(scalars, puts, deletes)``: the state without its tickets, and the changed ticket records.

        The scalars are O(1) in size; the records are those of the tickets and batches changed since
        the last call (:meth:`track_changes` first). :meth:`load_journal` restores the scalars with
        every record put and not deleted since.
        """
        with self._lock:
            puts, deletes = self._book.take_changes()
            return {**self._scalars(), **self._book.scalars(), "records": True}, puts, deletes

    def load_journal(self, scalars: dict[str, Any], records: dict[str, Any]) -> None:
        """Restore :meth:`journal` output: its scalars and the live records (``t/...``, ``tb/...``, ``tc``).

        Raises:
            ValueError, KeyError, TypeError: a field or record that :meth:`journal` does not write.
        """
        with self._lock:
            self._book.load_records(scalars, records)
            self._load_scalars(scalars)

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state` output (a restarted service). Tickets keep their deadlines."""
        with self._lock:
            self._book.load_state(state)
            self._load_scalars(state)

    def _load_scalars(self, state: dict[str, Any]) -> None:  # lock held
        self.version = int(state["version"])
        self.accepted = int(state["accepted"])
        self.credited = int(state.get("credited", 0))  # journals written before the credit have none
        self._no_expiry_before = float("-inf")
        self.counters.update(state["counters"])
        self.wait_s = float(state["wait_s"])
        self.paused = bool(state.get("paused", False))
        self._cond.notify_all()

    def __repr__(self) -> str:
        return (
            f"StalenessBudget(batch_size={self.batch_size}, max_staleness={self.max_staleness}, "
            f"version={self.version}, running={len(self._book)}, accepted={self.accepted})"
        )


__all__ = ["TRAINER_WAITS", "StalenessBudget"]
