"""DI-engine's segment tree tests (ding/utils/tests/test_segment_tree.py), ported, plus batch checks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaystore.compat.ding import CompatError, MinSegmentTree, SegmentTree, SumSegmentTree


def test_sum_tree_create():
    with pytest.raises(CompatError):
        SumSegmentTree(capacity=13)
    with pytest.raises(AssertionError):  # CompatError is also what DI-engine raised
        SumSegmentTree(capacity=13)
    tree = SumSegmentTree(capacity=16)
    assert tree.operation == "sum"
    assert tree.neutral_element == 0.0
    assert max(tree.value) == 0.0
    assert min(tree.value) == 0.0


def test_sum_tree_set_get_reduce():
    tree = SumSegmentTree(capacity=4)
    elements = [1, 5, 4, 7]
    got = []
    for idx, val in enumerate(elements):
        tree[idx] = val
        got.append(tree[idx])
    assert got == elements
    assert tree.reduce() == sum(elements)
    for start, end in [(0, 3), (0, 2), (0, 1), (1, 3), (1, 2), (2, 3)]:
        assert tree.reduce(start, end) == sum(elements[start:end])
    with pytest.raises(CompatError):
        tree.reduce(2, 2)
    with pytest.raises(CompatError):
        tree[4] = 1.0


def test_find_prefixsum_idx():
    tree = SumSegmentTree(capacity=8)
    for idx, val in enumerate([0, 0.1, 0.5, 0, 0, 0.2, 0.8, 0]):
        tree[idx] = val
    with pytest.raises(CompatError):
        tree.find_prefixsum_idx(tree.reduce() + 1e-4, trust_caller=False)
    with pytest.raises(CompatError):
        tree.find_prefixsum_idx(-1e-6, trust_caller=False)
    expected = {0: 1, 0.09: 1, 0.1: 2, 0.59: 2, 0.6: 5, 0.799: 5, 0.8: 6, tree.reduce(): 6}
    for mass, idx in expected.items():
        assert tree.find_prefixsum_idx(mass) == idx
    # the same queries as one vectorised call
    masses = np.array(list(expected))
    assert tree.find_prefixsum_idx(masses).tolist() == list(expected.values())


def test_find_prefixsum_idx_on_empty_tree_raises():
    with pytest.raises(CompatError):
        SumSegmentTree(4).find_prefixsum_idx(0.0)


def test_min_tree_create_and_reduce():
    tree = MinSegmentTree(capacity=16)
    assert tree.operation == "min"
    assert tree.neutral_element == np.inf
    assert max(tree.value) == np.inf and min(tree.value) == np.inf
    tree = MinSegmentTree(capacity=4)
    elements = [1, -10, 10, 7]
    got = []
    for idx, val in enumerate(elements):
        tree[idx] = val
        got.append(tree[idx])
    assert got == elements
    assert tree.reduce() == min(elements)
    for start, end in [(0, 3), (0, 2), (0, 1), (1, 3), (1, 2), (2, 3)]:
        assert tree.reduce(start, end) == min(elements[start:end])


def test_max_tree():
    tree = SegmentTree(8, "max")
    tree.set([0, 3, 5, 7, 2, 6], [1.0, 9.0, -2.0, 4.0, 3.0, 0.5])
    assert tree.reduce() == 9.0
    assert tree.reduce(4, 8) == 4.0
    with pytest.raises(CompatError):
        SegmentTree(8, "mean")


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 31), st.floats(0, 100, allow_nan=False)), min_size=1, max_size=60),
    st.integers(0, 31),
    st.integers(1, 32),
)
def test_batch_and_single_updates_agree_with_numpy(ops, start, end):
    sum_a, sum_b, min_a = SumSegmentTree(32), SumSegmentTree(32), MinSegmentTree(32)
    leaves = np.zeros(32)
    mins = np.full(32, np.inf)
    for i, v in ops:
        sum_a[i] = v
        leaves[i] = v
        mins[i] = v
    idx = np.array([i for i, _ in ops])
    vals = np.array([v for _, v in ops])
    sum_b.set(idx, vals)  # repeated indices: the last value wins
    min_a.set(idx, vals)
    assert np.allclose(sum_a.value, sum_b.value)
    if start < end:
        assert sum_a.reduce(start, end) == pytest.approx(leaves[start:end].sum())
        assert min_a.reduce(start, end) == mins[start:end].min()
    assert sum_a.prefix(end) == pytest.approx(leaves[:end].sum())
