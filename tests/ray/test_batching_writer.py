"""BatchingWriter against a plain model: which rows are in the table, in what order, with which priorities.

The writer only needs a client's ``extend``; a local Table is that client here (the Ray clients
have the same ``extend``; tests/ray/test_sharded.py drives the writer through a ShardedClient).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore import ray as rsr

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 0)),
        st.tuples(st.just("extend"), st.integers(1, 7)),
        st.tuples(st.just("flush"), st.integers(0, 0)),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, rows_per_call=st.integers(1, 9))
def test_writer_sends_rows_in_order_once_enough_wait(ops, rows_per_call):
    table = rs.Table(1000, sampler=rs.Prioritized(0.6, 0.4))
    w = rsr.BatchingWriter(table, rows_per_call=rows_per_call)
    sent: list[int] = []  # the model: ids in the table, in order
    waiting: list[int] = []
    next_id = 0
    for op, n in ops:
        if op == "add":
            keys = w.add({"id": next_id, "obs": np.full(2, next_id, np.float32)}, priority=1.0 + next_id)
            waiting.append(next_id)
            next_id += 1
        elif op == "extend":
            ids = np.arange(next_id, next_id + n)
            batch = {"id": ids, "obs": np.repeat(ids[:, None], 2, axis=1).astype(np.float32)}
            keys = w.extend(batch, priorities=1.0 + ids)
            waiting.extend(ids.tolist())
            next_id += n
        else:
            keys = w.flush()
        if op == "flush" or len(waiting) >= rows_per_call:
            assert len(keys) == len(waiting)
            sent.extend(waiting)
            waiting = []
        else:
            assert len(keys) == 0
        assert w.pending == len(waiting)
        assert len(table) == len(sent)
    if not sent:
        return
    keys = table.keys()
    data, _ = table.get(keys)
    assert data["id"].tolist() == sent
    np.testing.assert_array_equal(data["obs"][:, 1], np.asarray(sent, np.float32))
    np.testing.assert_array_equal(table.info(keys)["priorities"], 1.0 + np.asarray(sent))


def test_bad_input_queues_nothing():
    table = rs.Table(100)
    with pytest.raises(rs.InvalidArgument, match="rows_per_call"):
        rsr.BatchingWriter(table, rows_per_call=0)
    w = rsr.BatchingWriter(table, rows_per_call=10)
    w.extend({"x": np.arange(3)})
    with pytest.raises(rs.InvalidArgument, match="every call or with none"):
        w.add({"x": 5}, priority=1.0)
    with pytest.raises(rs.InvalidArgument, match="2 priorities for 3 rows"):
        rsr.BatchingWriter(table).extend({"x": np.arange(3)}, priorities=[1.0, 2.0])
    assert w.pending == 3 and len(table) == 0
    with w:
        w.add({"x": 7})
    assert w.pending == 0 and table.get(table.keys())[0]["x"].tolist() == [0, 1, 2, 7]
