"""StalenessBudget: AReaL's admission rule, tickets, TTL, bad input, threads."""

import threading
import time

import pytest
from online_helpers import FakeClock

import replaystore as rs
from replaystore.errors import InvalidRequest, UnknownTicket
from replaystore.online import StalenessBudget


def test_admission_follows_the_version_budget():
    b = StalenessBudget(batch_size=4, max_staleness=1)
    assert b.limit() == 8
    t = b.try_acquire(8)
    assert t == list(range(8))
    assert b.try_acquire(1) == []  # (1 + 0 + 1) * 4 - (0 + 8) = 0
    b.finish(t[:4])
    assert b.try_acquire(1) == []  # accepted rollouts still count
    b.set_version(1)
    assert len(b.try_acquire(4)) == 4
    assert b.try_acquire(1) == []
    assert b.stats()["running"] == 8 and b.accepted == 4


def test_rejected_abandoned_and_discarded_rollouts_give_capacity_back():
    b = StalenessBudget(batch_size=2, max_staleness=0)
    t = b.try_acquire(2)
    b.finish([t[0]], accepted=False)
    b.abandon([t[1]])
    assert b.capacity() == 2 and b.accepted == 0
    t = b.try_acquire(2)
    b.finish(t)
    assert b.capacity() == 0
    b.discard(1)
    assert b.capacity() == 1
    c = b.stats()
    assert (c["rejected"], c["abandoned"], c["discarded"], c["accepted_total"]) == (1, 1, 1, 2)


def test_max_running_caps_concurrency():
    b = StalenessBudget(batch_size=8, max_staleness=2, max_running=3)
    assert len(b.try_acquire(3)) == 3
    assert b.try_acquire(1) == []
    with pytest.raises(InvalidRequest):
        b.try_acquire(4)  # can never be granted


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "2", None, 9])
def test_bad_sizes_raise_and_change_nothing(k):
    b = StalenessBudget(batch_size=4, max_staleness=1)
    b.try_acquire(2)
    before = b.state()
    with pytest.raises(InvalidRequest) as e:
        b.try_acquire(k)
    assert isinstance(e.value, rs.ReplayError) and isinstance(e.value, ValueError)
    with pytest.raises(InvalidRequest):
        b.acquire(k, timeout=0.01)
    assert b.state() == before


def test_finishing_tickets_never_acquired_raises_and_changes_nothing():
    b = StalenessBudget(batch_size=4, max_staleness=1)
    t = b.try_acquire(2)
    before = b.state()
    for bad in ([99], [t[0], 99], [t[0], t[0]]):
        with pytest.raises((UnknownTicket, InvalidRequest)):
            b.finish(bad)
        with pytest.raises((UnknownTicket, InvalidRequest)):
            b.abandon(bad)
        with pytest.raises((UnknownTicket, InvalidRequest)):
            b.renew(bad)
    assert b.state() == before
    b.finish(t)
    with pytest.raises(UnknownTicket) as e:  # already finished
        b.finish([t[0]])
    assert isinstance(e.value, KeyError)
    with pytest.raises(InvalidRequest):
        b.discard(3)
    with pytest.raises(InvalidRequest):
        b.discard(-1)
    with pytest.raises(InvalidRequest):
        b.set_version(-1)
    b.set_version(2)
    with pytest.raises(InvalidRequest):
        b.set_version(1)
    with pytest.raises(InvalidRequest):
        StalenessBudget(batch_size=0, max_staleness=1)
    with pytest.raises(InvalidRequest):
        StalenessBudget(batch_size=2, max_staleness=-1)


def test_acquire_waits_for_a_version_and_times_out_cleanly():
    b = StalenessBudget(batch_size=2, max_staleness=0)
    b.finish(b.try_acquire(2))
    before = b.state()
    t0 = time.monotonic()
    with pytest.raises(rs.Timeout):
        b.acquire(1, timeout=0.1)
    assert time.monotonic() - t0 >= 0.09
    after = b.state()
    assert after["tickets"] == before["tickets"] and after["accepted"] == before["accepted"]
    got = []
    th = threading.Thread(target=lambda: got.append(b.acquire(2, timeout=60)))
    th.start()
    time.sleep(0.1)
    assert not got
    b.set_version(1)
    th.join(60)
    assert got == [[2, 3]]
    assert b.stats()["producer_wait_s"] >= 0.09


def test_close_wakes_waiters():
    b = StalenessBudget(batch_size=1, max_staleness=0)
    b.try_acquire(1)
    err = []

    def wait():
        try:
            b.acquire(1, timeout=60)
        except rs.Closed as e:
            err.append(e)

    th = threading.Thread(target=wait)
    th.start()
    time.sleep(0.05)
    b.close()
    th.join(60)
    assert len(err) == 1


def test_tickets_of_a_dead_holder_come_back_after_their_ttl():
    clock = FakeClock()
    b = StalenessBudget(batch_size=2, max_staleness=0, ttl=10.0, clock=clock)
    live, dead = b.try_acquire(1, holder="live"), b.try_acquire(1, holder="dead")
    assert b.try_acquire(1) == []
    clock.t += 6
    b.renew(live)
    clock.t += 6  # dead's ticket is 12 s old; live's was renewed 6 s ago
    assert b.capacity() == 1
    assert b.expire() == dead
    assert b.expire() == []  # reported once
    with pytest.raises(UnknownTicket):
        b.finish(dead)
    b.finish(live)
    assert b.stats()["expired"] == 1


def test_acquire_wakes_when_a_ticket_expires():
    b = StalenessBudget(batch_size=1, max_staleness=0, ttl=0.2)
    b.try_acquire(1)
    t0 = time.monotonic()
    assert b.acquire(1, timeout=60) == [1]
    assert 0.15 < time.monotonic() - t0 < 40  # woken by the expiry, not at the end of the timeout


def test_state_round_trip():
    clock = FakeClock()
    b = StalenessBudget(batch_size=3, max_staleness=1, ttl=30, clock=clock)
    t = b.try_acquire(4, holder="p")
    b.finish(t[:2])
    b.set_version(1)
    c = StalenessBudget(batch_size=3, max_staleness=1, ttl=30, clock=clock)
    c.load_state(b.state())
    assert c.state() == b.state()
    assert c.capacity() == b.capacity()
    c.finish(t[2:])
    assert c.try_acquire(1) == [4]  # ids continue


def test_budget_is_never_exceeded_under_threads():
    b = StalenessBudget(batch_size=4, max_staleness=1, max_running=6)
    stop = threading.Event()
    violations = []

    def producer(i):
        while not stop.is_set():
            try:
                t = b.acquire(1 + i % 2, timeout=0.05)
            except rs.Timeout:
                continue
            s = b.stats()
            if s["running"] + s["accepted"] > s["limit"] or s["running"] > 6:
                violations.append(s)
            time.sleep(0.001 * (i + 1))
            b.finish(t, accepted=i != 3)

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    v, deadline = 0, time.monotonic() + 60
    while v < 29 or b.stats()["accepted_total"] <= 20:  # (a loaded machine's producers may lag)
        assert time.monotonic() < deadline, b.stats()
        time.sleep(0.01)
        v += 1
        b.set_version(v)
    stop.set()
    for th in threads:
        th.join(5)
    assert not violations
    s = b.stats()
    assert s["accepted"] <= s["limit"] and s["accepted_total"] > 20
