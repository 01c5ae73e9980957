"""RolloutBuffer's group writes against a plain model (hypothesis): members added one at a time with
their index, whole groups, retried calls, rejects after scoring and samples, with a journal that
is reopened (a service restart) at random points. No member is ever duplicated or lost."""

from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore.online import RolloutBufferConfig

SIZE = 3

ops = st.lists(
    st.one_of(
        st.tuples(st.just("acquire")),
        st.tuples(st.just("add"), st.integers(0, 5), st.integers(0, SIZE - 1)),
        st.tuples(st.just("group"), st.integers(0, 5)),
        st.tuples(st.just("reject"), st.integers(0, 5)),
        st.tuples(st.just("sample")),
        st.tuples(st.just("restart")),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_group_writes_match_a_model(tmp_path_factory, seq):
    path = str(tmp_path_factory.mktemp("j"))
    cfg = RolloutBufferConfig(64, batch_size=3, max_staleness=1, group_size=SIZE, path=path)
    buf = cfg.build("m")
    held = {}  # ticket -> set of member indices received
    complete = []  # tickets of complete groups, not sampled, not rejected (FIFO by ticket)
    status = {}  # ticket -> "complete" once completed
    sampled, gone = set(), set()
    added = 0
    try:
        for op in seq:
            kind = op[0]
            if kind == "restart":
                buf.close()
                buf = cfg.build("m")
                continue
            if kind == "acquire":
                got = buf.try_acquire(1)
                if got:
                    held[int(got[0])] = set()
                continue
            if kind == "sample":
                if not complete:
                    continue
                batch = buf.sample(1, timeout=1)
                t = min(complete)
                assert batch.group_ids == [t]
                assert batch.data == [f"{t}:{m.index}" for m in batch.rollouts]  # members in arrival order
                assert sorted(m.index for m in batch.rollouts) == list(range(SIZE))
                complete.remove(t)
                sampled.add(t)
                continue
            t = op[1]
            if kind == "reject":
                try:
                    buf.reject(t, "r")
                except rs.ReplayError as e:
                    if t in sampled:
                        assert isinstance(e, rs.AlreadySampled)
                    else:
                        assert t not in held and t not in complete
                    continue
                assert t in held or t in complete
                held.pop(t, None)
                if t in complete:
                    complete.remove(t)
                gone.add(t)
                continue
            idx = [op[2]] if kind == "add" else list(range(SIZE))
            try:
                if kind == "add":
                    out = buf.add(f"{t}:{op[2]}", group=t, index=op[2])
                else:
                    out = buf.add_group(t, [f"{t}:{i}" for i in range(SIZE)])
            except rs.UnknownTicket:
                assert t not in held and t not in status
                continue
            if t in status:  # a retried write of a completed group: answered, nothing added
                assert out == status[t]
                continue
            assert t in held
            new = set(idx) - held[t]
            added += len(new)
            held[t] |= new
            if len(held[t]) == SIZE:
                del held[t]
                status[t] = "complete"
                complete.append(t)
                assert out == "complete"
            else:
                assert out == "pending"
        s = buf.stats()
        assert s["rollouts_added"] == added
        assert s["groups"] == len(complete) and s["pending_groups"] == sum(1 for v in held.values() if v)
        assert s["budget"]["running"] == len(held)
    finally:
        buf.close()
