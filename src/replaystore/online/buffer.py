"""RolloutBuffer: online RL data with pacing, version ranges, groups and pick policies, on a Table.

```python
buf = RolloutBuffer(capacity=4096, batch_size=8, max_staleness=1, group_size=4, pick="fifo")
# producers
[t] = buf.acquire(1, timeout=60)              # waits while the version budget is spent; t.version
buf.add_group(t, completions, versions=(t.version, buf.version), lengths=[len(c) for c in completions])
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

The class is written in four modules, one concept each: this one holds the state, admission
and removal of groups, expiry and the lifecycle; :mod:`.buffer_journal` the journal (staging,
commit, restart); :mod:`.buffer_producers` the producer-side calls (tickets, ``add``/``add_group``,
``reject``, over-provisioning, pause); :mod:`.buffer_trainer` the trainer-side calls (``sample``,
``set_version``, waiting for versions).

Staleness: each rollout carries a :class:`~replaystore.online.VersionRange`; a group's range
covers its members'. ``staleness_end`` (``"min"`` by default) says which end counts. With
``drop_stale``, a complete group more than ``max_staleness`` versions behind is refused, and
:meth:`set_version` drops every group that became stale, so a sample never returns one.

Pacing (``pacing=True``): producers hold tickets of a
:class:`~replaystore.online.StalenessBudget`; a group's id is its ticket. With the ``"fifo"`` and
``"in_order"`` picks a sample also waits for running groups that would otherwise go stale
(:mod:`.picks`; when that makes staleness exact: docs/online.md, "Semantics", pick policies).
With ``batch_tokens`` the budget and the samples are measured in tokens.

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

from ..checkpoint.journal import NullJournal
from ..errors import Closed, InvalidRequest
from ..limiters import MinSize
from ..monitor import Sink, flatten_scalars, write_sinks
from ..samplers import Fifo
from ..table import Table
from .budget import StalenessBudget
from .buffer_journal import BufferJournal
from .buffer_producers import ProducerCalls
from .buffer_trainer import TrainerCalls
from .groups import Group
from .measure import DROP_REASONS, OnlineMetrics
from .picks import check_pick, make_selector, priority
from .versions import check_end, check_int

DEFAULT_TICKET_TTL = 600.0  # seconds: a dead producer's tickets come back after 10 minutes
_COUNTERS = (
    "rollouts_added",
    "groups_completed",
    "groups_admitted",
    "groups_sampled",
    "rollouts_sampled",
    "sample_calls",
    "groups_retired",
    "groups_evicted_after_training",
    "groups_dropped_after_training",
    *(f"groups_dropped_{reason}" for reason in DROP_REASONS),
    "groups_rejected",
    "tickets_cancelled",
    "rollouts_dropped",
    "duplicate_members_ignored",
    "add_calls",
    "restarts",
)


class RolloutBuffer(ProducerCalls, TrainerCalls, BufferJournal):
    """Online rollouts with staleness by pacing and/or dropping, groups and pick policies.

    Args:
        capacity: rollouts held at most (complete groups; the oldest complete group is evicted).
        batch_size: groups the trainer samples per policy version (pacing in groups).
        max_staleness: versions a group may lag (``None``: no staleness limit, no pacing).
        pacing: hold producers back with a :class:`StalenessBudget` (default: on when
            ``batch_size`` (or ``batch_tokens``) and ``max_staleness`` are given).
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
            dropped (a producer that died). Default :data:`DEFAULT_TICKET_TTL` (600 s);
            ``None``: tickets never expire (one dead producer can then stall a ``fifo`` trainer).
        max_running: at most this many tickets held at once.
        batch_tokens: instead of ``batch_size``: tokens (sum of rollout lengths) the trainer samples
            per version; the budget counts tokens and ``sample()`` returns whole groups until
            their tokens reach ``batch_tokens``.
        group_tokens: with ``batch_tokens`` and pacing, the tokens a ticket reserves until its group
            completes (the most a group can produce); ``acquire(tokens=...)`` overrides it.
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

    def __init__(
        self,
        capacity: int,
        batch_size: int | None = None,
        max_staleness: int | None = None,
        *,
        pacing: bool | None = None,
        drop_stale: bool | None = None,
        group_size: int = 1,
        pick: str = "fifo",
        staleness_end: str = "min",
        max_reuse: int = 1,
        group_timeout: float | None = None,
        ticket_ttl: float | None = DEFAULT_TICKET_TTL,
        max_running: int | None = None,
        batch_tokens: int | None = None,
        group_tokens: int | None = None,
        length_buckets: Sequence[int] = (16, 64, 256, 1024),
        seed: int | None = None,
        sinks: Sequence[Sink] | None = None,
        journal: Any = None,
        clock: Callable[[], float] = time.time,
        name: str = "rollouts",
    ) -> None:
        self.capacity = check_int(capacity, "capacity", 1)
        self.batch_size = None if batch_size is None else check_int(batch_size, "batch_size", 1)
        self.batch_tokens = None if batch_tokens is None else check_int(batch_tokens, "batch_tokens", 1)
        if self.batch_size is not None and self.batch_tokens is not None:
            raise InvalidRequest("give batch_size (groups) or batch_tokens (tokens), not both")
        self.max_staleness = None if max_staleness is None else check_int(max_staleness, "max_staleness", 0)
        per_version = self.batch_size if self.batch_tokens is None else self.batch_tokens
        if pacing is None:
            pacing = per_version is not None and self.max_staleness is not None
        if drop_stale is None:
            drop_stale = self.max_staleness is not None
        if pacing and (per_version is None or self.max_staleness is None):
            raise InvalidRequest("pacing needs batch_size (or batch_tokens) and max_staleness")
        if drop_stale and self.max_staleness is None:
            raise InvalidRequest("drop_stale needs max_staleness")
        self.group_tokens = None if group_tokens is None else check_int(group_tokens, "group_tokens", 1)
        if pacing and self.batch_tokens is not None and self.group_tokens is None:
            raise InvalidRequest(
                "a token budget (batch_tokens with pacing) needs group_tokens: the tokens a "
                "ticket reserves until its group completes"
            )
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
        self.ticket_ttl = ticket_ttl
        self.name = name
        self._clock = clock
        self.budget: StalenessBudget | None = None
        if self.pacing:
            waits = self.pick if self.pick in ("fifo", "in_order") else None
            self.budget = StalenessBudget(
                per_version,
                self.max_staleness,
                max_running=max_running,
                ttl=ticket_ttl,
                clock=clock,
                weight=self.group_tokens or 1,
                trainer_waits=waits,
            )
        self.table = Table(
            self.capacity,
            sampler=make_selector(self.pick),
            remover=Fifo(),
            rate_limiter=MinSize(1),
            max_staleness=self.max_staleness if self.drop_stale else None,
            storage="objects",
            seed=seed,
            name=name,
        )
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
        self._by_gid: dict[Hashable, int] = {}  # group id -> table key (complete groups)
        self._done: dict[Hashable, list] = {}  # group id -> [status of its last write, fate]; bounded
        self._done_seq = 0  # the last sequence number of a done record (their order in the journal)
        self._items = 0  # rollouts in complete groups
        self._tokens = 0  # tokens in complete groups
        self._next_order = 0
        self._next_arrival = 0
        self._auto_ids = itertools.count()
        self.journal = journal if journal is not None else NullJournal()
        self._puts: dict[str, Any] = {}
        self._deletes: set[str] = set()
        if self.budget is not None and type(self.journal) is not NullJournal:
            self.budget.track_changes()  # each write journals the tickets that changed, not all
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

    @property
    def tokens(self) -> bool:
        """Whether the budget and samples are measured in tokens (``batch_tokens``)."""
        return self.batch_tokens is not None

    def _check_open(self) -> None:
        if self._closed:
            raise Closed(f"rollout buffer {self.name!r} is closed")

    def _end(self, g: Group) -> int:
        return g.versions.end(self.staleness_end)

    def _is_stale(self, g: Group) -> bool:
        return self.drop_stale and self.version - self._end(g) > self.max_staleness

    def _units(self, g: Group) -> int:
        """What a group counts in the budget: 1, or its tokens."""
        return g.tokens if self.tokens else 1

    def _drop_pending(self, g: Group, reason: str) -> None:
        """Forget a pending group that leaves untrained, counted by ``reason`` (lock held)."""
        del self._pending[g.group_id]
        self._unstage(f"p/{g.group_id!r}")
        self._drop_group(g, reason)

    # -- groups in and out (lock held) -----------------------------------------------------------------
    def _admit(self, g: Group) -> str:
        """A complete group: drop it if stale, else evict for room and insert it."""
        self.counters["groups_completed"] += 1
        gid = g.group_id
        if self._is_stale(g):
            if self.budget is not None:
                self._settle(self.budget.finish([gid], accepted=False))
            self._drop_group(g, "stale")
            self._mark_done(gid, "stale", "dropped")
            return "stale"
        while self._items + g.size > self.capacity:
            self._remove(next(iter(self._complete)), "evicted")
        if self.budget is not None:
            g.order = int(gid)  # admission order
        else:
            g.order = self._next_order
            self._next_order += 1
        g.arrival = self._next_arrival
        self._next_arrival += 1
        self._insert(g, f"c/{g.arrival:020d}")
        self.counters["groups_admitted"] += 1
        self._mark_done(gid, "complete", "held")
        if self.budget is not None:
            self._settle(self.budget.finish([gid], accepted=True, units=[self._units(g)]))
        self._cond.notify_all()
        return "complete"

    def _insert(self, g: Group, jkey: str) -> int:
        end = self._end(g)
        key = self.table.add(g, priority=priority(self.pick, g.order, end, g.arrival), version=end)
        if key >= 0:
            self._complete[key] = g
            self._jkey[key] = jkey
            self._by_gid[g.group_id] = key
            self._items += g.size
            self._tokens += g.tokens
            self._stage(jkey, g)
        return key

    def _take_out(self, key: int) -> Group:
        """A complete group out of the table and the journal."""
        g = self._complete.pop(key)
        del self._by_gid[g.group_id]
        self._items -= g.size
        self._tokens -= g.tokens
        self._unstage(self._jkey.pop(key))
        return g

    def _drop_group(self, g: Group, reason: str) -> None:
        """Count a group that leaves untrained."""
        self.counters[f"groups_dropped_{reason}"] += 1
        self.counters["rollouts_dropped"] += len(g.members)
        self.metrics.dropped(reason, g.lengths)

    def _remove(self, key: int, reason: str) -> None:
        """Take a complete group out of the table (evicted or stale)."""
        g = self._take_out(key)
        self.table.delete([key])
        if g.times_sampled == 0:
            self._drop_group(g, reason)
            self._mark_done(g.group_id, fate="dropped")
            if self.budget is not None:
                self.budget.discard(self._units(g))
        else:
            self.counters[
                f"groups_{reason}_after_training" if reason == "evicted" else "groups_dropped_after_training"
            ] += 1

    def _settle(self, cancelled: Iterable[int] = ()) -> None:
        """Drop the pending groups of tickets that expired or were cancelled (lock held)."""
        if self.budget is None:
            return
        expired, more = self.budget.take_ended(self._clock())
        if not expired and not more and not cancelled:
            return
        for reason, ids in (("expired", expired), ("cancelled", list(cancelled) + more)):
            if reason == "cancelled":
                self.counters["tickets_cancelled"] += len(set(ids))
            for t in dict.fromkeys(ids):
                g = self._pending.get(t)
                if g is not None:
                    self._drop_pending(g, reason)
            if ids:
                self._cond.notify_all()

    def _expire(self, now: float) -> None:
        """Drop pending groups whose ticket expired or that waited longer than ``group_timeout``."""
        self._settle()
        if self.group_timeout is not None and self._pending:
            old = [g for g in self._pending.values() if now - g.created > self.group_timeout]
            for g in old:
                if self.budget is not None and self.budget.held(g.group_id):
                    self.budget.abandon([g.group_id])
                self._drop_pending(g, "incomplete")
            if old:
                self._cond.notify_all()

    def expire(self) -> None:
        """Housekeeping: drop pending groups of expired tickets and those past ``group_timeout``."""
        with self._lock:
            self._expire(self._clock())
            self._commit()

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
        """Counters, sizes, the budget's stats and the measurement histograms (totals since start).

        Expiry is judged first (tickets past their TTL and their pending groups are gone).
        """
        with self._lock:
            self._expire(self._clock())
            out: dict[str, Any] = {
                **self.counters,
                "name": self.name,
                "version": self.version,
                "groups": len(self._complete),
                "rollouts": self._items,
                "tokens": self._tokens,
                "pending_groups": len(self._pending),
                "pending_rollouts": sum(len(g.members) for g in self._pending.values()),
            }
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
        write_sinks(self.sinks, scalars, step)
        return scalars

    def __repr__(self) -> str:
        return (
            f"RolloutBuffer(name={self.name!r}, groups={len(self._complete)}, pending={len(self._pending)}, "
            f"version={self.version}, pacing={self.pacing}, drop_stale={self.drop_stale}, pick={self.pick!r})"
        )


__all__ = ["DEFAULT_TICKET_TTL", "RolloutBuffer"]
