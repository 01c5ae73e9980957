"""RolloutBuffer: groups, version ranges, pacing vs dropping, pick policies, measurements, threads."""

import random
import threading
import time

import numpy as np
import pytest
from online_helpers import FakeClock, snapshot

import replaystore as rs
from replaystore.errors import InvalidRequest, UnknownTicket
from replaystore.online import RolloutBuffer, VersionRange


class ListSink:
    def __init__(self):
        self.rows = []

    def write(self, scalars, step):
        self.rows.append((step, scalars))

    def close(self):
        pass


def test_version_range():
    r = VersionRange.start(3).observe(5).observe(4)
    assert r == (3, 5) and r.staleness(7) == 4 and r.staleness(7, "max") == 2
    assert VersionRange.of(2) == (2, 2) and VersionRange.of([1, 4]) == (1, 4)
    for bad in ((3, 1), (-1, 2), (1.5, 2), "3", (1, 2, 3), True):
        with pytest.raises(InvalidRequest):
            VersionRange.of(bad)


def test_groups_complete_out_of_order_and_incomplete_groups_are_never_sampled():
    buf = RolloutBuffer(64, batch_size=2, max_staleness=1, group_size=3)
    a, b = buf.acquire(2)
    assert buf.add("b0", group=b) == "pending"
    assert buf.add("a0", group=a) == "pending"
    assert buf.add("b1", group=b) == "pending"
    assert buf.add("a1", group=a) == "pending"
    with pytest.raises(rs.Timeout):
        buf.sample(1, timeout=0.05)
    assert buf.add("b2", group=b) == "complete"  # b completes first
    batch = buf.sample(1, timeout=1)
    assert batch.group_ids == [b] and batch.data == ["b0", "b1", "b2"]
    with pytest.raises(rs.Timeout):
        buf.sample(1, timeout=0.05)  # a is still missing a member
    assert buf.add("a2", group=a) == "complete"
    assert buf.sample(1, timeout=1).data == ["a0", "a1", "a2"]


def test_bad_input_raises_named_errors_and_changes_nothing():
    buf = RolloutBuffer(8, batch_size=2, max_staleness=1, group_size=2)
    [t] = buf.acquire(1)
    buf.add("x", group=t, length=3)
    before = snapshot(buf)
    bad_calls = [
        lambda: buf.add("y", group=t, versions=(3, 1)),  # min > max
        lambda: buf.add("y", group=t, versions=(-1, 0)),
        lambda: buf.add("y", group=t, versions=1.5),
        lambda: buf.add("y", group=t, length=-1),
        lambda: buf.add("y", group=t, length=2.5),
        lambda: buf.add("y", group=t, group_size=3),  # differs from the group's size
        lambda: buf.add("y", group=t, group_size=9),  # larger than the buffer
        lambda: buf.add("y", group=t, group_size=0),
        lambda: buf.add("y", group=12345),  # never acquired
        lambda: buf.add("y", group=[t]),  # not hashable
        lambda: buf.add("y"),  # pacing needs a ticket
        lambda: buf.sample(0),
        lambda: buf.sample(-2),
        lambda: buf.sample(1.0),
        lambda: buf.sample(9),
        lambda: buf.sample(5),  # more than (max_staleness + 1) * batch_size
        lambda: buf.acquire(0),
        lambda: buf.acquire(-1),
        lambda: buf.abandon([777]),
        lambda: buf.renew([777]),
        lambda: buf.set_version(-1),
    ]
    for call in bad_calls:
        with pytest.raises(rs.ReplayError) as e:
            call()
        assert isinstance(e.value, (InvalidRequest, UnknownTicket)), e.value
        assert snapshot(buf) == before
    with pytest.raises(InvalidRequest):
        RolloutBuffer(4, group_size=5)  # a group larger than the table
    with pytest.raises(InvalidRequest):
        RolloutBuffer(4, pick="lifo")
    with pytest.raises(InvalidRequest):
        RolloutBuffer(4, max_staleness=1, staleness_end="mid")
    with pytest.raises(InvalidRequest):
        RolloutBuffer(4, batch_size=2, pacing=True)
    free = RolloutBuffer(4, max_staleness=1)
    with pytest.raises(InvalidRequest):
        free.acquire(1)  # no pacing
    with pytest.raises(InvalidRequest):
        free.add("x", group_size=2)  # a group needs an id


def test_staleness_end_min_drops_what_end_max_keeps():
    for end, expect in (("min", "stale"), ("max", "complete")):
        buf = RolloutBuffer(8, max_staleness=1, staleness_end=end)
        buf.set_version(3)
        assert buf.add("partial", versions=(1, 3)) == expect  # continued across versions 1..3
        assert buf.stats()["groups_dropped_stale"] == (1 if end == "min" else 0)


def test_partial_rollout_keeps_its_range_and_is_dropped_when_the_version_moves():
    buf = RolloutBuffer(8, max_staleness=1, length_buckets=(4, 16))
    buf.add([0] * 20, versions=VersionRange.start(0).observe(1))
    buf.add([0] * 2, versions=1)
    assert buf.set_version(2) == 1  # the (0, 1) rollout is 2 behind by its oldest end
    batch = buf.sample(1, timeout=1)
    assert batch.min_versions.tolist() == [1] and batch.staleness().tolist() == [1]
    s = buf.stats()
    assert s["dropped_by_length"] == {">=16": 1} and s["dropped"] == {"stale": 1}
    assert s["trained_by_length"] == {"0-3": 1} and s["trained_staleness"] == {"1": 1}


def test_pick_policies():
    def filled(pick, seed=0):
        buf = RolloutBuffer(16, max_staleness=10, pick=pick, seed=seed)
        for v in (0, 3, 1, 2):  # arrival order 0..3, versions as given
            buf.add(f"v{v}", versions=v)
        buf.set_version(3)
        return buf

    assert filled("fifo").sample(2).data == ["v0", "v3"]
    assert filled("freshest").sample(2).data == ["v3", "v2"]
    seen = set()
    for seed in range(30):
        seen.update(filled("uniform", seed).sample(2).data)
    assert seen == {"v0", "v1", "v2", "v3"}


def test_groups_are_evicted_whole_and_counted():
    buf = RolloutBuffer(5, batch_size=4, max_staleness=1, group_size=2)
    tickets = buf.acquire(3)
    for t in tickets:
        buf.add("a", group=t)
        buf.add("b", group=t)
    s = buf.stats()
    assert s["rollouts"] == 4 and s["groups"] == 2 and s["groups_dropped_evicted"] == 1
    assert s["budget"]["discarded"] == 1 and s["budget"]["accepted"] == 2
    assert sorted(buf.sample(2).group_ids) == tickets[1:]


def test_max_reuse_retires_groups():
    buf = RolloutBuffer(8, max_reuse=2)
    buf.add("x")
    assert buf.sample(1).data == ["x"]
    assert buf.sample(1).data == ["x"]
    assert len(buf) == 0 and buf.stats()["groups_retired"] == 1


def test_dead_producer_ticket_expires_and_its_partial_group_is_dropped():
    clock = FakeClock()
    buf = RolloutBuffer(8, batch_size=1, max_staleness=0, group_size=2, ticket_ttl=10, clock=clock)
    [t] = buf.acquire(1)
    buf.add("first", group=t)
    assert buf.try_acquire(1) == []
    clock.t += 11
    [t2] = buf.try_acquire(1)  # the expired ticket's capacity is back
    s = buf.stats()
    assert s["groups_dropped_expired"] == 1 and s["pending_groups"] == 0
    with pytest.raises(UnknownTicket):
        buf.add("second", group=t)  # the dead producer's late member
    buf.add("x", group=t2)
    buf.renew([t2])


def test_group_timeout_drops_incomplete_groups_and_abandons_their_ticket():
    clock = FakeClock()
    buf = RolloutBuffer(8, batch_size=1, max_staleness=0, group_size=2, group_timeout=5, clock=clock)
    [t] = buf.acquire(1)
    buf.add("a", group=t)
    clock.t += 6
    buf.expire()
    s = buf.stats()
    assert s["groups_dropped_incomplete"] == 1 and s["budget"]["abandoned"] == 1
    assert buf.try_acquire(1) != []


def test_close_wakes_a_waiting_sample():
    buf = RolloutBuffer(8)
    errs = []

    def wait():
        try:
            buf.sample(1, timeout=60)
        except rs.Closed as e:
            errs.append(e)

    th = threading.Thread(target=wait)
    th.start()
    time.sleep(0.1)
    buf.close()
    th.join(60)
    assert len(errs) == 1


def test_report_writes_the_window_to_sinks():
    sink = ListSink()
    buf = RolloutBuffer(8, batch_size=1, max_staleness=0, sinks=[sink], length_buckets=(10,))
    [t] = buf.acquire(1)
    buf.add([1] * 12, group=t)
    buf.sample(1)
    scalars = buf.report()
    assert sink.rows == [(0, scalars)]
    assert scalars["online/trained_by_length/>=10"] == 1.0
    assert scalars["online/trained_staleness/0"] == 1.0
    assert scalars["online/acquires"] == 1.0
    assert "online/trained_by_length/>=10" not in buf.report()  # a new window


def run_async_loop(
    pacing: bool, drop: bool, steps: int = 20, batch: int = 4, staleness: int = 1, seed: int = 0, pick: str = "fifo"
):
    """Producer threads of different speeds and lengths, groups of 2 whose members come from
    different threads, versions bumped mid-rollout; returns what the trainer saw."""
    buf = RolloutBuffer(
        256,
        batch_size=batch,
        max_staleness=staleness,
        pacing=pacing,
        drop_stale=drop,
        group_size=2,
        pick=pick,
        length_buckets=(8, 32),
    )
    stop = threading.Event()
    violations, trained = [], []
    groups_open = []  # tickets/ids started, whose 2nd member is sent by another thread
    lock = threading.Lock()
    ids = iter(range(10**9))

    def producer(i):
        rnd = random.Random(seed * 100 + i)
        while not stop.is_set():
            if pacing:
                try:
                    [gid] = buf.acquire(1, timeout=0.05, holder=f"p{i}")
                except (rs.Timeout, rs.Closed):
                    continue
                s = buf.budget.stats()
                if s["running"] + s["accepted"] > s["limit"]:
                    violations.append(s)
            else:
                with lock:
                    gid = next(ids)
            for _member in range(2):
                v0 = buf.version
                length = rnd.choice([2, 4, 40]) * (i + 1)
                time.sleep(length * 0.0002)  # longer rollouts take longer; versions move meanwhile
                try:
                    buf.add(
                        {"g": gid, "len": length},
                        group=gid,
                        versions=VersionRange.start(v0).observe(buf.version),
                        length=length,
                    )
                except rs.Closed:
                    return

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    try:
        for v in range(steps):
            b = buf.sample(batch, timeout=60)
            trained.append(b)
            time.sleep(0.002)
            buf.set_version(v + 1)
    finally:
        stop.set()
        buf.close()
        for th in threads:
            th.join(5)
    return buf, trained, violations, groups_open


@pytest.mark.parametrize("pick,staleness", [("fifo", 1), ("in_order", 1), ("in_order", 3)])
def test_pacing_trains_nothing_stale_and_drops_nothing(pick, staleness):
    buf, trained, violations, _ = run_async_loop(pacing=True, drop=True, pick=pick, staleness=staleness)
    assert not violations
    s = buf.stats()
    assert s["rollouts_dropped"] == 0 and s["groups_dropped_stale"] == 0
    for b in trained:
        assert len(b) == 4
        assert (b.staleness("min") <= staleness).all()
        for g in b.groups:  # whole groups, members of one group only
            assert len(g.members) == 2 and {m.data["g"] for m in g.members} == {g.group_id}
    assert max(int(k) for k in s["trained_staleness"]) <= staleness


def test_drop_only_never_trains_stale_data_but_drops_it():
    buf, trained, _, _ = run_async_loop(pacing=False, drop=True, steps=12)
    for b in trained:
        assert (b.staleness("min") <= 1).all()
        for g in b.groups:
            assert len(g.members) == 2
    s = buf.stats()
    assert s["groups_dropped_stale"] > 0
    assert sum(s["dropped_by_length"].values()) == s["rollouts_dropped"]
    lens = np.concatenate([b.lengths for b in trained])
    assert len(lens) == 12 * 4 * 2


def test_keep_alive_renews_a_slow_producers_ticket():
    from replaystore.online import KeepAlive

    # a TTL of 1 s: a renewal thread late by 0.95 s (a loaded machine) still keeps the ticket
    buf = RolloutBuffer(8, batch_size=1, max_staleness=0, group_size=2, ticket_ttl=1.0)
    [t] = buf.acquire(1)
    with KeepAlive(buf, [t], every=0.05) as ka:
        buf.add("a", group=t)
        time.sleep(2.0)  # twice the TTL (a duration to let pass): alive thanks to the renewals
        assert buf.add("b", group=t) == "complete"
    assert ka.renewals >= 3 and buf.stats()["budget"]["expired"] == 0
    [t2] = buf.try_acquire(1) or [None]
    assert t2 is None  # the budget (batch 1, staleness 0) is spent until the version moves
    buf.set_version(1)
    [t3] = buf.acquire(1, timeout=1)
    time.sleep(1.2)  # past the TTL, no keep-alive: expires
    buf.expire()
    assert buf.stats()["budget"]["expired"] == 1
    with pytest.raises(InvalidRequest):
        KeepAlive(buf, [t3], every=0)
