"""The producer side of :class:`~replaystore.online.RolloutBuffer`: tickets, writes, rejects, admission.

A part of the ``RolloutBuffer`` class (its state lives in :mod:`.buffer`): acquiring tickets
(with over-provisioning and token reservations), renewing, abandoning and finishing them, writing
rollouts one at a time (:meth:`ProducerCalls.add`) or a whole group at once
(:meth:`ProducerCalls.add_group`: one call, one journal transaction, idempotent by member index),
rejecting a group after scoring (DAPO's dynamic sampling), cancelling the slowest tickets and
pausing admission.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import AlreadySampled, InvalidRequest, OverReservation, UnknownTicket
from .groups import Group, Rollout
from .tickets import Ticket, ticket_ids
from .versions import VersionRange, check_int

if TYPE_CHECKING:
    from .budget import StalenessBudget


class ProducerCalls:
    """Producer-side methods of :class:`~replaystore.online.RolloutBuffer` (thread-safe, validated first)."""

    budget: StalenessBudget | None

    def _need_budget(self) -> StalenessBudget:
        if self.budget is None:
            raise InvalidRequest(f"rollout buffer {self.name!r} does not pace producers (pacing=False)")
        return self.budget

    @contextlib.contextmanager
    def _paced(self, check_open: bool = False, expire: bool = True) -> Iterator[StalenessBudget]:
        """The budget, under the lock (expiry judged first); what the block changed is journaled if it returns."""
        budget = self._need_budget()
        with self._lock:
            if check_open:
                self._check_open()
            if expire:
                self._expire(self._clock())
            yield budget
            self._commit()

    # -- tickets ------------------------------------------------------------------------------------------
    def acquire(
        self,
        k: int = 1,
        timeout: float | None = None,
        holder: str | None = None,
        overprovision: int = 0,
        tokens: int | None = None,
    ) -> list[Ticket]:
        """``k`` tickets (group ids: one per group to start) from the budget, waiting while it is spent.

        Same as :meth:`StalenessBudget.acquire` (its arguments, the :class:`~replaystore.online.Ticket`
        ids it returns, its errors), with ``tokens`` for its ``weight``: with a token budget, the
        tokens each ticket reserves (default ``group_tokens``). The tickets an over-provisioned batch
        cancels have their pending groups dropped (counted ``cancelled``).

        Raises:
            InvalidRequest: no pacing, or bad arguments.
            Closed: the buffer is closed.
        """
        with self._paced(check_open=True) as budget:
            pass  # (the budget waits without the buffer's lock)
        tickets = budget.acquire(k, timeout=timeout, holder=holder, overprovision=overprovision, weight=tokens)
        with self._paced():  # drops the groups of tickets that expired meanwhile; journals the new tickets
            return tickets

    def try_acquire(
        self, k: int = 1, holder: str | None = None, overprovision: int = 0, tokens: int | None = None
    ) -> list[Ticket]:
        """Like :meth:`acquire` but never waits: the tickets if the budget allows them now, else ``[]``."""
        with self._paced(check_open=True) as budget:
            return budget.try_acquire(k, holder=holder, overprovision=overprovision, weight=tokens)

    def held(self, ticket: int) -> bool:
        """Whether ``ticket`` is held now (expiry judged by the clock)."""
        return self._need_budget().held(ticket)

    def version_of(self, ticket: int) -> int:
        """The policy version under which ``ticket`` was admitted.

        A :class:`~replaystore.online.Ticket` carries it (answered even after the ticket ended); a
        bare id is looked up among the held tickets.

        Raises:
            UnknownTicket: a bare id that is not held.
        """
        if isinstance(ticket, Ticket):
            return ticket.version
        return self._need_budget().version_of(ticket)

    def renew(self, tickets: Any) -> None:
        """Restart the time-to-live of held tickets (one ticket or a list).

        Raises:
            UnknownTicket: a ticket is not held, expired by now included (:class:`TicketCancelled`
                if cancelled); nothing changed.
            InvalidRequest: a ticket that is not an integer id, duplicates (nothing changed).
        """
        with self._paced() as budget:
            budget.renew(tickets)

    def abandon(self, tickets: Any) -> None:
        """Give tickets back (one or a list); their pending groups are dropped (counted ``abandoned``).

        Raises:
            UnknownTicket: an integer ticket id that is not held (nothing changed).
            InvalidRequest: a ticket that is not an integer id, duplicates (nothing changed).
        """
        with self._paced() as budget:
            ids = ticket_ids(tickets)
            budget.abandon(ids)
            for t in ids:
                g = self._pending.get(t)
                if g is not None:
                    self._drop_pending(g, "abandoned")
            self._cond.notify_all()

    def finish(self, tickets: Any, accepted: bool = True) -> None:
        """End tickets whose rollouts are kept elsewhere (budget-only use, e.g. the fragment buffer).

        A ticket used as a group id in this buffer is finished by its group instead.

        Raises:
            UnknownTicket: an integer ticket id that is not held (nothing changed).
            InvalidRequest: a ticket that is not an integer id (``finish([t, "x"])``), duplicates,
                or a ticket with a pending group here (nothing changed).
        """
        with self._paced() as budget:
            ids = ticket_ids(tickets)
            busy = [t for t in ids if t in self._pending]
            if busy:
                raise InvalidRequest(
                    f"tickets {busy[:5]!r} have pending groups in {self.name!r}: their groups finish them"
                )
            self._settle(budget.finish(ids, accepted=accepted))
            self._cond.notify_all()

    def discard(self, n: int) -> None:
        """``n`` accepted rollouts (tokens, for a token budget) kept elsewhere left untrained: give them back."""
        with self._paced(expire=False) as budget:
            budget.discard(n)

    def cancel_slowest(self, n: int, holder: str | None = None) -> list[int]:
        """Same as :meth:`StalenessBudget.cancel_slowest` (the cancelled ids); pending groups dropped (``cancelled``).

        Raises:
            InvalidRequest: ``n`` is not an integer ``>= 0``; no pacing.
        """
        with self._paced(check_open=True) as budget:
            ids = budget.cancel_slowest(n, holder=holder)
            self._settle(ids)
            return ids

    def pause(self) -> None:
        """Same as :meth:`StalenessBudget.pause`; running groups go on (``InvalidRequest`` also without pacing)."""
        with self._paced(check_open=True, expire=False) as budget:
            budget.pause()

    def resume(self) -> None:
        """Same as :meth:`StalenessBudget.resume` (``InvalidRequest`` also without pacing)."""
        with self._paced(check_open=True, expire=False) as budget:
            budget.resume()

    # -- writes -----------------------------------------------------------------------------------------------
    def add(
        self,
        data: Any,
        group: Hashable | None = None,
        versions: Any = None,
        length: int | None = None,
        group_size: int | None = None,
        index: int | None = None,
    ) -> str:
        """Add one rollout to its group.

        Args:
            data: the payload (any object).
            group: the group id; with pacing, the ticket from :meth:`acquire`. ``None`` (without
                pacing, groups of one): a new group.
            versions: the policy versions that produced it: an int, ``(min, max)`` or a
                :class:`VersionRange` (default: the current version).
            length: its length for the length histograms and token budgets (default ``len(data)``, else 1).
            group_size: the group's size (default: the buffer's ``group_size``); fixed by the
                group's first member.
            index: the member's index in its group (``0 <= index < size``). With it the write is
                idempotent: a member index already received (or a group already completed) is not
                added again, and the call returns the group's status.

        Returns:
            ``"pending"`` (the group waits for more members), ``"complete"`` (the group completed and
            can be sampled), or ``"stale"`` (the group completed but was dropped as stale).

        Raises:
            InvalidRequest: bad versions (``min > max``, negative, not integers), length, size or
                index, a size different from the group's, more members than its size.
            UnknownTicket: with pacing, ``group`` is not a held ticket (never acquired, expired by
                now, ...; :class:`TicketCancelled` if cancelled).
            OverReservation: with a token budget, the group's tokens (the sum of its lengths) would
                exceed what its ticket reserved.
            Closed: the buffer was closed.
        """
        return self._write(
            group,
            [data],
            versions,
            None if length is None else [length],
            group_size,
            None if index is None else [index],
            whole=False,
        )

    def add_group(
        self,
        group: Hashable,
        completions: Sequence[Any],
        versions: Any = None,
        lengths: Sequence[int] | None = None,
        group_size: int | None = None,
        indices: Sequence[int] | None = None,
        member_versions: Sequence[Any] | None = None,
    ) -> str:
        """Add a whole group (or, with ``indices``, several members) in one call and one journal write.

        Idempotent by (group, member index): a retried call (a service restarted before it replied)
        adds nothing twice and returns the group's status.

        Args:
            group: the ticket from :meth:`acquire` (with pacing), or any group id.
            completions: the members' payloads, in member order.
            versions: one version range for every member (int, ``(min, max)`` or :class:`VersionRange`;
                default: the current version); or ``member_versions``: one range per member.
            lengths: per member, its length (default ``len(payload)``).
            group_size: the group's size (default: the buffer's ``group_size``).
            indices: the members' indices (default ``0, 1, ..., size - 1``: the whole group).
            member_versions: per member, its version range (instead of ``versions``).

        Returns:
            ``"pending"``, ``"complete"`` or ``"stale"`` (see :meth:`add`).

        Raises:
            InvalidRequest: without ``indices``, a number of completions other than the group's
                size; an index twice, out of range; lengths or ranges not one per member; the
                errors of :meth:`add` (nothing changed).
            UnknownTicket: with pacing, ``group`` is not a held ticket (nothing changed).
            OverReservation: with a token budget, more tokens than the ticket reserved (nothing
                changed).
            Closed: the buffer is closed (nothing changed).
        """
        if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
            raise InvalidRequest(f"completions must be a list of payloads, got {type(completions).__name__}")
        n = len(completions)
        if member_versions is not None and versions is not None:
            raise InvalidRequest("give versions (one range for the group) or member_versions, not both")
        for what, per_member in (("member_versions", member_versions), ("lengths", lengths), ("indices", indices)):
            if per_member is not None and len(per_member) != n:
                raise InvalidRequest(f"{len(per_member)} {what} for {n} completions")
        vs = versions if member_versions is None else list(member_versions)
        idx = list(range(n)) if indices is None else list(indices)
        return self._write(
            group,
            list(completions),
            vs,
            lengths,
            group_size,
            idx,
            whole=indices is None,
            per_member=member_versions is not None,
        )

    def _check_members(
        self, datas: list, versions: Any, lengths: Any, indices: list | None, per_member: bool
    ) -> tuple[list, list, list | None]:
        n = len(datas)
        if per_member:
            rngs = [VersionRange.of(self.version if v is None else v) for v in versions]
        else:
            rngs = [VersionRange.of(self.version if versions is None else versions)] * n
        lens = []
        for i, d in enumerate(datas):
            ln = lengths[i] if lengths is not None else (len(d) if hasattr(d, "__len__") else 1)
            lens.append(check_int(ln, "length"))
        if indices is not None:
            indices = [check_int(i, "member index") for i in indices]
            if len(set(indices)) != len(indices):
                dup = next(i for i in indices if indices.count(i) > 1)
                raise InvalidRequest(f"member index {dup} appears twice in one write")
        return rngs, lens, indices

    def _group_key(self, group: Any) -> Hashable:
        if type(group) is int or type(group) is Ticket:
            return int(group)
        if isinstance(group, numbers.Integral) and not isinstance(group, bool):
            return int(group)  # a Ticket is stored as its plain id
        if group is not None:
            try:
                hash(group)
            except TypeError:
                raise InvalidRequest(f"a group id must be hashable, got {type(group).__name__}") from None
        return group

    def _write(
        self,
        group: Any,
        datas: list,
        versions: Any,
        lengths: Any,
        group_size: Any,
        indices: list | None,
        whole: bool,
        per_member: bool = False,
    ) -> str:
        with self._lock:
            self._check_open()
            rngs, lens, indices = self._check_members(datas, versions, lengths, indices, per_member)
            gid = self._group_key(group)
            self._expire(self._clock())
            if self.budget is not None and gid is None:
                raise InvalidRequest("with pacing, pass the ticket from acquire() as the group")
            g = self._pending.get(gid) if gid is not None else None
            size = self.group_size if group_size is None else check_int(group_size, "group_size", 1)
            if g is not None and group_size is None:
                size = g.size
            if size > self.capacity:
                raise InvalidRequest(f"a group of {size} rollouts can never fit capacity {self.capacity}")
            if gid is None and size != 1:
                raise InvalidRequest(f"a group of {size} needs a group id")
            if g is not None and g.size != size:
                raise InvalidRequest(f"group {gid!r} has size {g.size}, not {size}")
            if whole and len(datas) != size:
                raise InvalidRequest(f"group {gid!r} has {size} members, got {len(datas)} completions")
            if indices is not None and any(not 0 <= i < size for i in indices):
                raise InvalidRequest(f"member indices must be in [0, {size}), got {indices!r}")
            if g is None and gid is not None:
                writable = self.budget is None or self.budget.held(gid)
                done = self._done.get(gid)
                if (
                    indices is not None
                    and done is not None
                    and done[0] is not None
                    and (not writable or self.budget is None)
                ):  # without pacing, group ids must be unique
                    self.counters["duplicate_members_ignored"] += len(datas)
                    return done[0]  # a retried write of a group that completed: answered, not duplicated
                if self.budget is not None and not writable:
                    self.budget.require_held([gid])  # raises UnknownTicket / TicketCancelled
                    raise UnknownTicket(f"group {gid!r} is not a held ticket")
            present = g.indices if g is not None else set()
            new = [j for j in range(len(datas)) if indices is None or indices[j] not in present]
            have = len(g.members) if g is not None else 0
            if have + len(new) > size:
                raise InvalidRequest(f"group {gid!r} would have {have + len(new)} members, more than its size {size}")
            if self.tokens and self.budget is not None and new:
                tokens = (g.tokens if g is not None else 0) + sum(lens[j] for j in new)
                reserved = self.budget.weight_of(gid)
                if tokens > reserved:
                    raise OverReservation(
                        f"group {gid!r} would have {tokens} tokens, more than the {reserved} its ticket "
                        f"reserved (group_tokens or acquire(tokens=...)): reject it, or write it truncated"
                    )
            # -- valid: mutate
            self.counters["add_calls"] += 1
            self.counters["duplicate_members_ignored"] += len(datas) - len(new)
            if not new:
                self._commit()
                return "pending"
            if g is None:
                gid = gid if gid is not None else ("auto", next(self._auto_ids))
                g = Group(gid, size, created=self._clock())
                self._pending[gid] = g
            for j in new:
                g.members.append(Rollout(datas[j], rngs[j], lens[j], None if indices is None else indices[j]))
            self.counters["rollouts_added"] += len(new)
            self.metrics.generated([lens[j] for j in new])
            if not g.complete:
                self._stage(f"p/{g.group_id!r}", g)
                status = "pending"
            else:
                del self._pending[g.group_id]
                self._unstage(f"p/{g.group_id!r}")
                status = self._admit(g)
            self._commit()
            return status

    # -- reward filtering ------------------------------------------------------------------------------------
    def reject(self, group: Hashable, reason: str) -> None:
        """Drop a group after scoring (DAPO's dynamic sampling: every reward equal), counted by ``reason``.

        The group may be complete and not yet sampled, pending, or not written at all (its ticket
        held). Its budget comes back (the producer can acquire another ticket); its rollouts count
        in ``dropped_by_length`` and ``rejected/<reason>``.

        Raises:
            InvalidRequest: ``reason`` is not a non-empty string; the group was already rejected or
                dropped (nothing changed).
            AlreadySampled: the trainer already sampled it (nothing changed).
            UnknownTicket: no such group or held ticket (nothing changed).
        """
        if not isinstance(reason, str) or not reason:
            raise InvalidRequest(f"reason must be a non-empty string, got {reason!r}")
        with self._lock:
            self._check_open()
            gid = self._group_key(group)
            self._expire(self._clock())
            held = self.budget is not None and self.budget.held(gid)
            if held or (self.budget is None and gid in self._pending):
                g = self._pending.pop(gid, None)
                if g is not None:
                    self._unstage(f"p/{gid!r}")
                if held:
                    self._settle(self.budget.finish([gid], accepted=False))
                self._count_reject(g or Group(gid, 0), reason)
            elif gid in self._by_gid:
                key = self._by_gid[gid]
                g = self._complete[key]
                if g.times_sampled > 0:
                    raise AlreadySampled(
                        f"group {gid!r} was already sampled {g.times_sampled} time(s): it cannot be rejected"
                    )
                self._take_out(key)
                self.table.delete([key])
                if self.budget is not None:
                    self.budget.discard(self._units(g))
                self._count_reject(g, reason)
            else:
                fate = (self._done.get(gid) or [None, None])[1]
                if fate == "sampled":
                    raise AlreadySampled(f"group {gid!r} was already sampled: it cannot be rejected")
                if fate in ("rejected", "dropped"):
                    raise InvalidRequest(f"group {gid!r} was already {fate}: nothing to reject")
                if self.budget is not None:
                    self.budget.require_held([gid])
                raise UnknownTicket(f"no group {gid!r} in {self.name!r} (never written, or forgotten)")
            self._cond.notify_all()
            self._commit()

    def _count_reject(self, g: Group, reason: str) -> None:
        self.counters["groups_rejected"] += 1
        self.counters["groups_dropped_rejected"] += 1
        self.counters["rollouts_dropped"] += len(g.members)
        self.metrics.rejected(reason, g.lengths)
        self._mark_done(g.group_id, fate="rejected")


__all__ = ["ProducerCalls"]
