"""MinHeap/MaxHeap: the compiled tournament tree and the heapq list give the same order.

In one process a heap selector keeps its order in a ``TournamentTree`` when numba is installed
(faster) and in a ``heapq`` list otherwise; both must answer every call alike: the same victims,
the same samples (ties to the oldest key), the same ``peek``.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore.samplers import heap_tree

pytestmark = pytest.mark.skipif(not heap_tree.AVAILABLE, reason="numba not installed: one path only")

ops = st.lists(
    st.tuples(
        st.sampled_from(["extend", "update", "delete", "sample", "clear"]),
        st.integers(1, 12),
        st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5]), min_size=12, max_size=12),
    ),
    max_size=40,
)


def _tables(kind):
    made = []
    for compiled in (True, False):
        heap_tree.AVAILABLE = compiled
        try:
            made.append(rs.Table(16, sampler=rs.Uniform(), remover=kind(), seed=1))
        finally:
            heap_tree.AVAILABLE = True
    return made


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from([rs.MinHeap, rs.MaxHeap]), calls=ops)
def test_tree_and_heapq_agree(kind, calls):
    tree, listed = _tables(kind)
    assert tree.remover._tree is not None and listed.remover._tree is None
    for op, n, prios in calls:
        p = np.array(prios[:n])
        if op == "extend":
            a = tree.extend({"x": np.arange(n)}, priorities=p)
            b = listed.extend({"x": np.arange(n)}, priorities=p)
            np.testing.assert_array_equal(a, b)
        elif op in ("update", "delete") and len(tree):
            keys = np.unique(tree.keys()[:n])
            if op == "update":
                tree.update_priorities(keys, p[: len(keys)])
                listed.update_priorities(keys, p[: len(keys)])
            else:
                tree.delete(keys)
                listed.delete(keys)
        elif op == "clear":
            tree.clear()
            listed.clear()
        np.testing.assert_array_equal(np.sort(tree.keys()), np.sort(listed.keys()))
        if len(tree):
            k = min(n, len(tree))
            np.testing.assert_array_equal(tree.remover.victims(k), listed.remover.victims(k))
            assert tree.remover.peek() == listed.remover.peek()


@pytest.mark.parametrize("kind", [rs.MinHeap, rs.MaxHeap])
def test_heap_sampler_same_order(kind):
    tree = rs.Table(64, sampler=kind(), seed=0)
    heap_tree.AVAILABLE = False
    try:
        listed = rs.Table(64, sampler=kind(), seed=0)
    finally:
        heap_tree.AVAILABLE = True
    rng = np.random.default_rng(0)
    for _ in range(20):
        p = rng.choice([0.25, 1.0, 4.0], size=8)
        tree.extend({"x": np.arange(8)}, priorities=p)
        listed.extend({"x": np.arange(8)}, priorities=p)
        np.testing.assert_array_equal(tree.sample(10).keys, listed.sample(10).keys)
