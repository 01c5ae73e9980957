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
from replaystore.compat.tianshou import buffers, manager  # noqa: E402

fastadd = pytest.importorskip("replaystore.compat.tianshou._native")


@contextlib.contextmanager
def reference_path():
    saved = manager._native, buffers._native
    manager._native = buffers._native = None
    try:
        yield
    finally:
        manager._native, buffers._native = saved


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
        assert fastadd.put(meta, bad, pos, done, None) is False
    assert fastadd.put(meta, good, np.array([1, 5]), done, None) is False  # a position out of range
    assert fastadd.put(meta, good, np.array([-1, 2]), done, None) is False
    assert fastadd.put(meta, Batch(a=meta.a[:2], b=Batch(c=np.array([7, 8]))), pos, done, None) is False  # overlaps
    for k, v in leaves(meta).items():
        np.testing.assert_array_equal(v, before[k])
    assert fastadd.put(meta, good, pos, done, None) is True
    np.testing.assert_array_equal(meta.a[[1, 3]], 1.0)
    np.testing.assert_array_equal(meta.b.c, [0, 7, 0, 8, 0])
    np.testing.assert_array_equal(meta.done, [False, True, False, False, False])


def test_advance_changes_nothing_when_it_declines():
    buf = rs.VectorReplayBuffer(8, 2)
    counters = [c.copy() for c in buf._counters()]
    t, f = np.array([False]), np.array([False])
    assert fastadd.advance(np.array([2]), np.ones(1), t, f, buf._counters()) is None  # no sub-buffer 2
    assert fastadd.advance(np.array([-1]), np.ones(1), t, f, buf._counters()) is None
    assert fastadd.advance(np.array([0]), np.ones(2), t, f, buf._counters()) is None  # lengths differ
    assert fastadd.advance(np.array([0]), np.ones(1), np.ones(1), f, buf._counters()) is None  # float flags
    buf._rs_start[0] = 3  # an episode start beyond the stored transitions: Tianshou's MalformedBufferError
    assert fastadd.advance(np.array([0]), np.ones(1), t, f, buf._counters()) is False
    buf._rs_start[0] = 0
    for a, b in zip(counters, buf._counters()):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(IndexError):  # an id out of range: Tianshou's path and its error
        buf.add(rows(1, 0, [0], np.float64, np.float32, False), buffer_ids=[5])
