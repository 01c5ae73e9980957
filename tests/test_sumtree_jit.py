"""The optional numba tree kernels against the NumPy reference (same layout, same answers)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs
from conftest import transitions
from replaystore.samplers import sumtree, sumtree_jit

pytestmark = pytest.mark.skipif(not sumtree_jit.AVAILABLE, reason="numba not installed ([fast] extra)")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.data())
def test_kernels_match_the_numpy_reference(capacity, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    base = sumtree.leaf_base(capacity)
    frontier = data.draw(st.sampled_from([f for f in (1, 2, 4, 8, 64) if f <= base]))
    ref_s, ref_m = sumtree.new_sum_tree(capacity), sumtree.new_min_tree(capacity)
    jit_s, jit_m = sumtree.new_sum_tree(capacity), sumtree.new_min_tree(capacity)
    both_s, both_m = sumtree.new_sum_tree(capacity), sumtree.new_min_tree(capacity)  # the fused kernel
    for _ in range(data.draw(st.integers(1, 6))):
        k = data.draw(st.integers(1, capacity))
        leaves = rng.choice(capacity, k, replace=False).astype(np.int64)
        values = np.where(rng.random(k) < 0.2, 0.0, rng.random(k) * 10)
        sumtree.update_sum(ref_s, leaves, values, frontier)
        sumtree_jit.update_sum(jit_s, leaves, values, frontier)
        mins = np.where(values > 0, values, np.inf)
        sumtree.update_min(ref_m, leaves, mins, frontier)
        sumtree_jit.update_min(jit_m, leaves, mins, frontier)
        sumtree_jit.update_both(both_s, both_m, leaves, values, frontier)
    np.testing.assert_array_equal(jit_s, ref_s)
    np.testing.assert_array_equal(jit_m, ref_m)
    np.testing.assert_array_equal(both_s, ref_s)
    np.testing.assert_array_equal(both_m, ref_m)
    total = sumtree.total(ref_s, frontier)
    if total > 0:
        prefix = sumtree.frontier_prefix(ref_s, frontier)
        targets = rng.random(200) * float(prefix[-1]) * (1 - 1e-12)
        np.testing.assert_array_equal(
            sumtree_jit.find_prefix(jit_s, targets, frontier, prefix),
            sumtree.find_prefix(ref_s, targets, frontier, prefix),
        )


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_prioritized_backends_give_the_same_distribution(backend):
    prios = np.array([0.1, 0.5, 1.0, 2.0, 5.0, 0.0, 3.0])
    t = rs.Table(10, sampler=rs.Prioritized(alpha=0.6, backend=backend), seed=3)
    t.extend(transitions(len(prios)), priorities=prios)
    p = prios**0.6 / (prios**0.6).sum()
    draws = 200_000
    counts = np.bincount(np.concatenate([t.sample(1000).keys for _ in range(draws // 1000)]), minlength=7)
    sd = np.sqrt(draws * p * (1 - p))
    assert np.all(np.abs(counts - draws * p) <= 5 * sd + 1e-9)  # 5 sigma per bin
    assert counts[5] == 0


def test_backend_argument_is_checked():
    with pytest.raises(ValueError, match="backend"):
        rs.Prioritized(backend="cuda")


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.sampled_from([1, 2, 8, 64]), st.integers(0, 2**16))
def test_draw_matches_the_reference_and_the_compiled_updates_keep_the_last_duplicate(capacity, frontier, seed):
    rng = np.random.default_rng(seed)
    frontier = min(frontier, sumtree.leaf_base(capacity))
    leaves = rng.integers(0, capacity, 2 * capacity)  # with repeats
    values = np.where(rng.random(2 * capacity) < 0.3, 0.0, rng.random(2 * capacity) * 5)
    last = {int(leaf): v for leaf, v in zip(leaves, values)}  # the plain model: the last write wins
    jit = sumtree.new_sum_tree(capacity)
    sumtree_jit.update_sum(jit, leaves, values, frontier)
    ref = sumtree.new_sum_tree(capacity)
    keys = np.array(sorted(last), dtype=np.int64)
    sumtree.update_sum(ref, keys, np.array([last[k] for k in keys.tolist()]), frontier)
    assert sumtree_jit.LAST_DUPLICATE_WINS and not sumtree.LAST_DUPLICATE_WINS
    np.testing.assert_allclose(jit, ref, rtol=1e-12, atol=1e-12)
    if sumtree.total(ref, frontier) > 0:
        u = np.concatenate([rng.random(300), [0.0, 1 - 2**-53]])
        got, want = sumtree_jit.draw(jit, u, frontier), sumtree.draw(ref, u, frontier)
        np.testing.assert_array_equal(got, want)
        assert all(last.get(int(j), 0.0) > 0 for j in got)  # never a zero leaf, never outside
