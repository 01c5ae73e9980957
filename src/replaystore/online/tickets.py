"""Tickets: what a producer holds while it generates a rollout (or a group), and the book of them.

- :class:`Ticket`: the id a producer gets from ``acquire`` (an ``int`` carrying its admission version);
- :func:`ticket_ids`: the ids of a ticket argument: a list of tickets, or one bare ticket (the easy
  slip ``finish(t)`` for ``finish([t])`` is accepted, not an error).
- :class:`TicketBook`: the held tickets with their admission version, holder, deadline, weight
  (budget units: 1 per group, or reserved tokens), grant time and over-provisioning batch; the open
  batches (how many of each are needed, how many were accepted) and the recently cancelled ids.
  Plain bookkeeping: not thread-safe, the owning :class:`~replaystore.online.StalenessBudget` locks.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

from ..errors import InvalidRequest, UnknownTicket

# record fields, by position (a list, so the state stays JSON-able)
VERSION, HOLDER, DEADLINE, WEIGHT, GRANTED, BATCH = range(6)
REMEMBER_CANCELLED = 1024  # cancelled ids kept to answer late calls with TicketCancelled


class Ticket(int):
    """A ticket id (an ``int``: the group id) that also carries its admission :attr:`version`.

    ``Ticket(7, version=3) == 7``; it hashes and sorts as ``7``, so it can be used wherever an id
    is expected (``add(x, group=t)``, dict keys, ``finish([t])``).
    """

    version: int

    def __new__(cls, tid: int, version: int) -> "Ticket":  # noqa: D102
        obj = int.__new__(cls, tid)
        obj.version = int(version)
        return obj

    def __reduce__(self) -> tuple:
        return (Ticket, (int(self), self.version))

    def __repr__(self) -> str:
        return f"Ticket({int(self)}, version={self.version})"


def _is_id(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def ticket_ids(tickets: Any) -> list[int]:
    """The ticket ids of ``tickets``: an iterable of tickets, or one bare ticket.

    Raises:
        InvalidRequest: an element (or the argument) is not an integer ticket id; duplicates.
    """
    if _is_id(tickets):
        return [int(tickets)]
    if isinstance(tickets, (str, bytes)) or not isinstance(tickets, Iterable):
        raise InvalidRequest(f"tickets must be a ticket or a list of tickets from acquire(), got {tickets!r}")
    ids = list(tickets)
    bad = [t for t in ids if not _is_id(t)]
    if bad:
        raise InvalidRequest(f"tickets must be integer ids from acquire(), got {bad[:3]!r}")
    ids = [int(t) for t in ids]
    if len(set(ids)) != len(ids):
        raise InvalidRequest(f"duplicate tickets in {ids!r}")
    return ids


class TicketBook:
    """The held tickets (see the module doc). Not thread-safe."""

    def __init__(self) -> None:
        self.records: dict[int, list] = {}  # id -> [version, holder, deadline, weight, granted, batch]
        self.next_id = 0
        self.weight = 0  # sum of the held tickets' weights
        self.batches: dict[int, list[int]] = {}  # over-provisioning batch -> [needed, accepted]
        self.next_batch = 0
        self.cancelled: dict[int, None] = {}  # recently cancelled ids (ordered, bounded)
        self.tracking = False  # record what changed for a journal (take_changes); off: nothing kept
        self._dirty: set[str] = set()  # journal keys whose record changed or went, since take_changes

    def _touch(self, ids: Iterable[int], batches: Iterable[int | None] = (), cancelled: bool = False) -> None:
        if self.tracking:
            self._dirty.update(map(ticket_key, ids))
            self._dirty.update(f"tb/{b:020d}" for b in batches if b is not None)
            if cancelled:
                self._dirty.add("tc")

    def __len__(self) -> int:
        return len(self.records)

    def __contains__(self, tid: object) -> bool:
        return tid in self.records

    def grant(
        self,
        k: int,
        version: int,
        holder: str | None,
        deadline: float | None,
        weight: int,
        now: float,
        need: int | None = None,
    ) -> list[Ticket]:
        """``k`` new tickets; with ``need``, an over-provisioned batch of which ``need`` are wanted."""
        batch = None
        if need is not None:
            batch, self.next_batch = self.next_batch, self.next_batch + 1
            self.batches[batch] = [need, 0]
        out = [Ticket(i, version) for i in range(self.next_id, self.next_id + k)]
        self.next_id += k
        for t in out:
            self.records[int(t)] = [version, holder, deadline, weight, now, batch]
        self.weight += k * weight
        self._touch(range(self.next_id - k, self.next_id), (batch,))
        return out

    def check_held(self, ids: list[int]) -> None:
        """:class:`UnknownTicket` unless every id is held."""
        missing = [t for t in ids if t not in self.records]
        if missing:
            raise UnknownTicket(
                f"tickets {missing[:5]!r} are not held (never acquired, already finished or abandoned, or expired)"
            )

    def pop(self, ids: Iterable[int]) -> list[list]:
        """Remove held tickets (a batch left without tickets is closed); their records."""
        ids = list(ids)
        out = [self.records.pop(i) for i in ids]
        self.weight -= sum(r[WEIGHT] for r in out)
        gone = {r[BATCH] for r in out} - {None}
        for b in gone:
            if b in self.batches and not self.of_batch(b):
                del self.batches[b]
        self._touch(ids, gone)
        return out

    def full_batches(self, accepted: list[list]) -> list[int]:
        """Count accepted tickets (popped records) in their batches; the held ids of batches now full."""
        out: list[int] = []
        for r in accepted:
            b = self.batches.get(r[BATCH]) if r[BATCH] is not None else None
            if b is not None:
                b[1] += 1
                self._touch((), (r[BATCH],))
                if b[1] >= b[0]:
                    del self.batches[r[BATCH]]
                    out += self.of_batch(r[BATCH])
        return out

    def cancel(self, ids: list[int]) -> None:
        """Remove held tickets and remember them as cancelled (the last ``REMEMBER_CANCELLED``)."""
        self.pop(ids)
        for i in ids:
            self.cancelled[i] = None
        while len(self.cancelled) > REMEMBER_CANCELLED:
            del self.cancelled[next(iter(self.cancelled))]
        self._touch((), (), cancelled=bool(ids))

    def was_cancelled(self, tid: int) -> bool:
        """Whether ``tid`` was cancelled recently (and is not held)."""
        return tid in self.cancelled and tid not in self.records

    def renew(self, ids: Iterable[int], deadline: float) -> None:
        """Set the deadline of held tickets."""
        ids = list(ids)
        for i in ids:
            self.records[i][DEADLINE] = deadline
        self._touch(ids)

    def expired(self, now: float) -> list[int]:
        """Held ids whose deadline has passed (``deadline <= now``), oldest first."""
        return [i for i, r in self.records.items() if r[DEADLINE] is not None and r[DEADLINE] <= now]

    def next_deadline(self) -> float | None:
        """The earliest deadline of a held ticket."""
        return min((r[DEADLINE] for r in self.records.values() if r[DEADLINE] is not None), default=None)

    def oldest_version(self) -> int | None:
        """The admission version of the oldest held ticket."""
        return min((r[VERSION] for r in self.records.values()), default=None)

    def oldest_id(self) -> int | None:
        """The smallest held id."""
        return min(self.records, default=None)

    def of_batch(self, batch: int) -> list[int]:
        """Held ids of an over-provisioning batch."""
        return [i for i, r in self.records.items() if r[BATCH] == batch]

    def longest_running(self, n: int, holder: str | None = None) -> list[int]:
        """Up to ``n`` held ids, longest running first (grant time, then id)."""
        cand = [(r[GRANTED], i) for i, r in self.records.items() if holder is None or r[HOLDER] == holder]
        return [i for _, i in sorted(cand)[:n]]

    def deadlock(
        self,
        holder: str | None,
        k: int,
        w: int,
        max_units: int,
        max_running: int | None,
        trainer_waits: str | None,
        last_version: int,
    ) -> str | None:
        """Why ``holder``'s request can never be granted while it holds its tickets, or ``None``.

        ``k`` tickets of ``w`` units: with the holder's, more than a budget admits at once; or the
        trainer waits (pick ``trainer_waits``) for one of the holder's: admitted at ``last_version``
        or earlier (``fifo``), or the oldest held (``in_order``).
        """
        mine = [i for i, r in self.records.items() if r[HOLDER] == holder] if holder is not None else []
        if not mine:
            return None
        units = sum(self.records[i][WEIGHT] for i in mine)
        if units + k * w > max_units or (max_running is not None and len(mine) + k > max_running):
            return (
                f"holder {holder!r} holds {len(mine)} tickets and asks for {k} more: together more than the "
                f"budget ever admits at once; acquire everything you need in one call"
            )
        if trainer_waits == "fifo":
            waited = [i for i in mine if self.records[i][VERSION] <= last_version]
        elif trainer_waits == "in_order":
            waited = [i for i in mine if i == self.oldest_id()]
        else:
            waited = []
        if waited:
            return (
                f"holder {holder!r} holds ticket {waited[0]} that the trainer waits for (pick "
                f"{trainer_waits!r}), while it waits for {k} more that only the trainer's next version "
                f"would admit: finish or abandon it first, or acquire everything at once"
            )
        return None

    def state(self) -> dict[str, Any]:
        """JSON-able records."""
        return {
            "next_id": self.next_id,
            "tickets": {str(i): list(r) for i, r in self.records.items()},
            "batches": {str(b): list(v) for b, v in self.batches.items()},
            "next_batch": self.next_batch,
            "cancelled": list(self.cancelled),
        }

    # -- journal records: one per ticket and per open batch, so a write is O(what changed) -----------------
    def scalars(self) -> dict[str, Any]:
        """The book's counters, without its records (see :meth:`take_changes`)."""
        return {"next_id": self.next_id, "next_batch": self.next_batch}

    def take_changes(self) -> tuple[dict[str, Any], list[str]]:
        """``(puts, deletes)``: journal records of what changed since the last call (``tracking`` on).

        Keys: ``t/<id>`` a held ticket's record, ``tb/<batch>`` an open batch, ``tc`` the recently
        cancelled ids (bounded). A ticket or batch that went is a delete.
        """
        records = {k: self._record(k) for k in self._dirty}
        self._dirty = set()
        return {k: r for k, r in records.items() if r is not None}, [k for k, r in records.items() if r is None]

    def _record(self, key: str) -> list | None:
        """The journal record under ``key`` now (``None``: the ticket or batch went)."""
        if key == "tc":
            return list(self.cancelled)
        r = (self.records if key.startswith("t/") else self.batches).get(int(key.partition("/")[2]))
        return None if r is None else list(r)

    def touch_all(self) -> None:
        """Mark every record changed (the next :meth:`take_changes` writes them all)."""
        self._touch(self.records, self.batches, cancelled=True)

    def load_records(self, scalars: dict[str, Any], records: dict[str, Any]) -> None:
        """Restore from :meth:`scalars` and the journal records of :meth:`take_changes` (untrusted).

        Raises:
            ValueError: a record is not what :meth:`take_changes` writes.
        """
        state: dict[str, Any] = {**scalars, "tickets": {}, "batches": {}, "cancelled": records.get("tc", [])}
        for k, v in records.items():
            if k.startswith("t/"):
                state["tickets"][int(k[2:])] = _check_record(v)
            elif k.startswith("tb/"):
                if not (isinstance(v, list) and len(v) == 2 and all(type(x) is int and x >= 0 for x in v)):
                    raise ValueError(f"journal record {k!r} is not a batch [needed, accepted]: {v!r}")
                state["batches"][int(k[3:])] = v
        if not all(type(i) is int for i in state["cancelled"]):
            raise ValueError("journal record 'tc' is not a list of ticket ids")
        self.load_state(state)
        self._dirty = set()  # as journaled
        if any(i >= self.next_id for i in self.records):
            raise ValueError(f"a journaled ticket id is not below next_id {self.next_id}")

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state` (records of older journals, ``[version, holder, deadline]``, are padded)."""
        self.next_id = int(state["next_id"])
        self.records = {}
        for i, r in state["tickets"].items():
            r = list(r)
            if len(r) < 6:
                r += [1, r[DEADLINE] or 0.0, None][len(r) - 3 :]
            self.records[int(i)] = r
        self.weight = sum(r[WEIGHT] for r in self.records.values())
        self.batches = {int(b): list(v) for b, v in state.get("batches", {}).items()}
        self.next_batch = int(state.get("next_batch", 0))
        self.cancelled = dict.fromkeys(int(i) for i in state.get("cancelled", ()))
        if self.tracking:  # everything loaded is new to the journal (a journal of the older format)
            self.touch_all()


def ticket_key(tid: int) -> str:
    """The journal key of a held ticket's record."""
    return f"t/{tid:020d}"


def _check_record(r: Any) -> list:
    """A journaled ticket record, checked field by field (read from disk: untrusted)."""
    if not isinstance(r, list) or len(r) != 6:
        raise ValueError(f"a journaled ticket record is not a list of 6 fields: {r!r}")
    version, holder, deadline, weight, granted, batch = r
    ok = (
        type(version) is int
        and (holder is None or isinstance(holder, str))
        and (deadline is None or isinstance(deadline, float))
        and type(weight) is int
        and weight >= 1
        and isinstance(granted, (int, float))
        and (batch is None or (type(batch) is int and batch >= 0))
    )
    if not ok:
        raise ValueError(f"a journaled ticket record has a field of the wrong type or range: {r!r}")
    return r


__all__ = ["Ticket", "TicketBook", "ticket_ids", "ticket_key"]
