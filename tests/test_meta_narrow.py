"""The narrow metadata row (issue 36 item 2): a table whose selectors read no priority keeps none.

A table whose sampler and remover (and episode index) all have ``reads_priorities = False``
(``Uniform``, ``Fifo``, ``Lifo``, ``UniformDistinct``, ``WithoutReplacement``) holds 16 bytes of
metadata a slot instead of 24 (8 instead of 16 since the key left the row: implicit in ring
mode): no priority word. What a user sees then: given priorities are
checked as before and still raise ``max_priority``, but every item reports
``rows.UNKEPT_PRIORITY`` (1.0) in ``Sample.priorities``, ``info`` and ``stats``; checkpoints
keep their files (one ``meta_priorities.npy``) and load both ways; a shared segment made with
the 24-byte row for such a table is a ``LayoutMismatch``. The compiled paths and the Python
reference agree on narrow rows (the model test, ``tests/test_table_model.py``, runs every
selector pair, so narrow and wide tables, both ways through ``tests/test_rows.py``).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs
from conftest import transitions
from replaystore import rows
from replaystore.placement import allocate
from replaystore.rows import _copy_rows_py, _count_samples_py, _fill_meta_py, _gather_rows_py
from replaystore.samplers.base import Selector
from replaystore.shared import LayoutMismatch, SharedTable
from replaystore.table import core as table_core

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}
ITEM = {"obs": np.ones(4, np.float32), "action": 1, "reward": 0.5, "id": 7}


class PyTable(rs.Table):
    """The Table with its Python add / extend (the reference; as tests/test_ring_compiled.py)."""

    if rows.FastMethod is not None:
        add = rs.Table.add.__wrapped__
        extend = rs.Table.extend.__wrapped__


class PlainSelector(rs.Uniform):
    """A user's selector that does not declare ``reads_priorities``: it keeps the wide row."""

    reads_priorities = Selector.reads_priorities


@pytest.mark.parametrize(
    "kwargs, width",
    [
        ({}, 1),
        ({"sampler": rs.Fifo(), "remover": rs.Lifo()}, 1),
        ({"sampler": rs.WithoutReplacement(), "remover": rs.Uniform()}, 1),
        ({"sampler": rs.Prioritized(0.6, 0.4)}, 2),
        ({"remover": rs.MinHeap()}, 2),
        ({"sampler": PlainSelector()}, 2),
    ],
    ids=["default", "fifo-lifo", "without-replacement", "prioritized", "minheap-remover", "undeclared"],
)
def test_the_row_is_narrow_only_when_no_selector_reads_priorities(kwargs, width):
    t = rs.Table(50, spec=SPEC, **kwargs)
    assert t._meta.shape == (50, width) and t._meta.nbytes == 50 * 8 * width


@pytest.mark.parametrize("cls", [rs.Table, PyTable], ids=["table", "python-methods"])
def test_a_narrow_table_checks_given_priorities_and_reports_one(cls):
    t = cls(8, spec=SPEC, seed=1)
    t.extend(transitions(3), priorities=[0.5, 4.0, 2.0], version=3)
    t.add(ITEM, priority=9.0, version=4)
    assert t.max_priority == 9.0  # (still the largest given: a new item's default elsewhere)
    before = (t._meta.copy(), t.stats(), t.keys().tolist())
    with pytest.raises(rs.InvalidPriority):
        t.add(ITEM, priority=float("nan"))
    with pytest.raises(rs.InvalidPriority):
        t.extend(transitions(2), priorities=[1.0, float("inf")])
    assert np.array_equal(t._meta, before[0]) and t.stats() == before[1] and t.keys().tolist() == before[2]
    assert t.update_priorities([0, 1, 99], [7.0, 11.0, 3.0]) == 2 and t.max_priority == 11.0
    s = t.sample(16)
    assert s.priorities.dtype == np.float64 and (s.priorities == rows.UNKEPT_PRIORITY).all()
    info = t.info(np.arange(4))
    assert info["priorities"].tolist() == [1.0] * 4 and info["versions"].tolist() == [3, 3, 3, 4]
    assert info["times_sampled"].sum() == 16
    st_ = t.stats()
    assert st_["priority_min"] == st_["priority_max"] == 1.0 and st_["max_priority_seen"] == 11.0


def test_a_narrow_ring_leaves_ring_mode_and_keeps_its_rows():
    t = rs.Table(6, spec=SPEC, seed=2)
    t.extend(transitions(9), version=5)  # wraps: keys 3..8 live
    assert t._ring is not None
    drawn = t.sample(10).keys.tolist()
    t.delete([5])  # out of insertion order: ring mode ends
    assert t._ring is None
    assert t.keys().tolist() == [3, 4, 6, 7, 8]
    assert t.add(ITEM, priority=3.0) == 9
    info = t.info([3, 4, 6, 7, 8, 9])
    assert info["found"].all() and info["priorities"].tolist() == [1.0] * 6
    assert info["versions"].tolist() == [5] * 5 + [0]
    assert info["times_sampled"].tolist() == [drawn.count(k) for k in (3, 4, 6, 7, 8, 9)]
    data, found = t.get([3, 8, 9])
    assert found.all() and data["id"].tolist() == [3, 8, 7]


@pytest.mark.parametrize("saved_wide", [True, False], ids=["wide-checkpoint", "narrow-checkpoint"])
def test_checkpoints_load_both_ways(tmp_path, monkeypatch, saved_wide):
    with monkeypatch.context() as m:
        m.setattr(rs.Uniform, "reads_priorities", saved_wide)
        m.setattr(rs.Fifo, "reads_priorities", saved_wide)
        t = rs.Table(16, spec=SPEC)
        t.extend(transitions(5), priorities=[1.0, 2.0, 3.0, 4.0, 5.0], version=2)
        t.sample(4)
        assert t._meta.shape[1] == (2 if saved_wide else 1)
        t.save(tmp_path / "ck")
        wide_info = t.info(np.arange(5))
    assert np.load(tmp_path / "ck" / "meta_priorities.npy").dtype == np.float64
    u = rs.Table.load(tmp_path / "ck")  # a narrow table now
    assert u._meta.shape[1] == 1
    info = u.info(np.arange(5))
    assert info["priorities"].tolist() == [1.0] * 5 and u.max_priority == 5.0
    assert info["times_sampled"].tolist() == wide_info["times_sampled"].tolist()
    assert info["versions"].tolist() == [2] * 5
    with monkeypatch.context() as m:  # and a table that keeps priorities loads the narrow file set
        m.setattr(rs.Uniform, "reads_priorities", True)
        u.save(tmp_path / "ck2")
        w = rs.Table.load(tmp_path / "ck2")
        assert w._meta.shape[1] == 2 and w.info(np.arange(5))["priorities"].tolist() == [1.0] * 5


@pytest.mark.parametrize("old_width", [3, 2], ids=["24-byte-row", "16-byte-row-with-key"])
def test_a_shared_narrow_table_and_the_old_segments(tmp_path, monkeypatch, old_width):
    with monkeypatch.context() as m:  # a uniform table's segment before these changes: the key in the row
        m.setattr(table_core, "allocate_rows", lambda cap, *_: allocate("table.meta", (cap, old_width), np.int64, -1))
        old = SharedTable.create("old", 8, SPEC, directory=tmp_path)
    try:
        with pytest.raises(LayoutMismatch, match=rf"table\.meta.*\(8, {old_width}\).*\(8, 1\)"):
            SharedTable.attach("old", directory=tmp_path)
    finally:
        old.close()
    new = SharedTable.create("narrow", 8, SPEC, directory=tmp_path)
    other = None
    try:
        assert new._segment.regions["table.meta"][1] == (8, rows.META_WIDTH_NO_PRIORITY)
        for i in range(3):
            new.extend(transitions(4, start=4 * i), version=7)  # wraps: keys 4..11 live
        new.add(ITEM, priority=2.0)
        other = SharedTable.attach("narrow", directory=tmp_path)
        s = other.sample(32)
        assert set(s.keys.tolist()) <= set(range(5, 13)) and (s.priorities == 1.0).all()
        assert np.array_equal(s.data["id"][s.keys < 12], s.keys[s.keys < 12])
        new.delete([8])  # ring mode ends in both processes
        assert other.keys().tolist() == [5, 6, 7, 9, 10, 11, 12]
        assert (other.sample(8).priorities == 1.0).all()
    finally:
        if other is not None:
            other.close()
        new.close()
    wide = SharedTable.create("wide", 8, SPEC, sampler=rs.Prioritized(0.6, 0.4), directory=tmp_path)
    try:
        assert wide._segment.regions["table.meta"][1] == (8, rows.META_WIDTH)
        wide.extend(transitions(3), priorities=[1.0, 2.0, 3.0])
        assert sorted(wide.info([0, 1, 2])["priorities"].tolist()) == [1.0, 2.0, 3.0]
    finally:
        wide.close()


IMPLS = [("python", _copy_rows_py, _fill_meta_py, _count_samples_py, _gather_rows_py)]
if rows.COMPILED:
    IMPLS.append(("compiled", rows.copy_rows, rows.fill_meta, rows.count_samples, rows.gather_rows))


@settings(max_examples=60, deadline=None)
@given(
    cap=st.integers(1, 12),
    data=st.data(),
)
def test_row_functions_agree_on_narrow_rows(cap, data):
    start = data.draw(st.integers(0, cap - 1))
    n = data.draw(st.integers(1, cap - start))
    key, version = data.draw(st.integers(-(2**40), 2**40)), data.draw(st.integers(-(2**31), 2**31 - 1))
    slots = np.array(data.draw(st.lists(st.integers(0, cap - 1), min_size=0, max_size=20)), np.int64)
    col = np.arange(cap * 3, dtype=np.float32).reshape(cap, 3)
    results = []
    for _, copy_rows, fill_meta, count_samples, gather_rows in IMPLS:
        meta = np.full((cap, 1), 5, np.int64)
        hi = np.full(1, -(2**62), np.int64)  # (raised to key, never lowered)
        c = col.copy()
        assert copy_rows((c,), (np.full((n, 3), -1, np.float32),), start, n, True, hi, key)
        fill_meta(meta, start, n, version, 3.5)  # (the priority has nowhere to go)
        out = np.full((len(slots), 4), -7, np.int64)  # (the key column: left to fill_keys)
        count_samples(meta, slots, out)
        g_out, g_meta = np.empty((len(slots), 3), np.float32), np.full((len(slots), 4), -7, np.int64)
        assert gather_rows((c,), slots, (g_out,), meta, g_meta)
        results.append((meta, c, out, g_out, g_meta, hi))
    ref = results[0]
    assert ref[5][0] == key and (ref[2][:, rows.ROW_KEY] == -7).all()
    assert (ref[0].view(np.int32)[start : start + n, rows.META_VERSION] == version).all()
    assert ref[2].shape == (len(slots), 4) and (ref[2][:, rows.ROW_PRIORITY] == rows._UNKEPT_BITS).all()
    for other in results[1:]:
        for a, b in zip(ref, other):
            assert np.array_equal(a, b)


@pytest.mark.skipif(rows.FastMethod is None, reason="the compiled add / extend is not built")
def test_compiled_and_python_single_calls_agree_on_a_narrow_ring():
    a, b = rs.Table(5, spec=SPEC, seed=3), PyTable(5, spec=SPEC, seed=3)
    for t in (a, b):
        t.add(ITEM, priority=2.0, version=1)
        t.extend(transitions(6), version=2)
        t.add(ITEM)
    assert np.array_equal(a._meta, b._meta) and a.max_priority == b.max_priority == 2.0
    assert a.keys().tolist() == b.keys().tolist()
