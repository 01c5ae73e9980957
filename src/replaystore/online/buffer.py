"""RolloutBuffer: online RL data with pacing, version ranges, groups and pick policies, on a Table.

```python
buf = RolloutBuffer(capacity=4096, batch_size=8, max_staleness=1, group_size=4, pick="fifo")
# producers
[t] = buf.acquire(1, timeout=60)              # waits while the version budget is spent
for completion in generate(prompt):           # 4 completions of one prompt = one group
    buf.add(completion, group=t, versions=(v_start, v_end), length=len(completion))
# trainer
batch = buf.sample(8, timeout=60)             # 8 whole groups, oldest first
train(batch.data, batch.staleness())
buf.set_version(v + 1)
```

Composition: complete groups are items of a :class:`~replaystore.Table` (object storage), one item
per group, so the Table's selector picks whole groups (:mod:`.picks`); the buffer retires a group
after ``max_reuse`` samples. Pending groups wait outside the Table until their last
member arrives; an incomplete group is never sampled. The buffer evicts (oldest complete group
first) and drops stale groups itself, so that every group that leaves untrained is counted, by
reason and by length (:class:`~replaystore.online.measure.OnlineMetrics`), and its budget given
back.

Staleness: each rollout carries a :class:`~replaystore.online.VersionRange`; a group's range
covers its members'. ``staleness_end`` (``"min"`` by default) says which end counts. With
``drop_stale``, a complete group more than ``max_staleness`` versions behind is refused, and
:meth:`set_version` drops every group that became stale, so a sample never returns one.

Pacing (``pacing=True``): producers hold tickets of a
:class:`~replaystore.online.StalenessBudget`; a group's id is its ticket. With the ``"in_order"``
pick, a sample takes the oldest outstanding groups and waits for those still running; then, as long
as the trainer samples ``batch_size`` groups per version and calls :meth:`set_version` after each
step (``max_reuse=1``), no group is ever stale and none is dropped. ``"fifo"`` (ready first) waits
only for a running group on its last version in the window: exact for ``max_staleness <= 1``,
nearly so beyond.

Every public method is thread-safe (one lock; waits release it) and validates its input before it
changes anything: bad input raises a :class:`~replaystore.ReplayError` subclass and leaves the
buffer, its budget and its counters as they were.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from ..errors import CheckpointError, Closed, InvalidRequest, StorageError, Timeout, UnknownTicket
from ..limiters import MinSize
from ..monitor import Sink, flatten_scalars
from ..samplers import Fifo
from ..table import Table
from .budget import StalenessBudget
from .groups import Group, Rollout, RolloutBatch
from .measure import OnlineMetrics
from .picks import check_pick, make_selector, priority
from .versions import VersionRange, check_end, check_int

_COUNTERS = ("rollouts_added", "groups_completed", "groups_admitted", "groups_sampled", "rollouts_sampled",
             "sample_calls", "groups_retired", "groups_evicted_after_training", "groups_dropped_after_training",
             "groups_dropped_stale", "groups_dropped_expired", "groups_dropped_evicted",
             "groups_dropped_abandoned", "groups_dropped_incomplete", "rollouts_dropped", "restarts")


class NullOnlineJournal:
    """Keeps nothing (an in-process buffer). See :class:`~replaystore.online.journal.OnlineJournal`."""

    def write(self, puts: dict[str, Any], deletes: Iterable[str]) -> None:  # noqa: D102
        pass

    def load(self) -> dict[str, Any]:  # noqa: D102
        return {}

    def close(self) -> None:  # noqa: D102
        pass


class RolloutBuffer:
    """Online rollouts with staleness by pacing and/or dropping, groups and pick policies.

    Args:
        capacity: rollouts held at most (complete groups; the oldest complete group is evicted).
        batch_size: groups the trainer samples per policy version (needed for pacing).
        max_staleness: versions a group may lag (``None``: no staleness limit, no pacing).
        pacing: hold producers back with a :class:`StalenessBudget` (default: on when
            ``batch_size`` and ``max_staleness`` are given).
        drop_stale: refuse and drop groups more than ``max_staleness`` behind (default on when
            ``max_staleness`` is given). Pacing and dropping combine.
        group_size: rollouts per group by default (``add`` may override it per group).
        pick: ``"fifo"`` (ready first, oldest first), ``"in_order"``, ``"uniform"`` or ``"freshest"``
            (see :mod:`.picks`).
        staleness_end: ``"min"`` (a group is as old as its oldest part) or ``"max"``.
        max_reuse: a group is retired after this many samples.
        group_timeout: drop a pending group this many seconds after its first member arrived
            (``None``: never); its ticket is abandoned.
        ticket_ttl: a ticket not renewed for this many seconds is abandoned and its pending group
            dropped (a producer that died). ``None``: tickets never expire.
        max_running: at most this many tickets held at once.
        length_buckets: edges of the length histograms.
        seed: seed of the ``"uniform"`` pick.
        sinks: monitoring sinks :meth:`report` writes to (``replaystore.monitor``).
        journal: persistence (``OnlineJournal``); the buffer resumes from it.
        clock: wall-clock function (deadlines, ages).
        name: a label for stats and errors.

    Raises:
        InvalidRequest: inconsistent or out-of-range arguments (a group larger than the capacity,
            pacing without ``batch_size``/``max_staleness``, an unknown pick or end).
    """

    def __init__(self, capacity: int, batch_size: int | None = None, max_staleness: int | None = None, *,
                 pacing: bool | None = None, drop_stale: bool | None = None, group_size: int = 1,
                 pick: str = "fifo", staleness_end: str = "min", max_reuse: int = 1,
                 group_timeout: float | None = None, ticket_ttl: float | None = None,
                 max_running: int | None = None, length_buckets: Sequence[int] = (16, 64, 256, 1024),
                 seed: int | None = None, sinks: Sequence[Sink] | None = None, journal: Any = None,
                 clock: Callable[[], float] = time.time, name: str = "rollouts") -> None:
        self.capacity = check_int(capacity, "capacity", 1)
        self.batch_size = None if batch_size is None else check_int(batch_size, "batch_size", 1)
        self.max_staleness = None if max_staleness is None else check_int(max_staleness, "max_staleness", 0)
        if pacing is None:
            pacing = self.batch_size is not None and self.max_staleness is not None
        if drop_stale is None:
            drop_stale = self.max_staleness is not None
        if pacing and (self.batch_size is None or self.max_staleness is None):
            raise InvalidRequest("pacing needs batch_size and max_staleness")
        if drop_stale and self.max_staleness is None:
            raise InvalidRequest("drop_stale needs max_staleness")
        self.pacing, self.drop_stale = bool(pacing), bool(drop_stale)
        self.group_size = check_int(group_size, "group_size", 1)
        if self.group_size > self.capacity:
            raise InvalidRequest(f"a group of {self.group_size} rollouts can never fit capacity {self.capacity}")
        self.pick = check_pick(pick)
        self.staleness_end = check_end(staleness_end)
        self.max_reuse = check_int(max_reuse, "max_reuse", 1)
        for what, v in (("group_timeout", group_timeout), ("ticket_ttl", ticket_ttl)):
            if v is not None and not v > 0:
                raise InvalidRequest(f"{what} must be > 0 seconds or None, got {v!r}")
        self.group_timeout = group_timeout
        self.name = name
        self._clock = clock
        self.budget: StalenessBudget | None = None
        if self.pacing:
            self.budget = StalenessBudget(self.batch_size, self.max_staleness, max_running=max_running,
                                          ttl=ticket_ttl, clock=clock)
        self.table = Table(self.capacity, sampler=make_selector(self.pick), remover=Fifo(),
                           rate_limiter=MinSize(1),
                           max_staleness=self.max_staleness if self.drop_stale else None,
                           storage="objects", seed=seed, name=name)
        self.metrics = OnlineMetrics(length_buckets)
        self.sinks = list(sinks or [])
        self._report_step = 0
        self.version = 0
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._pending: dict[Hashable, Group] = {}
        self._complete: dict[int, Group] = {}  # table key -> group, in admission (FIFO) order
        self._jkey: dict[int, str] = {}  # table key -> journal key
        self._items = 0  # rollouts in complete groups
        self._next_order = 0
        self._next_arrival = 0
        self._auto_ids = itertools.count()
        self.journal = journal if journal is not None else NullOnlineJournal()
        self._puts: dict[str, Any] = {}
        self._deletes: set[str] = set()
        self._restore(self.journal.load())

    # -- small queries --------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Complete groups available for sampling."""
        return len(self._complete)

    @property
    def num_rollouts(self) -> int:
        """Rollouts in complete groups."""
        return self._items

    @property
    def num_pending(self) -> int:
        """Groups still waiting for members."""
        return len(self._pending)

    def _check_open(self) -> None:
        if self._closed:
            raise Closed(f"rollout buffer {self.name!r} is closed")

    def _end(self, g: Group) -> int:
        return g.versions.end(self.staleness_end)

    def _is_stale(self, g: Group) -> bool:
        return self.drop_stale and self.version - self._end(g) > self.max_staleness

    # -- journal ----------------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {"version": self.version, "counters": self.counters, "next_order": self._next_order,
                "next_arrival": self._next_arrival, "metrics": self.metrics.snapshot("total"),
                "budget": None if self.budget is None else self.budget.state()}

    def _commit(self) -> None:
        """Write what the last operation changed, plus the state, in one journal transaction.

        If the write fails (a full disk), the changes stay staged and go out with the next
        successful commit; the error is raised as :class:`~replaystore.StorageError`. The operation
        itself has happened in memory (a restart before the next commit would not see it).
        """
        puts, deletes = self._puts, self._deletes
        self._puts, self._deletes = {}, set()
        puts.pop("s", None)
        try:
            self.journal.write({**puts, "s": self._state()}, [d for d in deletes if d not in puts])
        except Exception as e:
            self._puts, self._deletes = puts, deletes  # staged again (the lock is held: nothing came since)
            if isinstance(e, StorageError):
                raise
            raise StorageError(f"rollout buffer {self.name!r}: journal write failed ({type(e).__name__}: {e})",
                               path=getattr(self.journal, "path", None)) from e

    @staticmethod
    def _pkey(gid: Hashable) -> str:
        return f"p/{gid!r}"

    def _put_pending(self, g: Group) -> None:
        self._puts[self._pkey(g.group_id)] = g

    def _drop_pending_key(self, g: Group) -> None:
        k = self._pkey(g.group_id)
        self._puts.pop(k, None)
        self._deletes.add(k)

    # -- producers ------------------------------------------------------------------------------------------
    def acquire(self, k: int = 1, timeout: float | None = None, holder: str | None = None) -> list[int]:
        """``k`` tickets (group ids) from the budget, waiting while it is spent.

        Raises:
            InvalidRequest: no pacing, or a bad ``k``. Timeout: not granted in time. Closed.
        """
        budget = self._need_budget()
        with self._lock:
            self._check_open()
            self._expire(self._clock())
            self._commit()
        tickets = budget.acquire(k, timeout=timeout, holder=holder)
        with self._lock:
            self._commit()  # the budget's new tickets
        return tickets

    def try_acquire(self, k: int = 1, holder: str | None = None) -> list[int]:
        """``k`` tickets if the budget allows them now, else ``[]``; never waits."""
        budget = self._need_budget()
        with self._lock:
            self._check_open()
            self._expire(self._clock())
            tickets = budget.try_acquire(k, holder=holder)
            self._commit()
            return tickets

    def renew(self, tickets: Iterable[int]) -> None:
        """Restart the time-to-live of held tickets. :class:`UnknownTicket` if one is not held."""
        budget = self._need_budget()
        with self._lock:
            budget.renew(list(tickets))
            self._commit()

    def abandon(self, tickets: Iterable[int]) -> None:
        """Give tickets back; their pending groups are dropped (counted as ``abandoned``).

        Raises:
            UnknownTicket: a ticket is not held (nothing changed).
        """
        budget = self._need_budget()
        with self._lock:
            ids = list(tickets)
            budget.abandon(ids)
            for t in ids:
                g = self._pending.pop(t, None)
                if g is not None:
                    self._drop_group(g, "abandoned")
                    self._drop_pending_key(g)
            self._cond.notify_all()
            self._commit()

    def finish(self, tickets: Iterable[int], accepted: bool = True) -> None:
        """End tickets whose rollouts are kept elsewhere (budget-only use, e.g. the fragment buffer).

        A ticket used as a group id in this buffer is finished by its group instead.

        Raises:
            UnknownTicket: a ticket is not held (nothing changed).
            InvalidRequest: a ticket has a pending group here (nothing changed).
        """
        budget = self._need_budget()
        with self._lock:
            ids = list(tickets)
            busy = [t for t in ids if t in self._pending]
            if busy:
                raise InvalidRequest(f"tickets {busy[:5]!r} have pending groups in {self.name!r}: "
                                     f"their groups finish them")
            budget.finish(ids, accepted=accepted)
            self._cond.notify_all()
            self._commit()

    def discard(self, n: int) -> None:
        """``n`` accepted rollouts kept elsewhere left untrained: give their budget back."""
        budget = self._need_budget()
        with self._lock:
            budget.discard(n)
            self._commit()

    def _need_budget(self) -> StalenessBudget:
        if self.budget is None:
            raise InvalidRequest(f"rollout buffer {self.name!r} does not pace producers (pacing=False)")
        return self.budget

    def add(self, data: Any, group: Hashable | None = None, versions: Any = None, length: int | None = None,
            group_size: int | None = None) -> str:
        """Add one rollout to its group.

        Args:
            data: the payload (any object).
            group: the group id; with pacing, the ticket from :meth:`acquire`. ``None`` (without
                pacing, groups of one): a new group.
            versions: the policy versions that produced it: an int, ``(min, max)`` or a
                :class:`VersionRange` (default: the current version).
            length: its length for the length histograms (default ``len(data)``, else 1).
            group_size: the group's size (default: the buffer's ``group_size``); fixed by the
                group's first member.

        Returns:
            ``"pending"`` (the group waits for more members), ``"complete"`` (the group completed and
            can be sampled), or ``"stale"`` (the group completed but was dropped as stale).

        Raises:
            InvalidRequest: bad versions (``min > max``, negative, not integers), length or size, a
                size different from the group's, a group larger than the capacity.
            UnknownTicket: with pacing, ``group`` is not a held ticket (never acquired, expired, ...).
            Closed: the buffer was closed.
        """
        with self._lock:
            self._check_open()
            size = self.group_size if group_size is None else check_int(group_size, "group_size", 1)
            if size > self.capacity:
                raise InvalidRequest(f"a group of {size} rollouts can never fit capacity {self.capacity}")
            rng = VersionRange.of(self.version if versions is None else versions)
            if length is None:
                length = len(data) if hasattr(data, "__len__") else 1
            length = check_int(length, "length")
            if group is not None:
                try:
                    hash(group)
                except TypeError:
                    raise InvalidRequest(f"a group id must be hashable, got {type(group).__name__}") from None
            self._expire(self._clock())
            g = self._pending.get(group) if group is not None else None
            if self.budget is not None:
                if group is None:
                    raise InvalidRequest("with pacing, pass the ticket from acquire() as the group")
                if not self.budget.held(group):
                    raise UnknownTicket(f"group {group!r} is not a held ticket (never acquired, finished, "
                                        f"abandoned or expired)")
            elif group is None:
                if size != 1:
                    raise InvalidRequest(f"a group of {size} needs a group id")
            if g is not None and g.size != size:
                raise InvalidRequest(f"group {group!r} has size {g.size}, not {size}")
            # -- valid: mutate
            if g is None:
                gid = group if group is not None else ("auto", next(self._auto_ids))
                g = Group(gid, size, created=self._clock())
                self._pending[gid] = g
            g.members.append(Rollout(data, rng, length))
            self.counters["rollouts_added"] += 1
            self.metrics.generated([length])
            if not g.complete:
                self._put_pending(g)
                status = "pending"
            else:
                del self._pending[g.group_id]
                self._drop_pending_key(g)
                status = self._admit(g)
            self._commit()
            return status

    def _admit(self, g: Group) -> str:
        """A complete group: drop it if stale, else evict for room and insert it (lock held)."""
        self.counters["groups_completed"] += 1
        if self._is_stale(g):
            if self.budget is not None:
                self.budget.finish([g.group_id], accepted=False)
            self._drop_group(g, "stale")
            return "stale"
        while self._items + g.size > self.capacity:
            self._remove(next(iter(self._complete)), "evicted")
        if self.budget is not None:
            g.order = int(g.group_id)  # admission order
        else:
            g.order = self._next_order
            self._next_order += 1
        end = self._end(g)
        key = self.table.add(g, priority=priority(self.pick, g.order, end), version=end)
        self._complete[key] = g
        jk = self._jkey[key] = f"c/{self._next_arrival:020d}"
        self._next_arrival += 1
        self._puts[jk] = g
        self._items += g.size
        self.counters["groups_admitted"] += 1
        if self.budget is not None:
            self.budget.finish([g.group_id], accepted=True)
        self._cond.notify_all()
        return "complete"

    def _drop_group(self, g: Group, reason: str) -> None:
        """Count a group that leaves untrained (lock held)."""
        self.counters[f"groups_dropped_{reason}"] += 1
        self.counters["rollouts_dropped"] += len(g.members)
        self.metrics.dropped(reason, g.lengths)

    def _remove(self, key: int, reason: str) -> None:
        """Take a complete group out of the table (lock held)."""
        g = self._complete.pop(key)
        self.table.delete([key])
        self._items -= g.size
        self._deletes.add(self._jkey.pop(key))
        if g.times_sampled == 0:
            self._drop_group(g, reason)
            if self.budget is not None:
                self.budget.discard(1)
        else:
            self.counters[f"groups_{reason}_after_training" if reason == "evicted"
                          else "groups_dropped_after_training"] += 1

    # -- expiry ---------------------------------------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        """Drop pending groups whose ticket expired or that waited longer than ``group_timeout``."""
        if self.budget is not None:
            for t in self.budget.expire(now):
                g = self._pending.pop(t, None)
                if g is not None:
                    self._drop_group(g, "expired")
                    self._drop_pending_key(g)
        if self.group_timeout is not None and self._pending:
            old = [g for g in self._pending.values() if now - g.created > self.group_timeout]
            for g in old:
                del self._pending[g.group_id]
                if self.budget is not None and self.budget.held(g.group_id):
                    self.budget.abandon([g.group_id])
                self._drop_group(g, "incomplete")
                self._drop_pending_key(g)
            if old:
                self._cond.notify_all()

    def expire(self) -> None:
        """Housekeeping: drop pending groups of expired tickets and those past ``group_timeout``."""
        with self._lock:
            self._expire(self._clock())
            self._commit()

    # -- trainer --------------------------------------------------------------------------------------------------
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

    def sample(self, num_groups: int, timeout: float | None = None) -> RolloutBatch:
        """Draw ``num_groups`` distinct complete groups with the pick policy; wait while too few exist.

        With pacing and ``"fifo"``, also waits for running groups that would otherwise go stale at
        the next version. Groups reaching ``max_reuse`` samples are retired.

        Raises:
            InvalidRequest: ``num_groups`` not a positive integer, or larger than the buffer (or the
                budget) could ever provide.
            Timeout: not enough complete groups within ``timeout`` seconds (``None``: wait forever).
            Closed: the buffer was closed.
        """
        n = check_int(num_groups, "num_groups", 1)
        if n > self.capacity:
            raise InvalidRequest(f"{n} groups can never be held by capacity {self.capacity}")
        if self.budget is not None and n > (self.max_staleness + 1) * self.batch_size:
            raise InvalidRequest(f"{n} groups can never be admitted at once: the budget admits "
                                 f"(max_staleness + 1) * batch_size = {(self.max_staleness + 1) * self.batch_size}")
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        with self._lock:
            self._check_open()
            while True:
                self._expire(self._clock())
                if len(self._complete) >= n and not self._straggler(n):
                    break
                self._check_open()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    self._commit()
                    waiting = " (waiting for running groups, see pick)" if self._straggler(n) else ""
                    raise Timeout(f"sample of {n} groups from {self.name!r}: {len(self._complete)} complete, "
                                  f"{len(self._pending)} pending after {timeout:.3g}s{waiting}")
                # wake periodically so expiring tickets and timed-out groups are noticed
                self._cond.wait(0.05 if remaining is None else min(remaining, 0.05))
            s = self.table.sample(n, timeout=0)
            groups = [self._complete[k] for k in s.keys.tolist()]
            retired = []
            for key, g in zip(s.keys.tolist(), groups):
                g.times_sampled += 1
                if g.times_sampled >= self.max_reuse:
                    retired.append(key)
                    del self._complete[key]
                    self._items -= g.size
                    self._deletes.add(self._jkey.pop(key))
                    self.counters["groups_retired"] += 1
                else:
                    self._puts[self._jkey[key]] = g
            if retired:
                self.table.delete(retired)
            batch = RolloutBatch(groups, self.version)
            self.metrics.trained(batch.lengths.tolist(), batch.staleness(self.staleness_end).tolist())
            self.counters["groups_sampled"] += n
            self.counters["rollouts_sampled"] += len(batch.rollouts)
            self.counters["sample_calls"] += 1
            self._commit()
            return batch

    def set_version(self, version: int) -> int:
        """Set the trainer's policy version (it may only grow); drop groups that became stale.

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

    # -- lifecycle, stats ------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Wake every waiting call with :class:`Closed`; later calls raise it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.budget is not None:
                self.budget.close()
            self.table.close()
            self._cond.notify_all()
            self.journal.close()

    def stats(self) -> dict[str, Any]:
        """Counters, sizes, the budget's stats and the measurement histograms (totals since start)."""
        with self._lock:
            out: dict[str, Any] = {**self.counters, "name": self.name, "version": self.version,
                                   "groups": len(self._complete), "rollouts": self._items,
                                   "pending_groups": len(self._pending),
                                   "pending_rollouts": sum(len(g.members) for g in self._pending.values())}
            if self.budget is not None:
                out["budget"] = self.budget.stats()
            out.update(self.metrics.snapshot("total"))
            return out

    def report(self) -> dict[str, float]:
        """Scalars of the window since the last report (histograms, drops, producer waits) to the sinks.

        Returns the flattened scalars written (``online/trained_staleness/0``, ...).
        """
        with self._lock:
            if self.budget is not None:
                self.metrics.waits(self.budget.take_waits())
            window = self.metrics.report()
            window.update(version=self.version, groups=len(self._complete), pending_groups=len(self._pending))
            if self.budget is not None:
                window["running"] = self.budget.running
            scalars = flatten_scalars(window, "online/")
            step = self._report_step
            self._report_step += 1
        for sink in self.sinks:
            try:
                sink.write(scalars, step)
            except Exception:  # noqa: BLE001 - monitoring must not break training
                import logging

                logging.getLogger("replaystore").exception("online sink %r failed", sink)
        return scalars

    # -- restart ------------------------------------------------------------------------------------------------------
    def _restore(self, saved: dict[str, Any]) -> None:
        if saved.get("s") is None:
            return
        try:
            self._restore_records(saved)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise CheckpointError(f"rollout buffer {self.name!r}: the journal does not hold a valid state "
                                  f"({type(e).__name__}: {e})") from e

    def _restore_records(self, saved: dict[str, Any]) -> None:
        state = saved["s"]
        self.version = int(state["version"])
        self.counters.update(state["counters"])
        self.counters["restarts"] += 1
        self._next_order = int(state["next_order"])
        self._next_arrival = int(state["next_arrival"])
        for kind, hist in state["metrics"].items():
            self.metrics.total[kind].update(hist)
        if self.budget is not None and state["budget"] is not None:
            self.budget.load_state(state["budget"])
        self.table.set_version(self.version)
        for k, g in sorted(saved.items()):
            if k.startswith("p/"):
                self._pending[g.group_id] = g
            elif k.startswith("c/"):
                end = self._end(g)
                key = self.table.add(g, priority=priority(self.pick, g.order, end), version=end)
                if key < 0:  # stale by the saved version: cannot happen with a consistent journal
                    self._deletes.add(k)
                    continue
                self._complete[key] = g
                self._jkey[key] = k
                self._items += g.size
        if self._deletes:
            self._commit()

    def __repr__(self) -> str:
        return (f"RolloutBuffer(name={self.name!r}, groups={len(self._complete)}, pending={len(self._pending)}, "
                f"version={self.version}, pacing={self.pacing}, drop_stale={self.drop_stale}, pick={self.pick!r})")


__all__ = ["RolloutBuffer"]
