"""StalenessBudget against a plain reference model, on random operation sequences (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore.online import StalenessBudget

ops = st.lists(st.one_of(
    st.tuples(st.just("try"), st.integers(-1, 7)),
    st.tuples(st.just("finish"), st.integers(0, 30), st.booleans()),
    st.tuples(st.just("abandon"), st.integers(0, 30)),
    st.tuples(st.just("discard"), st.integers(-1, 3)),
    st.tuples(st.just("version"), st.integers(-1, 2)),
), max_size=60)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(0, 2), ops)
def test_budget_matches_reference(batch, staleness, seq):
    b = StalenessBudget(batch, staleness)
    held, accepted, version, next_id = set(), 0, 0, 0
    for op in seq:
        kind = op[0]
        before = b.state()
        try:
            if kind == "try":
                k = op[1]
                got = b.try_acquire(k)
                cap = (staleness + version + 1) * batch - (accepted + len(held))
                assert 1 <= k <= (staleness + 1) * batch
                if cap >= k:
                    assert got == list(range(next_id, next_id + k))
                    held |= set(got)
                    next_id += k
                else:
                    assert got == []
            elif kind == "finish":
                b.finish([op[1]], accepted=op[2])
                assert op[1] in held
                held.discard(op[1])
                accepted += op[2]
            elif kind == "abandon":
                b.abandon([op[1]])
                assert op[1] in held
                held.discard(op[1])
            elif kind == "discard":
                b.discard(op[1])
                assert 0 <= op[1] <= accepted
                accepted -= op[1]
            else:
                b.set_version(version + op[1])
                assert op[1] >= 0
                version += op[1]
        except rs.ReplayError:
            after = b.state()
            after["counters"]["acquire_calls"] = before["counters"]["acquire_calls"]
            assert after == before  # a refused operation changes nothing
        assert b.running == len(held) and b.accepted == accepted and b.version == version
        assert b.running + b.accepted <= b.limit()  # the budget is never exceeded
