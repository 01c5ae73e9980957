"""Property tests of the sum/min segment trees against a plain NumPy array of leaf values.

Every property runs on full trees (``frontier=1``: the root is maintained) and on truncated trees
(any power-of-two frontier up to the leaf level, as the Prioritized sampler uses).
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaystore.samplers import sumtree

# Leaf values: zeros, subnormals, tiny and huge magnitudes, and ordinary numbers. The largest value
# times the largest capacity (300 * 1e300) stays finite.
SPECIAL = [0.0, 5e-324, 1e-300, 1e-12, 1.0, 3.0, 1e12, 1e300]
values_st = st.one_of(
    st.sampled_from(SPECIAL),
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False),
)


@st.composite
def update_batches(draw, max_batches=12):
    """``(capacity, frontier, [(indices, values), ...])``, distinct indices inside each batch."""
    capacity = draw(st.one_of(st.integers(1, 300), st.sampled_from([1, 2, 3, 5, 7, 64, 65, 127, 128, 129])))
    levels = sumtree.leaf_base(capacity).bit_length() - 1
    frontier = 1 << draw(st.one_of(st.just(0), st.just(levels), st.integers(0, levels)))
    batches = []
    for _ in range(draw(st.integers(1, max_batches))):
        idx = draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=min(capacity, 40), unique=True))
        vals = draw(st.lists(values_st, min_size=len(idx), max_size=len(idx)))
        batches.append((np.asarray(idx, dtype=np.int64), np.asarray(vals, dtype=np.float64)))
    return capacity, frontier, batches


def build(capacity, frontier, batches):
    """Apply the batches to fresh trees and to a reference array; return ``(sum, min, leaves)``."""
    s = sumtree.new_sum_tree(capacity)
    m = sumtree.new_min_tree(capacity)
    leaves = np.zeros(capacity)
    for idx, vals in batches:
        sumtree.update_sum(s, idx, vals, frontier)
        # the Prioritized sampler's convention: zero (or empty) leaves are +inf in the min tree
        sumtree.update_min(m, idx, np.where(vals > 0.0, vals, np.inf), frontier)
        leaves[idx] = vals
    return s, m, leaves


def check_structure(s, m, capacity, leaves, frontier=1):
    """Maintained nodes are exactly their children's sum/min; the rest is untouched."""
    base = sumtree.leaf_base(capacity)
    assert len(s) == len(m) == 2 * base
    np.testing.assert_array_equal(s[base : base + capacity], leaves)
    assert np.all(s[base + capacity :] == 0.0)
    assert np.all(m[base + capacity :] == np.inf)
    internal = np.arange(frontier, base)
    # parents are recomputed from their children, so this holds exactly (no tolerance)
    np.testing.assert_array_equal(s[internal], s[2 * internal] + s[2 * internal + 1])
    np.testing.assert_array_equal(m[internal], np.minimum(m[2 * internal], m[2 * internal + 1]))
    # levels above the frontier are never written
    assert np.all(s[1:frontier] == 0.0) and np.all(m[1:frontier] == np.inf)


def min_positive(leaves):
    pos = leaves[leaves > 0.0]
    return float(pos.min()) if len(pos) else math.inf


def search_total(s, frontier):
    """The total the searches use: the root, or the last frontier prefix sum."""
    if frontier == 1:
        return sumtree.total(s)
    return float(sumtree.frontier_prefix(s, frontier)[-1])


@pytest.mark.parametrize("capacity", [1, 2, 3, 4, 5, 7, 8, 9, 100, 128, 129, 300, 10_000])
def test_leaf_base_and_frontier_for(capacity):
    p = sumtree.leaf_base(capacity)
    assert p >= capacity and p & (p - 1) == 0
    assert p == 1 or p // 2 < capacity
    assert len(sumtree.new_sum_tree(capacity)) == 2 * p
    assert sumtree.total(sumtree.new_sum_tree(capacity)) == 0.0
    assert sumtree.new_min_tree(capacity)[1] == np.inf
    f = sumtree.frontier_for(capacity)
    assert f & (f - 1) == 0 and 1 <= f <= p and f == min(p, 8192)


@settings(max_examples=150, deadline=None)
@given(update_batches())
def test_total_is_sum_and_minimum_is_min_positive_leaf(case):
    capacity, frontier, batches = case
    s, m, leaves = build(capacity, frontier, batches)
    check_structure(s, m, capacity, leaves, frontier)
    # all leaves are >= 0, so tree and fsum each have relative error ~ log2(n) * eps << 1e-9
    exact = math.fsum(leaves.tolist())
    assert sumtree.total(s, frontier) == pytest.approx(exact, rel=1e-9, abs=0.0)
    assert search_total(s, frontier) == pytest.approx(exact, rel=1e-9, abs=0.0)
    assert sumtree.minimum(m, frontier) == min_positive(leaves)  # a min is exact
    if frontier == 1:
        assert s[1] == sumtree.total(s) and m[1] == min_positive(leaves)


def _interior_targets(leaves, fractions):
    """Targets strictly inside the prefix interval of each leaf that is wide enough to hit.

    A leaf narrower than 1e-6 of the total (or subnormal-small) is skipped: the tree's partial sums
    and ``np.cumsum`` add in different orders and may differ by up to ~n * eps * total
    (< 1e-13 * total for n <= 300), so only intervals much wider than that have unambiguous interiors.
    """
    total = float(leaves.sum())
    cum = np.cumsum(leaves)
    lo = cum - leaves
    wide = np.flatnonzero((leaves > 1e-6 * total) & (leaves > 1e-290))
    targets = (lo[wide, None] + leaves[wide, None] * fractions[None, :]).ravel()
    return targets, np.repeat(wide, len(fractions))


@settings(max_examples=150, deadline=None)
@given(update_batches(), st.lists(st.floats(0.01, 0.99), min_size=1, max_size=4))
def test_find_prefix_matches_searchsorted_inside_intervals(case, fractions):
    capacity, frontier, batches = case
    s, _, leaves = build(capacity, frontier, batches)
    if not leaves.sum() > 0.0:
        return
    targets, owner = _interior_targets(leaves, np.asarray(fractions))
    ref = np.searchsorted(np.cumsum(leaves), targets, side="right")
    np.testing.assert_array_equal(ref, owner)  # the reference agrees with the construction
    np.testing.assert_array_equal(sumtree.find_prefix(s, targets, frontier), ref)
    if frontier > 1:  # with the prefix passed in, as the sampler does
        prefix = sumtree.frontier_prefix(s, frontier)
        np.testing.assert_array_equal(sumtree.find_prefix(s, targets, frontier, prefix), ref)


def _boundary_targets(leaves, total):
    cum = np.cumsum(leaves)
    cum = cum[cum < total]  # boundaries inside [0, total)
    return np.concatenate(
        [
            [0.0, 5e-324, total * (1 - 1e-16), np.nextafter(total, 0.0)],
            cum,
            np.nextafter(cum, 0.0),
            np.nextafter(cum, np.inf),
            total * np.linspace(0.0, 1.0, 101)[:-1],
        ]
    )


@settings(max_examples=150, deadline=None)
@given(update_batches(), st.integers(0, 2**32 - 1))
def test_find_prefix_never_returns_a_zero_leaf(case, seed):
    capacity, frontier, batches = case
    s, _, leaves = build(capacity, frontier, batches)
    total = search_total(s, frontier)
    if not total > 0.0:
        return
    rng = np.random.default_rng(seed)
    targets = np.concatenate([_boundary_targets(leaves, total), rng.random(200) * total])
    # total * (1 - 1e-16) is the largest double below total, so all of these are in [0, total)
    targets = targets[targets < total]
    if frontier == 1:
        # a full tree also copes with a target that rounding pushed to the total itself
        targets = np.append(targets, total)
    got = sumtree.find_prefix(s, targets, frontier)
    assert got.dtype.kind == "i"
    assert np.all((got >= 0) & (got < capacity))
    assert np.all(leaves[got] > 0.0), targets[leaves[got] <= 0.0]
    # and the hit leaf's interval contains the target, up to the summation-order rounding
    cum = np.cumsum(leaves)
    tol = 1e-12 * total
    assert np.all(cum[got] - leaves[got] - tol <= targets)
    assert np.all(targets <= cum[got] + tol)


@pytest.mark.parametrize("frontier", [1, 2, 4, 8, 16, 32])
def test_find_prefix_boundaries_with_zero_runs(frontier):
    # zero leaves on both sides of and between the positive ones, across subtree borders
    leaves = np.array([0, 0, 1.0, 0, 0, 0, 0, 2.0, 0, 0, 0, 0, 0, 0, 0, 0, 0.5, 0])
    s = sumtree.new_sum_tree(len(leaves))
    sumtree.update_sum(s, np.arange(len(leaves)), leaves, frontier)
    targets = np.array([0.0, 0.5, np.nextafter(1.0, 0), 1.0, 2.9, 3.0, 3.2, np.nextafter(3.5, 0)])
    want = [2, 2, 2, 7, 7, 16, 16, 16]
    if frontier == 1:  # at/past the total: the clamped descent still ends on a positive leaf
        targets = np.append(targets, [3.5, 4.0])
        want += [16, 16]
    assert sumtree.find_prefix(s, targets, frontier).tolist() == want


def test_capacity_one():
    s = sumtree.new_sum_tree(1)
    m = sumtree.new_min_tree(1)
    sumtree.update_sum(s, np.array([0]), np.array([2.5]))
    sumtree.update_min(m, np.array([0]), np.array([2.5]))
    assert sumtree.total(s) == 2.5 and m[1] == 2.5
    assert sumtree.find_prefix(s, np.array([0.0, 1.0, np.nextafter(2.5, 0)])).tolist() == [0, 0, 0]


@pytest.mark.parametrize("frontier", [1, 4, 16])
def test_many_updates_do_not_accumulate_drift(frontier):
    """100k updates, with huge values that are later overwritten, on a small tree.

    A tree that adds deltas would lose the small leaves under the 1e15-sized intermediate totals
    (eps * 1e15 ~ 0.1); recomputing parents from children keeps every node exact.
    """
    rng = np.random.default_rng(12345)
    capacity = 13
    s = sumtree.new_sum_tree(capacity)
    m = sumtree.new_min_tree(capacity)
    leaves = np.zeros(capacity)
    done = 0
    while done < 100_000:
        k = int(rng.integers(1, capacity + 1))
        idx = rng.choice(capacity, size=k, replace=False)
        vals = rng.random(k) * 1e-3
        big = rng.random(k) < 0.2
        vals[big] = 1e15 * rng.random(int(big.sum()))
        vals[rng.random(k) < 0.1] = 0.0
        sumtree.update_sum(s, idx, vals, frontier)
        sumtree.update_min(m, idx, np.where(vals > 0, vals, np.inf), frontier)
        leaves[idx] = vals
        done += k
    # finally overwrite every leaf with a small value: the total must be the small exact sum
    final = rng.random(capacity) * 1e-3
    final[3] = 0.0
    sumtree.update_sum(s, np.arange(capacity), final, frontier)
    sumtree.update_min(m, np.arange(capacity), np.where(final > 0, final, np.inf), frontier)
    check_structure(s, m, capacity, final, frontier)
    assert sumtree.total(s, frontier) == pytest.approx(math.fsum(final.tolist()), rel=1e-12, abs=0.0)
    assert sumtree.minimum(m, frontier) == min_positive(final)
    # and sampling still follows the small leaves exactly
    targets, owner = _interior_targets(final, np.array([0.1, 0.5, 0.9]))
    np.testing.assert_array_equal(sumtree.find_prefix(s, targets, frontier), owner)


def test_single_leaf_updates_keep_every_ancestor_exact():
    """One-at-a-time updates (the common path) keep the root exact against the reference."""
    rng = np.random.default_rng(7)
    capacity = 37
    s = sumtree.new_sum_tree(capacity)
    leaves = np.zeros(capacity)
    for _ in range(3000):
        i = int(rng.integers(capacity))
        v = float(rng.choice([0.0, 1e-9, 1.0, 1e9])) * rng.random()
        sumtree.update_sum(s, np.array([i]), np.array([v]))
        leaves[i] = v
    base = sumtree.leaf_base(capacity)
    internal = np.arange(1, base)
    np.testing.assert_array_equal(s[internal], s[2 * internal] + s[2 * internal + 1])
    assert sumtree.total(s) == pytest.approx(math.fsum(leaves.tolist()), rel=1e-12, abs=0.0)


def _chi2_upper(df, z=4.7534):
    """Wilson-Hilferty approximation of the chi-square quantile at one-sided p = 1e-6 (z = 4.7534)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


@pytest.mark.parametrize("frontier", [1, 8, 64])
def test_uniform_targets_hit_leaves_in_proportion_to_their_weight(frontier):
    """Chi-square goodness of fit of find_prefix on uniform targets, rejected at p = 1e-6."""
    rng = np.random.default_rng(2024)
    capacity = 50
    leaves = rng.random(capacity) * rng.choice([1e-3, 1.0, 1e3], size=capacity)
    leaves[rng.random(capacity) < 0.2] = 0.0
    # lift tiny leaves to 1% of the largest: every positive leaf then expects
    # >= n * 0.01 / 50 = 40 hits, enough for the chi-square approximation
    leaves[(leaves > 0) & (leaves < 1e-2 * leaves.max())] = 1e-2 * leaves.max()
    s = sumtree.new_sum_tree(capacity)
    sumtree.update_sum(s, np.arange(capacity), leaves, frontier)
    n = 200_000
    total = search_total(s, frontier)
    got = sumtree.find_prefix(s, rng.random(n) * total, frontier)
    counts = np.bincount(got, minlength=capacity)
    assert np.all(counts[leaves == 0] == 0)
    pos = leaves > 0
    expected = n * leaves[pos] / leaves.sum()
    chi2 = float(np.sum((counts[pos] - expected) ** 2 / expected))
    df = int(pos.sum()) - 1
    assert chi2 < _chi2_upper(df), (chi2, df)
