"""Token reservations are limits (issue 37 item 2): a group over its reservation is refused, so the
budget's bound ``accepted + running <= limit`` and the staleness bound in tokens hold."""

import numpy as np
import pytest

import replaystore as rs
from replaystore.online import RolloutBuffer, StalenessBudget


def token_buffer(**kw):
    kw.setdefault("group_size", 2)
    return RolloutBuffer(capacity=4096, batch_tokens=100, group_tokens=40, max_staleness=1, **kw)


def test_a_group_over_its_reservation_is_refused_and_changes_nothing():
    buf = token_buffer()
    [t] = buf.acquire(1)
    before = buf.stats()
    with pytest.raises(rs.OverReservation, match="41 tokens"):
        buf.add_group(t, ["x", "y"], lengths=[40, 1])
    assert buf.stats() == before and buf.held(t)
    assert buf.add(["x"] * 30, group=t, index=0) == "pending"  # members one at a time: the sum counts
    with pytest.raises(rs.OverReservation):
        buf.add(["y"] * 11, group=t, index=1)
    assert buf.num_pending == 1 and buf.stats()["rollouts_added"] == 1
    assert buf.add(["y"] * 10, group=t, index=1) == "complete"  # exactly the reservation
    [u] = buf.acquire(1, tokens=80)
    assert buf.add_group(u, ["x", "y"], lengths=[40, 40]) == "complete"  # acquire(tokens=) raises it
    assert buf.stats()["budget"]["accepted"] == 120


def test_the_budget_refuses_units_over_a_reservation():
    b = StalenessBudget(100, 1, weight=40)
    [t] = b.acquire(1)
    with pytest.raises(rs.OverReservation):
        b.finish([t], units=[41])
    assert b.held(t) and b.accepted == 0
    b.finish([t], units=[40])
    assert b.accepted == 40


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("pick", ["fifo", "in_order"])
def test_the_staleness_bound_in_tokens_holds(seed, pick):
    """Producers ask for random reservations and produce random lengths, some over (refused, then
    written within); the trainer samples ``batch_tokens`` per version. At every step the budget's
    units stay within its limit, and no sampled group lags more than ``max_staleness`` versions."""
    rng = np.random.default_rng(seed)
    T, s = 100, 1
    buf = RolloutBuffer(
        capacity=4096, batch_tokens=T, group_tokens=40, max_staleness=s, group_size=2, pick=pick, drop_stale=False
    )
    refused = 0
    trained = []
    for _version in range(40):
        while True:  # producers: as many tickets as the budget grants
            got = buf.try_acquire(1, tokens=int(rng.integers(2, 61)))
            if not got:
                break
            [t] = got
            reserved = buf.budget.weight_of(t)
            a = int(rng.integers(1, reserved + 1))
            if rng.random() < 0.3:  # a long tail: over the reservation
                with pytest.raises(rs.OverReservation):
                    buf.add_group(t, ["a", "b"], versions=t.version, lengths=[a, reserved])
                refused += 1
            b = int(rng.integers(0, reserved - a + 1))
            buf.add_group(t, ["a", "b"], versions=t.version, lengths=[a, b])
            st = buf.budget.stats()
            assert st["accepted"] + st["running_units"] <= st["limit"]
        # the trainer: T tokens per version (whole groups: it may take more; the budget credits the
        # overshoot, so T tokens are always there: tests/online/test_token_overshoot.py), then the
        # next version
        batch = buf.sample(timeout=0)
        assert batch.tokens >= T
        trained += list(batch.staleness())
        buf.set_version(buf.version + 1)
    assert refused > 0 and buf.stats()["groups_dropped_stale"] == 0  # pacing alone, nothing dropped
    assert max(trained) <= s
