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
``batch_size`` takes more than ``batch_size`` units per version; :meth:`credit` adds that overshoot
to the limit, ``limit = (max_staleness + version + 1) * batch_size + credited``, so producers and
trainer do not end up waiting for each other. Why the staleness bound still holds: docs/online.md,
"The large-model workflow", token budgets.

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
Granting and ending tickets live in :mod:`~replaystore.online.budget_tickets`; this module keeps
the limit, the version, admission's switches and the state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import Closed, InvalidRequest, TicketCancelled, WouldDeadlock
from .budget_tickets import BudgetTickets
from .tickets import VERSION, WEIGHT, TicketBook, ticket_ids
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


class StalenessBudget(BudgetTickets):
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
        if self._grantable(k, w):
            return
        last = self.version - self.max_staleness
        why = self._book.deadlock(holder, k, w, self._max_units(), self.max_running, self.trainer_waits, last)
        if why is not None:
            raise WouldDeadlock(why)

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

        Why: the module doc, overshoot credit. Wakes waiting producers.

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
