"""Table.update_fields: rewrite some payload fields of live items by key (in-process and shared).

Every mode runs it through the conformance suite (tests/conformance); here: its semantics against
a plain model (hypothesis), its refusals (nothing changes, counters included), and that a
checkpoint and a second process's handle see the rewritten rows.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs


def batch(start, n):
    ids = np.arange(start, start + n, dtype=np.int64)
    return {"id": ids, "x": {"v": np.stack([ids, ids], axis=1).astype(np.float32)}}


def snapshot(t):
    keys = t.keys()
    data, _ = t.get(keys)
    st_ = t.stats()
    return keys.tolist(), {k: np.asarray(v).tolist() for k, v in data["x"].items()}, data["id"].tolist(), st_


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("extend"), st.integers(1, 4)),
            st.tuples(st.just("delete"), st.integers(0, 30)),
            st.tuples(st.just("rewrite"), st.lists(st.integers(0, 30), min_size=1, max_size=6)),
        ),
        max_size=30,
    )
)
def test_matches_a_plain_model(ops):
    t = rs.Table(6, seed=0, spec={"id": ((), np.int64), "x": {"v": ((2,), np.float32)}})
    model: dict[int, list[float]] = {}  # key -> the row's x/v
    skipped, nxt = 0, 0
    for op in ops:
        if op[0] == "extend":
            keys = t.extend(batch(nxt, op[1]))
            for k, i in zip(keys.tolist(), range(nxt, nxt + op[1])):
                model[k] = [float(i), float(i)]
            while len(model) > 6:  # Fifo eviction of the oldest keys
                del model[min(model)]
            nxt += op[1]
        elif op[0] == "delete":
            t.delete([op[1]])
            model.pop(op[1], None)
        else:
            keys = np.array(op[1], np.int64)
            rows = np.stack([keys * 10.0, -keys - np.arange(len(keys))], axis=1).astype(np.float32)
            want = len({k for k in op[1] if k in model})
            skipped += len({k for k in op[1] if k not in model})
            assert t.update_fields(keys, {"x": {"v": rows}}) == want
            for k, r in zip(op[1], rows.tolist()):  # the last occurrence wins
                if k in model:
                    model[k] = r
    data, found = t.get(np.array(sorted(model), np.int64))
    assert found.all()
    assert data["x"]["v"].tolist() == [model[k] for k in sorted(model)]
    assert t.stats()["skipped_updates"] == skipped


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"nope": np.zeros(2)}, rs.SpecError),
        ({"x": {"v": np.zeros((2, 3), np.float32)}}, rs.SpecError),  # field shape
        ({"x": {"v": np.zeros((3, 2), np.float32)}}, rs.SpecError),  # one row per key
        ({"x": {"v": np.zeros((2, 2), np.float64)}}, rs.SpecError),  # an array needs the exact dtype
        ({"id": ["a", "b"]}, rs.SpecError),
        ({}, rs.SpecError),
        ([1, 2], rs.SpecError),
    ],
)
def test_bad_input_is_a_named_error_and_changes_nothing(bad, error):
    t = rs.Table(10, sampler=rs.Prioritized(), seed=0)
    keys = t.extend(batch(0, 4))
    before = snapshot(t)
    with pytest.raises(error):
        t.update_fields(keys[:2], bad)
    assert snapshot(t) == before


def test_python_lists_cast_like_extend_and_other_fields_stay():
    t = rs.Table(10, sampler=rs.Prioritized(), seed=0)
    keys = t.extend(batch(0, 3), priorities=[1.0, 2.0, 3.0])
    assert t.update_fields(keys[1:], {"id": [7, 8]}) == 2  # ints to the int64 field
    data, _ = t.get(keys)
    assert data["id"].tolist() == [0, 7, 8]
    assert data["x"]["v"].tolist() == [[0, 0], [1, 1], [2, 2]]
    assert t.info(keys)["priorities"].tolist() == [1.0, 2.0, 3.0]
    assert t.info(keys)["times_sampled"].tolist() == [0, 0, 0]


def test_unsupported_storages_are_refused():
    t = rs.Table(10, storage="objects")
    keys = t.extend([{"a": 1}, {"a": 2}])
    with pytest.raises(rs.Unsupported, match="column storage"):
        t.update_fields(keys, {"a": [3, 4]})
    assert t.get(keys)[0] == [{"a": 1}, {"a": 2}]


def test_closed_table_refuses():
    t = rs.Table(10)
    keys = t.extend(batch(0, 2))
    t.close()
    with pytest.raises(rs.Closed):
        t.update_fields(keys, {"id": np.array([5, 6])})


def test_rewritten_rows_survive_a_checkpoint(tmp_path):
    t = rs.Table(10, episodes=rs.Episodes(), seed=0)
    keys = t.extend_steps(batch(0, 4), streams=[0, 0, 1, 1])
    t.update_fields(keys[[0, 3]], {"x": {"v": np.full((2, 2), 9, np.float32)}})
    t.save(tmp_path / "ckpt")
    loaded = rs.Table.load(tmp_path / "ckpt")
    assert loaded.get(keys)[0]["x"]["v"].tolist() == [[9, 9], [1, 1], [2, 2], [9, 9]]
    assert loaded.episode_info(keys).streams.tolist() == [0, 0, 1, 1]


def test_a_shared_table_rewrite_is_seen_by_another_handle(tmp_path):
    from replaystore.shared import SharedTable

    spec = {"id": ((), np.int64), "x": {"v": ((2,), np.float32)}}
    a = SharedTable.create("uf-shared", 8, spec, directory=tmp_path)
    b = None
    try:
        b = SharedTable.attach("uf-shared", directory=tmp_path)
        keys = a.extend(batch(0, 3))
        assert b.update_fields(keys[1:2], {"x": {"v": np.array([[4, 5]], np.float32)}}) == 1
        assert a.get(keys)[0]["x"]["v"].tolist() == [[0, 0], [4, 5], [2, 2]]
    finally:
        for t in (b, a):
            if t is not None:
                t.close()  # (the last handle out removes the segment)
