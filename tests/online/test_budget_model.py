"""StalenessBudget against a plain reference model, on random operation sequences (hypothesis).

Operations: acquire (with over-provisioning and per-ticket weights: token reservations), finish
(accepted with the units used, or rejected), abandon, discard, credit (a sample's overshoot),
cancel_slowest, pause/resume, new versions and the clock moving (tickets expire by the clock, judged at every call).
"""

from hypothesis import example, given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore.online import StalenessBudget

TTL = 10.0

ops = st.lists(
    st.one_of(
        st.tuples(st.just("try"), st.integers(-1, 5), st.integers(-1, 2), st.integers(0, 3)),
        st.tuples(st.just("finish"), st.integers(0, 12), st.booleans(), st.integers(-1, 4)),
        st.tuples(st.just("abandon"), st.integers(0, 12)),
        st.tuples(st.just("discard"), st.integers(-1, 3)),
        st.tuples(st.just("credit"), st.integers(-1, 3)),
        st.tuples(st.just("version"), st.integers(-1, 2)),
        st.tuples(st.just("cancel"), st.integers(-1, 3)),
        st.tuples(st.just("pause")),
        st.tuples(st.just("resume")),
        st.tuples(st.just("tick"), st.sampled_from([0.5, 4.0, 6.0, 11.0])),
        st.tuples(st.just("renew"), st.integers(0, 12)),
    ),
    max_size=60,
)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.integers(0, 2), ops)
@example(2, 0, [("try", 1, 1, 1), ("finish", 0, True, -1), ("finish", 1, True, -1)])  # a batch fills
@example(
    2,
    1,
    [
        ("try", 2, 1, 1),
        ("tick", 6.0),
        ("renew", 0),
        ("cancel", 1),
        ("finish", 1, True, 3),
        ("tick", 6.0),
        ("finish", 0, True, -1),
    ],
)
def test_budget_matches_reference(batch, staleness, seq):
    clock = Clock()
    b = StalenessBudget(batch, staleness, ttl=TTL, clock=clock)
    held = {}  # id -> [weight, deadline, granted, batch]
    batches = {}  # batch -> [needed, accepted]
    accepted, version, next_id, next_batch, paused = 0, 0, 0, 0, False
    credited = 0  # a sample's overshoot, added to the limit
    overuse = 0  # tokens used beyond a ticket's reservation
    cancelled = set()

    def cancel(ids):
        for i in ids:
            bt = held.pop(i)[3]
            cancelled.add(i)
            forget(bt)

    def forget(bt):
        if bt is not None and bt in batches and not any(r[3] == bt for r in held.values()):
            del batches[bt]

    for op in seq:
        kind = op[0]
        if kind == "tick":
            clock.t += op[1]
        for i in [i for i, r in held.items() if r[1] <= clock.t]:  # expiry by the clock
            forget(held.pop(i)[3])
        b.expire()
        before = b.state()
        try:
            if kind == "try":
                k, m, w = op[1], op[2], op[3]
                got = b.try_acquire(k, overprovision=m, weight=w)
                assert k >= 1 and m >= 0 and w >= 1 and (k + m) * w <= (staleness + 1) * batch
                cap = (staleness + version + 1) * batch + credited - (accepted + sum(r[0] for r in held.values()))
                if not paused and cap >= (k + m) * w:
                    assert got == list(range(next_id, next_id + k + m))
                    assert all(t.version == version for t in got)
                    bt = None
                    if m:
                        bt, next_batch = next_batch, next_batch + 1
                        batches[bt] = [k, 0]
                    for t in got:
                        held[int(t)] = [w, clock.t + TTL, clock.t, bt]
                    next_id += k + m
                else:
                    assert got == []
            elif kind == "finish":
                t, acc, units = op[1], op[2], op[3]
                out = b.finish(t, accepted=acc, units=None if units < 0 else [units])  # a bare ticket
                assert t in held
                w, _, _, bt = held.pop(t)
                expect_cancel = []
                if acc:
                    accepted += w if units < 0 else units
                    overuse += max(0, units - w)
                    if bt is not None and bt in batches:
                        batches[bt][1] += 1
                        if batches[bt][1] >= batches[bt][0]:
                            expect_cancel = sorted(i for i, r in held.items() if r[3] == bt)
                            cancel(expect_cancel)
                            batches.pop(bt, None)
                forget(bt)
                assert sorted(out) == expect_cancel
            elif kind == "abandon":
                b.abandon([op[1]])
                assert op[1] in held
                forget(held.pop(op[1])[3])
            elif kind == "renew":
                b.renew([op[1]])
                assert op[1] in held
                held[op[1]][1] = clock.t + TTL
            elif kind == "discard":
                b.discard(op[1])
                assert 0 <= op[1] <= accepted
                accepted -= op[1]
            elif kind == "credit":
                b.credit(op[1])
                assert op[1] >= 0
                credited += op[1]
            elif kind == "cancel":
                out = b.cancel_slowest(op[1])
                assert op[1] >= 0
                expect = [i for _, i in sorted((r[2], i) for i, r in held.items())[: op[1]]]
                assert out == expect
                cancel(expect)
            elif kind == "pause":
                b.pause()
                assert not paused
                paused = True
            elif kind == "resume":
                b.resume()
                assert paused
                paused = False
            elif kind == "version":
                b.set_version(version + op[1])
                assert op[1] >= 0
                version += op[1]
        except rs.ReplayError as e:
            if kind in ("finish", "abandon", "renew") and op[1] in cancelled and op[1] not in held:
                assert isinstance(e, rs.TicketCancelled)
            after = b.state()
            after["counters"]["acquire_calls"] = before["counters"]["acquire_calls"]
            assert after == before  # a refused operation changes nothing
        assert b.running == len(held) and b.accepted == accepted and b.version == version
        assert b.limit() == (staleness + version + 1) * batch + credited
        assert b.running_units == sum(r[0] for r in held.values()) and b.paused == paused
        for t in range(next_id):
            assert b.held(t) == (t in held)
        assert b.running_units + b.accepted <= b.limit() + overuse  # the budget is never exceeded
