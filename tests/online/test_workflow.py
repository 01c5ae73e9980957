"""The large-model workflow of RolloutBuffer (issue 22) and the online items of issue 24.

Whole-group writes (one call, one journal transaction, idempotent by member index, across a
restart), admission versions on tickets, waiting for versions, reject after scoring, over-
provisioning, pause/resume, safe defaults (finite TTL, WouldDeadlock), token budgets; expiry
judged by the clock at the call, VersionRange objects validated, bare tickets, freshest ties.
"""

import asyncio
import threading
import time

import pytest
from online_helpers import FakeClock, snapshot

import replaystore as rs
from replaystore.errors import InvalidRequest, UnknownTicket
from replaystore.online import (
    DEFAULT_TICKET_TTL,
    RolloutBuffer,
    RolloutBufferConfig,
    StalenessBudget,
    Ticket,
    VersionRange,
)


class CountingJournal:
    """A journal that counts its transactions (and keeps nothing)."""

    def __init__(self):
        self.writes = 0

    def write(self, puts, deletes):
        self.writes += 1

    def load(self):
        return {}

    def close(self):
        pass


def refused(buf, call, err=rs.ReplayError):
    before = snapshot(buf)
    with pytest.raises(err) as e:
        call()
    assert snapshot(buf) == before, e.value
    return e.value


# -- issue 24, items 5-7 ---------------------------------------------------------------------------
def test_version_range_objects_are_validated_like_tuples():
    buf = RolloutBuffer(8, max_staleness=1)
    buf.set_version(10)
    for bad in (VersionRange(9, 0), VersionRange(-3, -1), VersionRange(1.5, 2), (9, 0), (-3, -1)):
        refused(buf, lambda bad=bad: buf.add("x", versions=bad), InvalidRequest)
    assert buf.add("x", versions=VersionRange(8, 10)) == "stale"  # staleness judged at add time
    assert buf.add("x", versions=VersionRange(9, 10)) == "complete"


def test_ticket_expiry_is_judged_at_the_call_by_the_clock():
    clock = FakeClock()
    b = StalenessBudget(batch_size=4, max_staleness=0, ttl=5.5, clock=clock)
    t, u = b.try_acquire(2)
    clock.t += 6
    assert not b.held(u)
    for call in (lambda: b.renew([t]), lambda: b.finish([u]), lambda: b.abandon([t]), lambda: b.version_of(t)):
        with pytest.raises(UnknownTicket):
            call()
    assert b.accepted == 0 and b.stats()["expired"] == 2

    buf = RolloutBuffer(8, batch_size=2, max_staleness=0, group_size=2, ticket_ttl=5.5, clock=clock)
    [g] = buf.acquire(1)
    buf.add("first", group=g)
    clock.t += 6  # no other call in between
    for call in (
        lambda: buf.renew([g]),
        lambda: buf.add("second", group=g),
        lambda: buf.finish([g]),
        lambda: buf.abandon(g),
        lambda: buf.add_group(g, ["a", "b"]),
    ):
        with pytest.raises(UnknownTicket):
            call()
    assert not buf.held(g)
    s = buf.stats()
    assert s["groups_dropped_expired"] == 1 and s["pending_groups"] == 0 and s["budget"]["accepted"] == 0


def test_a_bare_ticket_is_accepted_where_a_list_is_expected():
    buf = RolloutBuffer(8, batch_size=4, max_staleness=0)
    a, b, c = buf.acquire(3)
    buf.renew(a)
    buf.abandon(b)
    buf.finish(c, accepted=False)
    assert buf.held(a) and not buf.held(b) and not buf.held(c)
    for bad in ("x", 1.5, [a, "y"], None, [a, a]):
        refused(buf, lambda bad=bad: buf.renew(bad), InvalidRequest)


def test_freshest_breaks_ties_by_arrival_not_by_ticket():
    buf = RolloutBuffer(8, batch_size=2, max_staleness=1, pick="freshest")
    a, b = buf.acquire(2)
    buf.add("b", group=b)  # b (the higher ticket) completes first
    buf.add("a", group=a)  # a arrives last: with equal versions, it is the freshest
    assert buf.sample(1).data == ["a"]
    assert buf.sample(1).data == ["b"]


# -- whole-group writes ----------------------------------------------------------------------------
def test_add_group_is_one_call_one_journal_write_and_idempotent():
    j = CountingJournal()
    buf = RolloutBuffer(64, batch_size=2, max_staleness=1, group_size=8, journal=j)
    [t] = buf.acquire(1)
    j.writes = 0
    assert buf.add_group(t, [f"c{i}" for i in range(8)], versions=(0, 0), lengths=list(range(1, 9))) == "complete"
    assert j.writes == 1 and buf.stats()["add_calls"] == 1
    assert buf.add_group(t, [f"c{i}" for i in range(8)]) == "complete"  # a retried call: nothing added
    s = buf.stats()
    assert s["rollouts_added"] == 8 and s["groups"] == 1 and s["duplicate_members_ignored"] == 8
    batch = buf.sample(1)
    assert batch.data == [f"c{i}" for i in range(8)] and batch.lengths.tolist() == list(range(1, 9))
    # per-member idempotency: the same member index twice is added once
    [u] = buf.acquire(1)
    assert buf.add("m0", group=u, index=0) == "pending"
    assert buf.add("m0", group=u, index=0) == "pending"
    assert buf.add_group(u, [f"m{i}" for i in range(8)]) == "complete"
    assert buf.sample(1).data == [f"m{i}" for i in range(8)]


def test_add_group_bad_input_changes_nothing():
    buf = RolloutBuffer(16, batch_size=2, max_staleness=1, group_size=4)
    [t] = buf.acquire(1)
    buf.add("x", group=t, index=0)
    for call in (
        lambda: buf.add_group(t, ["a", "b", "c"]),  # wrong number of members
        lambda: buf.add_group(t, ["a", "b", "c", "d", "e"]),
        lambda: buf.add_group(t, ["a", "b"], indices=[1, 1]),  # an index twice
        lambda: buf.add_group(t, ["a"], indices=[4]),  # out of range
        lambda: buf.add_group(t, ["a", "b", "c", "d"], lengths=[1, 2]),
        lambda: buf.add_group(t, ["a", "b", "c", "d"], versions=VersionRange(2, 1)),
        lambda: buf.add_group(t, ["a", "b", "c", "d"], member_versions=[0, 0, (1, 0), 0]),
        lambda: buf.add_group(t, "abcd"),
        lambda: buf.add_group(999, ["a", "b", "c", "d"]),
    ):
        refused(buf, call)
    assert buf.add_group(t, ["x", "b", "c", "d"]) == "complete"  # index 0 was there: kept, not duplicated
    assert buf.sample(1).data == ["x", "b", "c", "d"]


def test_idempotent_group_writes_survive_a_restart(tmp_path):
    cfg = RolloutBufferConfig(64, batch_size=2, max_staleness=1, group_size=4, path=str(tmp_path / "j"))
    buf = cfg.build("r")
    a, b = buf.acquire(2)
    assert buf.add_group(a, ["a0", "a1", "a2", "a3"]) == "complete"
    buf.add_group(b, ["b0", "b1"], indices=[0, 1])
    buf.close()
    buf = cfg.build("r")  # the service restarted before replying: the producer retries both calls
    assert buf.add_group(a, ["a0", "a1", "a2", "a3"]) == "complete"
    assert buf.add_group(b, ["b0", "b1", "b2", "b3"]) == "complete"
    s = buf.stats()
    assert s["rollouts_added"] == 8 and s["groups"] == 2 and s["restarts"] == 1
    assert sorted(buf.sample(2).data) == sorted(["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"])
    buf.close()


# -- admission versions and version signals --------------------------------------------------------
def test_tickets_carry_their_admission_version():
    buf = RolloutBuffer(16, batch_size=2, max_staleness=1)
    buf.set_version(3)
    [t] = buf.acquire(1)
    assert isinstance(t, Ticket) and t.version == 3 and buf.version_of(t) == 3 and buf.version_of(int(t)) == 3
    buf.set_version(4)
    assert buf.version_of(int(t)) == 3  # the version it was admitted under, not the trainer's
    buf.add("x", group=t, versions=VersionRange.start(t.version).observe(buf.version))
    assert buf.version_of(t) == 3
    with pytest.raises(UnknownTicket):
        buf.version_of(int(t))  # finished: a bare id is no longer known


def test_wait_for_version_and_the_async_iterator():
    buf = RolloutBuffer(8)
    assert buf.wait_for_version(0, timeout=0) == 0  # reached already: at once
    t0 = time.monotonic()
    with pytest.raises(rs.Timeout):
        buf.wait_for_version(1, timeout=0.1)
    assert time.monotonic() - t0 >= 0.09
    for bad in (-1, 1.5, "2"):
        with pytest.raises(InvalidRequest):
            buf.wait_for_version(bad, timeout=0)
    got = []
    th = threading.Thread(target=lambda: got.append(buf.wait_for_version(2, timeout=60)))
    th.start()
    buf.set_version(1)
    time.sleep(0.05)
    assert not got
    buf.set_version(3)
    th.join(60)
    assert got == [3]
    seen_v = {v: threading.Event() for v in (4, 5, 6)}

    async def follow():
        seen = []
        async for v in buf.versions(after=3, poll=0.05):  # (bump may run before the iterator starts)
            seen.append(v)
            seen_v[v].set()
            if v >= 6:
                break
        return seen

    def bump():  # each version once the iterator saw the one before (two changes between reads yield one)
        for v in (4, 5, 6):
            buf.set_version(v)
            if not seen_v[v].wait(60):
                return

    th = threading.Thread(target=bump)
    th.start()
    assert asyncio.run(follow()) == [4, 5, 6]
    th.join(60)
    waiter = threading.Thread(target=lambda: pytest.raises(rs.Closed, buf.wait_for_version, 99, 60))
    waiter.start()
    time.sleep(0.05)
    buf.close()
    waiter.join(60)
    assert not waiter.is_alive()


# -- reject after scoring --------------------------------------------------------------------------
def test_reject_returns_the_budget_and_counts_the_reason():
    buf = RolloutBuffer(16, batch_size=1, max_staleness=0, group_size=2, length_buckets=(4,))
    [t] = buf.acquire(1)
    buf.add_group(t, ["a", "b"], lengths=[2, 9])
    assert buf.try_acquire(1) == []  # budget spent
    buf.reject(t, "zero_variance")  # every reward equal: DAPO drops the group
    [u] = buf.try_acquire(1)  # ... and the producer may start another
    buf.reject(u, "filtered_before_writing")  # a held ticket, nothing written yet
    s = buf.stats()
    assert s["rejected"] == {"filtered_before_writing": 1, "zero_variance": 1}
    assert s["groups_rejected"] == 2 and s["dropped"] == {"rejected": 2} and s["groups"] == 0
    assert s["dropped_by_length"] == {"0-3": 1, ">=4": 1} and s["budget"]["accepted"] == 0
    [w] = buf.try_acquire(1)
    buf.add_group(w, ["c", "d"])
    buf.sample(1)
    assert isinstance(refused(buf, lambda: buf.reject(w, "late")), rs.AlreadySampled)
    for call in (
        lambda: buf.reject(t, "again"),
        lambda: buf.reject(12345, "never"),
        lambda: buf.reject(w, ""),
        lambda: buf.reject(w, None),
    ):
        refused(buf, call)


# -- over-provisioning and pause -------------------------------------------------------------------
def test_overprovisioned_tickets_are_cancelled_once_the_batch_is_full():
    buf = RolloutBuffer(32, batch_size=4, max_staleness=0, group_size=2, length_buckets=(8,))
    tickets = buf.acquire(2, overprovision=2)
    assert len(tickets) == 4
    a, b, c, d = tickets
    buf.add("c0", group=c, length=20)  # c is a long rollout, half done
    buf.add_group(b, ["b0", "b1"])
    assert buf.held(a) and buf.held(c) and buf.held(d)
    buf.add_group(d, ["d0", "d1"])  # two of the batch completed: the rest are cancelled
    assert not buf.held(a) and not buf.held(c)
    with pytest.raises(rs.TicketCancelled):
        buf.add("c1", group=c)
    with pytest.raises(rs.TicketCancelled):
        buf.renew(a)
    s = buf.stats()
    assert s["tickets_cancelled"] == 2 and s["groups_dropped_cancelled"] == 1
    assert s["dropped_by_length"] == {">=8": 1} and s["budget"]["cancelled"] == 2
    assert s["budget"]["running"] == 0 and s["budget"]["capacity"] == 2
    assert sorted(buf.sample(2).group_ids) == [b, d]


def test_cancel_slowest_takes_the_longest_running_first():
    clock = FakeClock()
    buf = RolloutBuffer(32, batch_size=4, max_staleness=0, clock=clock)
    [old] = buf.acquire(1)
    clock.t += 1
    [mid] = buf.acquire(1)
    clock.t += 1
    [new] = buf.acquire(1)
    assert buf.cancel_slowest(2) == [old, mid]
    assert buf.held(new) and buf.stats()["budget"]["cancelled"] == 2
    assert buf.cancel_slowest(0) == []
    refused(buf, lambda: buf.cancel_slowest(-1), InvalidRequest)


def test_pause_and_resume_admission():
    buf = RolloutBuffer(16, batch_size=2, max_staleness=1)
    buf.pause()
    refused(buf, buf.pause, InvalidRequest)
    assert buf.try_acquire(1) == []
    with pytest.raises(rs.Timeout):
        buf.acquire(1, timeout=0.05)
    got = []
    th = threading.Thread(target=lambda: got.append(buf.acquire(1, timeout=60)))
    th.start()
    time.sleep(0.05)
    assert not got
    buf.resume()
    th.join(60)
    assert len(got) == 1
    refused(buf, buf.resume, InvalidRequest)


# -- safe defaults ---------------------------------------------------------------------------------
def test_tickets_expire_by_default():
    assert DEFAULT_TICKET_TTL == 600.0
    assert RolloutBuffer(8, batch_size=1, max_staleness=0).budget.ttl == 600.0
    assert RolloutBufferConfig(8).ticket_ttl == 600.0
    assert RolloutBuffer(8, batch_size=1, max_staleness=0, ticket_ttl=None).budget.ttl is None


def test_a_second_acquire_that_can_never_be_granted_raises_instead_of_deadlocking():
    buf = RolloutBuffer(16, batch_size=1, max_staleness=0)
    [t] = buf.acquire(1, holder="p0")
    refused(buf, lambda: buf.acquire(1, timeout=30, holder="p0"), rs.WouldDeadlock)  # static: never fits
    buf.add("x", group=t)
    # dynamic: the trainer waits (fifo) for p1's running group while p1 waits for capacity
    buf = RolloutBuffer(16, batch_size=2, max_staleness=1, pick="fifo")
    [mine] = buf.acquire(1, holder="p1")
    others = buf.acquire(3, holder="p2")
    for t in others:
        buf.add("o", group=t)
    buf.sample(2)
    buf.set_version(1)  # p1's ticket (version 0) is on its last version: the trainer waits for it
    more = buf.acquire(2, holder="p2")  # the budget is spent
    t0 = time.monotonic()
    refused(buf, lambda: buf.acquire(1, timeout=30, holder="p1"), rs.WouldDeadlock)
    assert time.monotonic() - t0 < 20  # refused, not after the 30 s timeout
    with pytest.raises(rs.Timeout):
        buf.acquire(1, timeout=0.05, holder="p3")  # another producer just waits
    buf.add("m", group=mine)
    for t in more:
        buf.add("o", group=t)
    assert len(buf.sample(2, timeout=1)) == 2  # the trainer goes on
    buf.set_version(2)
    assert buf.acquire(1, timeout=1, holder="p1")


# -- token budgets ---------------------------------------------------------------------------------
def test_token_budget_admits_and_samples_by_tokens():
    buf = RolloutBuffer(64, batch_tokens=100, max_staleness=0, group_tokens=60, group_size=2)
    [a] = buf.acquire(1)  # reserves 60 of 100 tokens
    assert buf.try_acquire(1) == []
    buf.add_group(a, ["x", "y"], lengths=[10, 20])  # used 30: 70 left
    [b] = buf.acquire(1)
    [c] = buf.acquire(1, tokens=10)
    assert buf.try_acquire(1, tokens=1) == []
    buf.add_group(b, ["x", "y"], lengths=[25, 25])
    buf.add_group(c, ["x", "y"], lengths=[5, 5])
    assert buf.stats()["tokens"] == 90
    with pytest.raises(rs.Timeout):
        buf.sample(timeout=0.05)  # 90 < 100 tokens complete
    buf2 = RolloutBuffer(64, batch_tokens=50, max_staleness=1, pacing=False)
    for n in (30, 10, 40, 5):
        buf2.add(list(range(n)))
    batch = buf2.sample()
    assert batch.lengths.tolist() == [30, 10, 40] and batch.tokens == 80  # whole groups until >= 50 tokens
    with pytest.raises(InvalidRequest):
        RolloutBuffer(64, batch_tokens=100, max_staleness=0)  # pacing by tokens needs group_tokens
    with pytest.raises(InvalidRequest):
        RolloutBuffer(64, batch_size=2, batch_tokens=100, max_staleness=0, group_tokens=10)
    with pytest.raises(InvalidRequest):
        buf.acquire(1, tokens=101)  # more than the budget ever admits


def test_pause_batches_and_cancellations_survive_a_restart(tmp_path):
    cfg = RolloutBufferConfig(64, batch_size=4, max_staleness=0, group_size=2, path=str(tmp_path / "j"))
    buf = cfg.build("r")
    a, b = buf.acquire(1, overprovision=1)
    [c] = buf.acquire(1)
    buf.pause()
    buf.close()
    buf = cfg.build("r")  # restarted: paused, one over-provisioned batch open
    assert buf.try_acquire(1) == [] and buf.stats()["budget"]["paused"]
    with pytest.raises(InvalidRequest):
        buf.pause()
    buf.add_group(a, ["a0", "a1"])  # the batch is full: b is cancelled
    with pytest.raises(rs.TicketCancelled):
        buf.add("late", group=b)
    buf.close()
    buf = cfg.build("r")  # and the cancellation is remembered
    with pytest.raises(rs.TicketCancelled):
        buf.renew(b)
    assert buf.held(c)
    buf.resume()
    assert buf.try_acquire(1)
    buf.close()
