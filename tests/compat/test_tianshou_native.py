"""The compiled add of replaystore.compat.tianshou (``_native``) against its Python reference path.

The same add sequences go through a buffer with the C helper and one without it (the module
attribute set to None, as when no compiler was available): every return value, stored array and
counter must be equal. Skipped where Tianshou is not installed (docs/compat/tianshou.md).
"""

import contextlib

import numpy as np
import pytest

ts = pytest.importorskip("tianshou.data")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tianshou.data import Batch  # noqa: E402

import replaystore.compat.tianshou as rs  # noqa: E402
from replaystore.compat.tianshou import buffers, common, manager, position_tree  # noqa: E402

native = pytest.importorskip("replaystore.compat.tianshou._native")
from replaystore.compat.tianshou.position_tree import PositionSampler  # noqa: E402


@contextlib.contextmanager
def reference_path():
    """Every compiled path off, as without a C compiler at install time."""
    mods = (manager, buffers, common, position_tree)
    saved = [m._native for m in mods]
    for m in mods:
        m._native = None
    try:
        yield
    finally:
        for m, v in zip(mods, saved):
            m._native = v


def rows(n, t, done, rew_dtype, obs_dtype, extra):
    b = Batch(
        obs=np.full((n, 3), t, dtype=obs_dtype) + np.arange(n)[:, None],
        act=np.arange(n) + t,
        rew=(np.arange(n) + t).astype(rew_dtype),
        terminated=np.asarray(done, dtype=bool),
        truncated=np.zeros(n, bool),
        obs_next=np.full((n, 3), t + 1, dtype=np.float32),
        info=Batch(env_id=np.arange(n)),
    )
    if extra:  # a key the manager drops (not one of Tianshou's reserved keys)
        b.extra = np.ones(n)
    return b


def leaves(batch, prefix=""):
    out = {}
    for k, v in batch.__dict__.items():
        if isinstance(v, Batch):
            out.update(leaves(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def leaves_of(buf, idx):
    with reference_path():  # the per-array gather
        return leaves(buf[idx])


def assert_same(a, b):
    la, lb = leaves(a._meta), leaves(b._meta)
    assert la.keys() == lb.keys()
    for k in la:
        assert la[k].dtype == lb[k].dtype, k
        np.testing.assert_array_equal(la[k], lb[k], err_msg=k)
    for name in ("_lengths", "last_index", "_rs_ins", "_rs_ret", "_rs_len", "_rs_start", "_rs_last"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(np.sort(a.sample_indices(0)), np.sort(b.sample_indices(0)))
    assert len(a.table) == len(b.table)


steps = st.lists(
    st.tuples(
        st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),
        st.integers(0, 15),
        st.sampled_from([np.float64, np.int64, np.float32]),  # int: cast like the reference's astype
        st.sampled_from([np.float32, np.float64]),  # float64 into float32 storage: the NumPy path
        st.booleans(),
        st.booleans(),  # buffer_ids given or not (then all four sub-buffers, in order)
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=30, deadline=None)
@given(steps, st.sampled_from([8, 13]), st.booleans())
def test_vector_add_equals_the_reference_path(steps, total, prioritized):
    def make():
        if prioritized:
            return rs.PrioritizedVectorReplayBuffer(total, 4, alpha=0.6, beta=0.4)
        return rs.VectorReplayBuffer(total, 4)

    results = []
    for use_reference in (True, False):
        buf = make()
        outs = []
        with reference_path() if use_reference else contextlib.nullcontext():
            for t, (ids, bits, rew_dtype, obs_dtype, extra, given_ids) in enumerate(steps):
                if not given_ids:
                    ids = [0, 1, 2, 3]
                done = [(bits >> j) & 1 for j in range(len(ids))]
                batch = rows(len(ids), t, done, rew_dtype, obs_dtype, extra)
                outs.append(buf.add(batch, buffer_ids=ids if given_ids else None))
        results.append((buf, outs))
    (ref, ref_outs), (fast, fast_outs) = results
    for x, y in zip(ref_outs, fast_outs):
        for u, v in zip(x, y):
            assert u.dtype == v.dtype
            np.testing.assert_array_equal(u, v)
    assert_same(fast, ref)
    idx = np.arange(-total, total)
    with np.errstate(divide="ignore", invalid="ignore"):  # (PER: positions never written weigh inf, as Tianshou's)
        got, want = leaves(fast[idx]), leaves_of(ref, idx)
    assert got.keys() == want.keys()
    for k in got:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    if prioritized:
        idx = np.arange(total)
        np.testing.assert_array_equal(fast.weight[idx], ref.weight[idx])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([np.float64, np.float32]), st.booleans()), max_size=25))
def test_single_add_equals_the_reference_path(steps):
    results = []
    for use_reference in (True, False):
        buf = rs.ReplayBuffer(7)
        outs = []
        with reference_path() if use_reference else contextlib.nullcontext():
            for t, (done, obs_dtype, info) in enumerate(steps):
                one = Batch(obs=np.full(2, t, dtype=obs_dtype), act=t, rew=float(t), terminated=done,
                            truncated=False, obs_next=np.full(2, t + 1))  # fmt: skip
                if info:  # a nested key: the first add with it allocates it (Tianshou's path)
                    one.info = Batch(env_id=np.int64(t))
                outs.append(buf.add(one))
        results.append((buf, outs))
    (ref, ref_outs), (fast, fast_outs) = results
    for x, y in zip(ref_outs, fast_outs):
        for u, v in zip(x, y):
            assert u.dtype == v.dtype
            np.testing.assert_array_equal(u, v)
    la, lb = leaves(fast._meta), leaves(ref._meta)
    assert la.keys() == lb.keys()
    for k in la:
        np.testing.assert_array_equal(la[k], lb[k], err_msg=k)
    assert (fast._insertion_idx, len(fast), fast._ep_len, fast._ep_start_idx) == (
        ref._insertion_idx,
        len(ref),
        ref._ep_len,
        ref._ep_start_idx,
    )


def test_put_writes_nothing_when_it_cannot_write_everything():
    meta = Batch(a=np.zeros((5, 2), np.float32), b=Batch(c=np.zeros(5, np.int64)), done=np.zeros(5, bool))
    before = {k: v.copy() for k, v in leaves(meta).items()}
    pos = np.array([1, 3])
    good = Batch(a=np.ones((2, 2), np.float32), b=Batch(c=np.array([7, 8])))
    done = np.array([True, False])
    for bad in (
        Batch(a=np.ones((2, 2), np.float64), b=Batch(c=np.array([7, 8]))),  # dtype differs
        Batch(a=np.ones((2, 3), np.float32), b=Batch(c=np.array([7, 8]))),  # row shape differs
        Batch(a=np.ones((2, 2), np.float32), b=Batch(c=np.array([7, 8]), d=np.ones(2))),  # a new key
        Batch(a=np.ones((2, 2), np.float32)),  # a key missing
        Batch(a=np.ones((2, 2), np.float32), b=np.array([7, 8])),  # an array where a Batch is stored
    ):
        assert native.put(meta, bad, pos, done, None) is False
    assert native.put(meta, good, np.array([1, 5]), done, None) is False  # a position out of range
    assert native.put(meta, good, np.array([-1, 2]), done, None) is False
    assert native.put(meta, Batch(a=meta.a[:2], b=Batch(c=np.array([7, 8]))), pos, done, None) is False  # overlaps
    for k, v in leaves(meta).items():
        np.testing.assert_array_equal(v, before[k])
    assert native.put(meta, good, pos, done, None) is True
    np.testing.assert_array_equal(meta.a[[1, 3]], 1.0)
    np.testing.assert_array_equal(meta.b.c, [0, 7, 0, 8, 0])
    np.testing.assert_array_equal(meta.done, [False, True, False, False, False])


def test_advance_changes_nothing_when_it_declines():
    buf = rs.VectorReplayBuffer(8, 2)
    counters = [c.copy() for c in buf._counters()]
    t, f = np.array([False]), np.array([False])
    assert native.advance(np.array([2]), np.ones(1), t, f, buf._counters()) is None  # no sub-buffer 2
    assert native.advance(np.array([-1]), np.ones(1), t, f, buf._counters()) is None
    assert native.advance(np.array([0]), np.ones(2), t, f, buf._counters()) is None  # lengths differ
    assert native.advance(np.array([0]), np.ones(1), np.ones(1), f, buf._counters()) is None  # float flags
    buf._rs_start[0] = 3  # an episode start beyond the stored transitions: Tianshou's MalformedBufferError
    assert native.advance(np.array([0]), np.ones(1), t, f, buf._counters()) is False
    buf._rs_start[0] = 0
    for a, b in zip(counters, buf._counters()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(IndexError):  # an id out of range: Tianshou's path and its error
        buf.add(rows(1, 0, [0], np.float64, np.float32, False), buffer_ids=[5])


# -- the prioritized sampler's compiled kernels against the reference (replaystore's binary tree) --

tree_ops = st.lists(
    st.tuples(
        st.sampled_from(["write", "set", "draw", "rebuild"]),
        st.lists(st.integers(0, 19), min_size=1, max_size=12),
        st.lists(st.integers(0, 6), min_size=12, max_size=12),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(tree_ops)
def test_native_sampler_equals_the_reference_exactly_where_sums_are_exact(steps):
    # alpha 1 and integer priorities: every sum is exact, so trees and draws must be identical
    ref, fast = (PositionSampler(20, alpha=1.0, seed=3, native=native) for native in (False, True))
    for op, pos, prio in steps:
        p = np.array(prio[: len(pos)], dtype=np.float64)
        pos = np.array(pos, dtype=np.int64)
        if op == "write":
            pos, first = np.unique(pos, return_index=True)
            for s in (ref, fast):
                s.written(pos, p[first])
        elif op == "set":  # repeats, and positions not live: skipped
            outs = [s.set_weights(pos, p, 0.0) for s in (ref, fast)]
            assert outs[0] == outs[1]
        elif op == "rebuild":
            for s in (ref, fast):
                s.rebuild(np.unique(pos), np.full(len(np.unique(pos)), 2.0))
        elif len(ref):
            a, b = ref.draw(17), fast.draw(17)
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(ref._tree.tree, fast._tree.tree)
    assert len(ref) == len(fast) and ref.total_mass() == fast.total_mass()


@settings(max_examples=25, deadline=None)
@given(tree_ops, st.sampled_from([0.4, 0.6]))
def test_native_sampler_equals_the_reference_with_powers(steps, alpha):
    ref, fast = (PositionSampler(20, alpha=alpha, seed=1, native=native) for native in (False, True))
    for op, pos, prio in steps:
        p = np.array(prio[: len(pos)], dtype=np.float64) * 0.37
        pos = np.array(pos, dtype=np.int64)
        if op in ("write", "rebuild"):
            pos, first = np.unique(pos, return_index=True)
            for s in (ref, fast):
                s.written(pos, p[first]) if op == "write" else s.rebuild(pos, p[first])
        else:
            for s in (ref, fast):
                s.set_weights(pos, p * 50, 1e-3)
        # the leaves exactly (both take NumPy's power, as Tianshou's `w ** alpha`); the sums closely
        # (the reference may add in another order)
        np.testing.assert_array_equal(ref.leaves(np.arange(20)), fast.leaves(np.arange(20)))
        np.testing.assert_allclose(ref._tree.tree, fast._tree.tree, rtol=1e-13, atol=0)
        if fast.total_mass() > 0.0:  # the compiled weights: NumPy's power of the drawn leaves, exactly
            drawn, weight = fast.draw_weighted(9, 0.4, 0.0)
            leaves = ref.leaves(drawn)
            np.testing.assert_array_equal(weight, (leaves * (1.0 / leaves.min())) ** -0.4)


def test_native_update_checks_before_writing():
    s = PositionSampler(8, alpha=0.6, seed=0)
    s.written(np.arange(6), 1.0)
    before = s.leaves(np.arange(8)).copy()
    hi, lo = s.set_weights(np.array([0, 1]), np.array([2.0, np.nan]), 1e-6)
    assert not hi < np.inf
    hi, lo = s.set_weights(np.array([0, 1]), np.array([np.inf, 1.0]), 1e-6)
    assert not hi < np.inf
    np.testing.assert_array_equal(s.leaves(np.arange(8)), before)
    with pytest.raises(IndexError):
        s.set_weights(np.array([0, 8]), np.array([1.0, 1.0]), 0.0)
    with pytest.raises(IndexError):
        s.set_weights(np.array([-1]), np.array([1.0]), 0.0)
    np.testing.assert_array_equal(s.leaves(np.arange(8)), before)
    s.set_weights(np.array([7, 2, 2]), np.array([5.0, 3.0, 4.0]), 0.0)  # 7: not live; 2: the last wins
    assert s.leaves(7) == 0.0 and s.leaves(2) == pytest.approx(4.0**0.6, rel=1e-14)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 300), st.integers(1, 40), st.integers(0, 2**31))
def test_gather_equals_take(n, rows, seed):
    rng = np.random.default_rng(seed)
    arrays = (
        rng.standard_normal((rows, 4)).astype(np.float32),
        rng.integers(0, 9, rows),
        rng.random(rows) < 0.5,
        rng.standard_normal((rows, 2, 3)),
    )
    idx = rng.integers(-rows, rows, n)
    got = native.gather(arrays, idx)
    for a, g in zip(arrays, got):
        assert g.dtype == a.dtype and g.shape == (n, *a.shape[1:])
        np.testing.assert_array_equal(g, a.take(idx, axis=0))
    assert native.gather(arrays, np.array([rows])) is None  # out of range: the caller's take raises
    assert native.gather(arrays, np.array([-rows - 1])) is None
    assert native.gather((arrays[0], arrays[1][:-1] if rows > 1 else arrays[1][:0]), idx) is None
    assert native.gather((arrays[0][:, ::2],), idx) is None  # not contiguous


@pytest.mark.parametrize("weight_norm", [True, False])
@pytest.mark.parametrize("native_tree", [True, False])
def test_sample_weights_equal_the_indexed_weights(weight_norm, native_tree, monkeypatch):
    # sample computes the weights from the draw (in C, or from the drawn leaves); buf[indices] from the tree
    if not native_tree:
        monkeypatch.setattr(position_tree, "_native", None)
    buf = rs.PrioritizedVectorReplayBuffer(40, 4, alpha=0.6, beta=0.4, weight_norm=weight_norm)
    for t in range(8):
        buf.add(rows(4, t, [0, 0, 0, t == 7], np.float64, np.float32, False))
    live = buf.sample_indices(0)
    buf.update_weight(live, np.linspace(0.1, 3.0, len(live)))
    assert type(buf.positions_table()._tree).__name__ == ("NativeBinaryTree" if native_tree else "BinaryTree")
    for n in (1, 7, 100):
        batch, idx = buf.sample(n)
        np.testing.assert_allclose(batch.weight, buf[idx].weight, rtol=1e-12)
        got, want_rows = leaves(batch), leaves_of(buf, idx)  # (rows gathered in the draw's call)
        assert got.keys() == want_rows.keys()
        for k, v in want_rows.items():
            assert got[k].dtype == v.dtype
            if k != "weight":  # (compared above)
                np.testing.assert_array_equal(got[k], v, err_msg=k)
        want = buf.get_weight(idx)
        np.testing.assert_allclose(batch.weight, want / want.max() if weight_norm else want, rtol=1e-12)


def descend(tree, uniforms):
    """The binary descent over the stored tree, level by level (the rule of the compiled draw)."""
    base = len(tree) // 2
    below = np.nextafter(tree[1], 0.0)
    t = np.minimum(uniforms * tree[1], below)
    node = np.ones(len(t), dtype=np.int64)
    while node[0] < base:
        left = node * 2
        right = (t >= tree[left]) & (tree[left + 1] > 0.0)
        t -= np.where(right, tree[left], 0.0)
        node = left + right
    return node - base


@pytest.mark.parametrize("capacity", [1, 3, 5, 8, 9, 1000])
def test_native_draw_equals_the_descent_of_the_stored_tree(capacity):
    # the compiled draw sums a node's eight leaves itself instead of reading the two levels above
    # them: the same values as the stored ones, so the same draws (float priorities, inexact sums)
    rng = np.random.default_rng(capacity)
    s = PositionSampler(capacity, alpha=0.6, seed=0, native=True)
    s.written(np.arange(capacity), rng.random(capacity) * 10)
    assert s._tree.tree.ctypes.data % 64 == 0
    tree = s._tree.tree
    base = len(tree) // 2
    for size in (capacity // 2 + 1, 3, 1):
        pos = rng.integers(0, capacity, size)
        s.set_weights(pos, np.where(rng.random(len(pos)) < 0.2, 0.0, rng.random(len(pos))), 0.0)
        # every inner node is the sum of its children, as the updates compute it (also in the
        # three levels an update sums from a leaf's line of eight)
        np.testing.assert_array_equal(tree[1:base], tree[2 : 2 * base : 2] + tree[3 : 2 * base : 2])
        u = rng.random(4000)
        got = native.bin_draw(tree, u)
        if not tree[1] > 0.0:  # (every priority 0: the caller draws uniformly)
            assert got is None
            continue
        np.testing.assert_array_equal(got[0], descend(tree, u))
        np.testing.assert_array_equal(got[1], tree[base + got[0]])
        assert (got[1] > 0.0).all()


def test_sample_with_object_rows_takes_the_per_key_gather():
    # an object array among the stored ones: the compiled call draws but does not gather (rows
    # None), sample then gathers key by key: the same positions, rows and weights
    buf = rs.PrioritizedVectorReplayBuffer(40, 4, alpha=0.6, beta=0.4)
    for t in range(8):
        b = rows(4, t, [0, 0, 0, t == 7], np.float64, np.float32, False)
        b.info.tag = np.array([f"t{t}-{i}" for i in range(4)], dtype=object)
        buf.add(b)
    assert buf._meta.info.tag.dtype == object
    pt = buf.positions_table()
    arrays = common.gather_plan(buf._meta.__dict__)[0]
    out = native.bin_draw(pt._tree.tree, np.linspace(0.0, 0.99, 5), 0.4, 0.0, arrays)
    assert len(out) == 3 and out[2] is None
    batch, idx = buf.sample(50)
    np.testing.assert_array_equal(batch.info.tag, buf._meta.info.tag[idx])
    want = leaves_of(buf, idx)
    for k, v in leaves(batch).items():
        if k != "weight":
            np.testing.assert_array_equal(v, want[k], err_msg=k)
    np.testing.assert_allclose(batch.weight, want["weight"], rtol=1e-12)
