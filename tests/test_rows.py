"""replaystore.rows: the compiled row copies and their NumPy fallback keep one contract."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaystore import rows
from replaystore.rows import _copy_rows_py, _count_samples_py, _fill_meta_py

IMPLS = [("python", _copy_rows_py, _fill_meta_py, _count_samples_py)]
if rows.COMPILED:
    IMPLS.append(("compiled", rows.copy_rows, rows.fill_meta, rows.count_samples))
IDS = [i[0] for i in IMPLS]

DTYPES = [np.float32, np.float64, np.int64, np.int32, np.int8, np.uint8, np.bool_]


def test_the_compiled_version_is_built_here():
    # the README's install builds it (setup.py); the fallback exists for machines without a compiler
    if os.environ.get("REPLAYSTORE_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("REPLAYSTORE_PURE_PYTHON is set")
    assert rows.COMPILED


def test_the_compiled_add_and_extend_are_built_here():
    # replaystore._ring (setup.py, NumPy headers from the build requirements); optional=True hides
    # a failed build, this does not
    if os.environ.get("REPLAYSTORE_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("REPLAYSTORE_PURE_PYTHON is set")
    from replaystore import Table

    assert rows.FastMethod is not None and type(Table.add) is rows.FastMethod and type(Table.extend) is rows.FastMethod


def test_the_core_behaves_the_same_on_the_pure_python_fallback():
    """The table, ring and model tests, in a child process that cannot use the compiled module."""
    if not rows.COMPILED:
        pytest.skip("already running on the fallback")
    env = dict(os.environ, REPLAYSTORE_PURE_PYTHON="1")
    here = Path(__file__).parent
    files = [str(here / f) for f in ("test_table.py", "test_ring.py", "test_table_model.py", "test_storage.py")]
    probe = subprocess.run(
        [sys.executable, "-c", "import replaystore.rows as r; print(r.COMPILED)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "False", probe.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *files],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=here.parent,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


@pytest.mark.parametrize("impl", IMPLS, ids=IDS)
def test_copy_rows_batched_and_single(impl):
    _, copy_rows, _, _ = impl
    cols = (np.zeros((10, 3), np.float32), np.zeros(10, np.int64))
    src = (np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7, 8]))
    assert copy_rows(cols, src, 4, 2, True)
    assert cols[0][4:6].tolist() == [[0, 1, 2], [3, 4, 5]] and cols[1][4:6].tolist() == [7, 8]
    assert copy_rows(cols, (np.ones(3, np.float32), 9), 9, 1, False)
    assert cols[0][9].tolist() == [1, 1, 1] and cols[1][9] == 9


@pytest.mark.parametrize("impl", IMPLS, ids=IDS)
@pytest.mark.parametrize(
    "bad",
    [
        "dtype",
        "row_shape",
        "batch",
        "not_contiguous",
        "range",
        "negative_start",
        "list",
        "count",
        "float_into_int",
        "int_overflow",
        "torch_like",
    ],
)
def test_copy_rows_refuses_and_writes_nothing(impl, bad):
    _, copy_rows, _, _ = impl
    cols = (np.zeros((10, 3), np.float32), np.zeros(10, np.int8))
    ok_first = np.ones((2, 3), np.float32)
    second = np.array([1, 2], np.int8)
    start, n, batched = 2, 2, True
    if bad == "dtype":
        second = np.array([1, 2], np.int16)
    elif bad == "row_shape":
        ok_first = np.ones((2, 4), np.float32)
    elif bad == "batch":
        second = np.array([1, 2, 3], np.int8)
    elif bad == "not_contiguous":
        second = np.array([1, 0, 2, 0], np.int8)[::2]
    elif bad == "range":
        start = 9
    elif bad == "negative_start":
        start = -1
    elif bad == "list":
        second = [1, 2]
    elif bad == "count":
        src = (ok_first, second, second)
    elif bad in ("float_into_int", "int_overflow", "torch_like"):
        batched, n = False, 1
        ok_first = np.ones(3, np.float32)
        second = {"float_into_int": 1.5, "int_overflow": 300, "torch_like": object()}[bad]
    src = (ok_first, second) if bad != "count" else src
    assert copy_rows(cols, src, start, n, batched) is False
    assert not cols[0].any() and not cols[1].any()


@pytest.mark.parametrize("impl", IMPLS, ids=IDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [True, 3, -2, 2.5])
def test_python_scalars_follow_numpy_same_kind(impl, dtype, value):
    """A Python scalar is accepted exactly when NumPy would stage it without a cast error."""
    _, copy_rows, _, _ = impl
    col = np.zeros(4, dtype)
    kind = np.dtype(dtype).kind
    allowed = {bool: "biuf", int: "iuf", float: "f"}[type(value)]
    if kind in "iu" and type(value) is int:  # in range?
        info = np.iinfo(dtype)
        allowed = allowed if info.min <= value <= info.max else ""
    got = copy_rows((col,), (value,), 1, 1, False)
    assert got == (kind in allowed)
    if got:
        assert col[1] == np.array(value).astype(dtype)
        assert col[0] == 0 and col[2] == 0


@pytest.mark.parametrize("impl", IMPLS, ids=IDS)
def test_fill_meta_and_count_samples(impl):
    _, _, fill_meta, count_samples = impl
    meta = np.zeros((8, rows.META_WIDTH), np.int64)
    times, versions, priorities = rows.meta_columns(meta)
    fill_meta(meta, 2, 3, -7, 0.25)
    assert versions[2:5].tolist() == [-7, -7, -7]
    assert priorities[2:5].tolist() == [0.25] * 3
    assert not meta[[0, 1, 5, 6, 7]].any()
    slots = np.array([3, 3, 2, 3], np.int64)
    out = np.full((4, 4), -5, np.int64)
    count_samples(meta, slots, out)
    assert times.tolist() == [0, 0, 1, 3, 0, 0, 0, 0]
    assert out[:, 0].tolist() == [-5] * 4 and out[:, 1].tolist() == [3, 3, 1, 3]  # (keys: fill_keys)
    assert out[:, 2].tolist() == [-7] * 4 and out.view(np.float64)[:, 3].tolist() == [0.25] * 4
    times[4] = rows.TIMES_SAMPLED_MAX  # a count saturates at int32's largest value
    count_samples(meta, np.array([4, 4], np.int64), np.empty((2, 4), np.int64))
    assert times[4] == rows.TIMES_SAMPLED_MAX


@pytest.mark.skipif(not rows.COMPILED, reason="the compiled module is not built")
def test_compiled_count_samples_refuses_bad_input_before_writing():
    meta = np.zeros((4, rows.META_WIDTH), np.int64)
    out = np.empty((2, 4), np.int64)
    with pytest.raises(ValueError, match="out of range"):
        rows.count_samples(meta, np.array([1, 4], np.int64), out)
    with pytest.raises(ValueError, match="int64"):
        rows.count_samples(meta, np.array([1, 2], np.int32), out)
    for old in (4, 3):  # the old layouts ((capacity, 4), the key in the row) are refused
        with pytest.raises(ValueError, match="meta"):
            rows.count_samples(np.zeros((4, old), np.int64), np.array([1], np.int64), out[:1])
        with pytest.raises(ValueError, match="meta"):
            rows.fill_meta(np.zeros((4, old), np.int64), 0, 1, 0, 1.0)
    with pytest.raises(ValueError, match="int32"):
        rows.fill_meta(meta, 0, 1, 2**31, 1.0)
    assert not meta.any()


@st.composite
def copy_case(draw):
    k = draw(st.integers(1, 3))
    cap = draw(st.integers(1, 6))
    batched = draw(st.booleans())
    n = draw(st.integers(0, 3)) if batched else 1
    start = draw(st.integers(-1, cap))
    cols, srcs = [], []
    for _ in range(k):
        dt = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        cols.append(np.zeros((cap, *shape), dt))
        sdt = dt if draw(st.integers(0, 4)) else draw(st.sampled_from(DTYPES))
        sshape = shape if draw(st.integers(0, 4)) else tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        lead = (n,) if batched else ()
        if not batched and shape == () and draw(st.booleans()):
            srcs.append(draw(st.one_of(st.booleans(), st.integers(-300, 300), st.floats(-10, 10))))
        else:
            srcs.append(np.ones(lead + sshape, sdt))
    return tuple(cols), tuple(srcs), start, n, batched


@pytest.mark.skipif(not rows.COMPILED, reason="the compiled module is not built")
@settings(max_examples=300, deadline=None)
@given(copy_case())
def test_compiled_and_python_copy_rows_agree(case):
    cols, srcs, start, n, batched = case
    a = tuple(c.copy() for c in cols)
    b = tuple(c.copy() for c in cols)
    got_py = _copy_rows_py(a, srcs, start, n, batched)
    got_c = rows.copy_rows(b, srcs, start, n, batched)
    assert got_py == got_c
    for x, y, orig in zip(a, b, cols):
        assert np.array_equal(x, y)
        if not got_c:
            assert np.array_equal(y, orig)


GATHERS = [("python", rows._gather_rows_py)] + ([("compiled", rows.gather_rows)] if rows.COMPILED else [])


@pytest.mark.parametrize("impl", GATHERS, ids=[g[0] for g in GATHERS])
def test_gather_rows_with_and_without_counting(impl):
    _, gather = impl
    cols = (np.arange(30, dtype=np.float32).reshape(10, 3), np.arange(10, 20))
    slots = np.array([9, 0, 3, 3], np.int64)
    outs = (np.empty((4, 3), np.float32), np.empty(4, np.int64))
    assert gather(cols, slots, outs)
    assert outs[0][:, 0].tolist() == [27, 0, 9, 9] and outs[1].tolist() == [19, 10, 13, 13]
    meta = np.zeros((10, rows.META_WIDTH), np.int64)
    rows.meta_columns(meta)[1][:] = np.arange(10)  # (versions)
    mo = np.empty((4, 4), np.int64)
    assert gather(cols, slots, outs, meta, mo)
    assert mo[:, 2].tolist() == [9, 0, 3, 3] and mo[:, 1].tolist() == [1, 1, 2, 2]
    for bad_slots, bad_outs in [
        (np.array([10], np.int64), (np.empty((1, 3), np.float32), np.empty(1, np.int64))),  # out of range
        (np.array([-1], np.int64), (np.empty((1, 3), np.float32), np.empty(1, np.int64))),
        (np.array([1], np.int64), (np.empty((1, 3), np.float64), np.empty(1, np.int64))),  # dtype
        (np.array([1], np.int64), (np.empty((2, 3), np.float32), np.empty(2, np.int64))),  # length
    ]:
        before = meta.copy()
        assert gather(cols, bad_slots, bad_outs, meta, np.empty((len(bad_slots), 4), np.int64)) is False
        assert np.array_equal(meta, before)


@pytest.mark.skipif(not rows.COMPILED, reason="the compiled module is not built")
@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 50),
    st.lists(st.integers(0, 49), max_size=40),
    st.sampled_from(DTYPES),
    st.lists(st.integers(1, 4), max_size=2),
)
def test_compiled_gather_matches_numpy_take(cap, slots, dtype, shape):
    rng = np.random.default_rng(0)
    col = (rng.random((cap, *shape)) * 100).astype(dtype)
    s = np.array([x % cap for x in slots], np.int64)
    out = (np.empty((len(s), *shape), dtype),)
    meta, meta2 = np.zeros((cap, rows.META_WIDTH), np.int64), np.zeros((cap, rows.META_WIDTH), np.int64)
    rows.meta_columns(meta)[1][:] = rows.meta_columns(meta2)[1][:] = np.arange(cap) - 3  # versions
    mo, mo2 = np.zeros((len(s), 4), np.int64), np.zeros((len(s), 4), np.int64)
    assert rows.gather_rows((col,), s, out, meta, mo)
    assert np.array_equal(out[0], col.take(s, axis=0))
    _count_samples_py(meta2, s, mo2)
    assert np.array_equal(meta, meta2) and np.array_equal(mo, mo2)


ADDS = [("python", rows._add_row_py)] + ([("compiled", rows.add_row)] if rows.COMPILED else [])


@pytest.mark.parametrize("impl", ADDS, ids=[a[0] for a in ADDS])
def test_add_row_copies_one_item_and_its_metadata_or_nothing(impl):
    _, add_row = impl
    cols = (np.zeros((5, 2), np.float32), np.zeros(5, np.int64))
    meta = np.zeros((5, rows.META_WIDTH), np.int64)
    assert add_row(cols, (np.ones(2, np.float32), 7), 3, meta, 9, 0.5)
    assert cols[0][3].tolist() == [1, 1] and cols[1][3] == 7
    assert [int(c[3]) for c in rows.meta_columns(meta)[:2]] == [0, 9] and rows.meta_columns(meta)[2][3] == 0.5
    before = [c.copy() for c in cols], meta.copy()
    assert add_row(cols, (np.ones(2, np.float64), 7), 1, meta, 9, 0.5) is False  # wrong dtype
    assert add_row(cols, (np.ones(2, np.float32), 7.5), 1, meta, 9, 0.5) is False  # float into int
    assert all(np.array_equal(a, b) for a, b in zip(cols, before[0])) and np.array_equal(meta, before[1])


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 1000),
    data=st.data(),
)
def test_ring_draw_compiled_and_python_agree_and_stay_in_the_live_run(capacity, data):
    size = data.draw(st.integers(1, capacity))
    start = data.draw(st.integers(0, capacity - 1))
    u = np.array(data.draw(st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=0, max_size=50)))
    u = np.append(u, np.nextafter(1.0, 0.0))  # the largest uniform: still the run's last slot
    want = (start + np.minimum((u * size).astype(np.int64), size - 1)) % capacity
    outs = []
    for draw in {rows.ring_draw, rows._ring_draw_py}:
        out = np.full(len(u), -1, np.int64)
        draw(u, size, start, capacity, out)
        outs.append(out)
    for out in outs:
        assert np.array_equal(out, want)
    live = (start + np.arange(size)) % capacity
    assert np.isin(outs[0], live).all()


@pytest.mark.skipif(not rows.COMPILED, reason="compiled rows not built")
def test_compiled_ring_draw_refuses_what_does_not_fit():
    u, out = np.zeros(3), np.zeros(3, np.int64)
    for bad in (
        (u.astype(np.float32), 2, 0, 4, out),
        (u, 2, 0, 4, np.zeros(2, np.int64)),
        (u, 0, 0, 4, out),
        (u, 5, 0, 4, out),
        (u, 2, 4, 4, out),
    ):
        with pytest.raises(ValueError, match="ring_draw"):
            rows.ring_draw(*bad)


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 64), data=st.data())
def test_ring_lookup_and_last_occurrences_compiled_and_python_agree(capacity, data):
    lo = data.draw(st.integers(-5, 10**6))
    hi = lo + data.draw(st.integers(0, capacity))
    base = data.draw(st.integers(lo - 3 * capacity, lo))
    keys = np.array(data.draw(st.lists(st.integers(lo - 2 * capacity, hi + 2 * capacity), max_size=40)), np.int64)
    live = (keys >= lo) & (keys < hi)
    want = np.where(live, (keys - base) % capacity, -1)
    slots = want[live]
    last_want = np.array([i == max(j for j in range(len(slots)) if slots[j] == s) for i, s in enumerate(slots)], bool)
    for lookup, last in {(rows.ring_lookup, rows.last_occurrences), (rows._ring_lookup_py, rows._last_occurrences_py)}:
        out = np.empty(len(keys), np.int64)
        lookup(keys, lo, hi, base, capacity, out)
        assert np.array_equal(out, want)
        scratch = np.full(capacity, -1, np.int64)
        mask = np.empty(len(slots), bool)
        assert last(slots, scratch, mask) == bool(last_want.all())
        assert np.array_equal(mask, last_want) and (scratch == -1).all()


@pytest.mark.skipif(not rows.COMPILED, reason="compiled rows not built")
def test_compiled_lookup_kernels_refuse_what_does_not_fit():
    keys, out = np.arange(3), np.zeros(3, np.int64)
    for bad in ((keys.astype(np.int32), 0, 2, 0, 4, out), (keys, 0, 2, 0, 4, out[:2]), (keys, 3, 2, 0, 4, out)):
        with pytest.raises(ValueError, match="ring_lookup"):
            rows.ring_lookup(*bad)
    scratch, mask = np.full(4, -1, np.int64), np.zeros(3, bool)
    for bad in ((np.array([0, 4, 1]), scratch, mask), (keys, scratch, np.zeros(2, bool)), (keys, scratch[:2], mask)):
        with pytest.raises(ValueError, match="last_occurrences"):
            rows.last_occurrences(*bad)
    assert (scratch == -1).all()


@pytest.mark.skipif(not rows.COMPILED, reason="compiled rows not built")
def test_touch_draw_reads_the_rows_a_full_rings_draw_takes_and_writes_nothing():
    meta = np.zeros((10, rows.META_WIDTH), np.int64)
    meta[:, 0] = np.arange(100, 110)  # (word 0: the (times sampled, version) pair)
    before = meta.copy()
    u = np.array([0.0, 0.05, 0.55, 0.999999])
    out = np.empty(4, np.int64)
    rows.ring_draw(u, 10, 0, 10, out)  # a full ring: slot floor(u * capacity)
    assert out.tolist() == [0, 0, 5, 9]
    assert rows.touch_draw(u, meta) == meta[out, 0].sum() and np.array_equal(meta, before)
    empty = np.zeros((0, rows.META_WIDTH), np.int64)
    for bad in ((u.astype(np.float32), meta), (u, np.zeros((10, 3), np.int64)), (u, empty)):
        with pytest.raises(ValueError, match="touch_draw"):
            rows.touch_draw(*bad)


FILLS = [("python", rows._fill_keys_py)] + ([("compiled", rows.fill_keys)] if rows.COMPILED else [])


@pytest.mark.parametrize("impl", FILLS, ids=[f[0] for f in FILLS])
@settings(max_examples=100, deadline=None)
@given(capacity=st.integers(1, 40), data=st.data())
def test_fill_keys_gives_the_ring_arithmetic_or_the_key_column(impl, capacity, data):
    """The keys of sample rows: implicit in ring mode (``RingIndex.keys_of``), else the key column."""
    from replaystore.keys import RingIndex

    _, fill = impl
    ring = RingIndex(capacity, base=data.draw(st.integers(0, 10**6)))
    ring.lo = data.draw(st.integers(ring.base, ring.base + 10**6))
    ring.hi = ring.lo + data.draw(st.integers(1, capacity))
    live = ring.live_slots()
    slots = np.ascontiguousarray(live[data.draw(st.lists(st.integers(0, len(live) - 1), max_size=30))], np.int64)
    out = np.full((len(slots), 4), -3, np.int64)
    fill(out, slots, None, ring.lo, ring.base, capacity)
    assert out[:, 0].tolist() == ring.keys_of(slots).tolist()
    assert (out[:, 1:] == -3).all()  # (the rest of the rows untouched)
    assert sorted(ring.keys_of(live).tolist()) == list(range(ring.lo, ring.hi))
    column = np.arange(capacity, dtype=np.int64) * 7 - 1
    fill(out, slots, column, 0, 0, capacity)
    assert out[:, 0].tolist() == column[slots].tolist()
    if capacity > 1:
        with pytest.raises(ValueError, match="fill_keys"):
            fill(out[:1], np.array([capacity], np.int64), None, ring.lo, ring.base, capacity)


@pytest.mark.parametrize("impl", GATHERS, ids=[g[0] for g in GATHERS])
def test_gather_rows_writes_the_keys_as_fill_keys_when_asked(impl):
    _, gather = impl
    cols = (np.arange(10, dtype=np.int64),)
    slots = np.array([9, 0, 3, 3], np.int64)
    meta = np.zeros((10, rows.META_WIDTH_NO_PRIORITY), np.int64)
    mo = np.full((4, 4), -9, np.int64)
    assert gather(cols, slots, (np.empty(4, np.int64),), meta, mo, None, 17, 5)  # ring: key 17 in slot 2
    assert mo[:, 0].tolist() == [24, 25, 18, 18] and mo[:, 1].tolist() == [1, 1, 2, 2]
    column = np.arange(10, dtype=np.int64) * 3
    assert gather(cols, slots, (np.empty(4, np.int64),), meta, mo, column, 0, 0)
    assert mo[:, 0].tolist() == [27, 0, 9, 9]
    before = meta.copy()
    assert gather(cols, slots, (np.empty(4, np.int64),), meta, mo, column[:5].copy(), 0, 0) is False
    assert np.array_equal(meta, before)
