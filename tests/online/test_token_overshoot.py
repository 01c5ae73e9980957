"""Whole groups that overshoot ``batch_tokens`` do not stall a token budget (the overshoot is credited).

A token sample takes whole groups until their tokens reach the target, so it can take more than
``batch_tokens``. Before the credit, the budget's limit grew by ``batch_tokens`` per version while
the trainer consumed more: the buffer drained below a sample's target while the capacity stayed
below a reservation, and producers were refused forever while the trainer waited.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore.online import OnlineJournal, RolloutBuffer, StalenessBudget


def produce_all(buf, rng=None):
    """Producers: take every ticket the budget grants, complete the groups (in random order, with
    random lengths up to the reservation, given ``rng``), and again while that frees capacity."""
    made = 0
    while True:
        tickets = []
        while True:
            got = buf.try_acquire(1)
            if not got:
                break
            tickets += got
        if not tickets:
            return made
        order = range(len(tickets)) if rng is None else rng.permutation(len(tickets))
        for i in order:
            t = tickets[i]
            reserved = buf.budget.weight_of(t)
            n = reserved if rng is None else int(rng.integers(1, reserved + 1))
            buf.add_group(t, ["x"], versions=t.version, lengths=[n])
        made += len(tickets)


def test_groups_overshooting_batch_tokens_do_not_stall_the_budget():
    """The reported case: batch_tokens=100, group_tokens=60, max_staleness=1, every group 60 tokens.
    Without the credit the sample of version 5 timed out with 60 tokens held and a capacity of 40."""
    buf = RolloutBuffer(capacity=4096, batch_tokens=100, group_tokens=60, max_staleness=1, group_size=1)
    consumed = 0
    for v in range(20):
        produce_all(buf)
        batch = buf.sample(timeout=0)  # ready now, or the test fails with rs.Timeout (the stall)
        assert batch.tokens == 120 and max(batch.staleness()) <= 1
        consumed += batch.tokens
        st = buf.budget.stats()
        assert st["credited"] == 20 * (v + 1)  # 120 taken for 100 asked, every version
        assert st["limit"] - consumed == 100  # the limit stays (max_staleness + 1) * T ahead, minus this sample
        buf.set_version(v + 1)
    assert buf.stats()["groups_dropped_stale"] == 0


def test_the_credit_is_validated_and_restored_from_the_state():
    b = StalenessBudget(100, 1, weight=60)
    with pytest.raises(rs.InvalidRequest):
        b.credit(-1)
    with pytest.raises(rs.InvalidRequest):
        b.credit(1.5)
    assert b.credited == 0 and b.limit() == 200
    b.credit(20)
    assert b.limit() == 220 and b.capacity() == 220
    c = StalenessBudget(100, 1, weight=60)
    c.load_state(b.state())
    assert c.credited == 20 and c.limit() == 220
    old = b.state()
    del old["credited"]  # a journal written before the credit existed
    c.load_state(old)
    assert c.credited == 0


def test_a_reopened_buffer_keeps_its_credit(tmp_path):
    kw = dict(capacity=64, batch_tokens=100, group_tokens=60, max_staleness=1, group_size=1)
    buf = RolloutBuffer(journal=OnlineJournal(str(tmp_path)), **kw)
    produce_all(buf)
    assert buf.sample(timeout=0).tokens == 120
    limit = buf.budget.limit()
    buf.close()
    again = RolloutBuffer(journal=OnlineJournal(str(tmp_path)), **kw)
    assert again.budget.credited == 20 and again.budget.limit() == limit
    again.close()


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(5, 120),
    s=st.integers(1, 2),
    frac=st.floats(0.05, 1.0),
    pick=st.sampled_from(["fifo", "in_order"]),
    seed=st.integers(0, 2**16),
)
def test_token_pacing_never_stalls_and_keeps_the_staleness_bound(T, s, frac, pick, seed):
    """Against a plain model: ``limit == (s + version + 1) * T + sum(taken - asked)``, the units held
    plus the capacity stay ``(s + 1) * T`` ahead of what the trainer consumed, the trainer can sample
    at every version (a reservation of at most ``s * T + 1`` tokens always fits while it waits), and
    no group is trained more than ``s`` versions after it was admitted."""
    rng = np.random.default_rng(seed)
    R = max(1, min(s * T + 1, int(frac * (s + 1) * T)))  # group_tokens: at most s * T + 1
    buf = RolloutBuffer(
        capacity=100_000, batch_tokens=T, group_tokens=R, max_staleness=s, group_size=1, pick=pick, drop_stale=False
    )
    consumed = credited = 0
    for v in range(12):
        produce_all(buf, rng)
        st_ = buf.budget.stats()
        assert st_["limit"] == (s + v + 1) * T + credited
        assert buf.stats()["tokens"] + st_["capacity"] == (s + 1) * T + v * T + credited - consumed
        batch = buf.sample(timeout=0)  # never a stall
        assert batch.tokens >= T
        assert max(batch.staleness()) <= s
        consumed += batch.tokens
        credited += batch.tokens - T
        assert buf.budget.credited == credited
        buf.set_version(v + 1)
