"""float32 sum/min trees (``Prioritized(tree_dtype=np.float32)``): precision, the descent's guard,
drift, the sampled distribution, checkpoints and configurations.

Tolerances from the math (unit roundoff ``u = 2**-24`` for float32):

- a leaf is ``fl32(priority ** alpha)``: relative error <= ``u``;
- a parent is ``fl32(left + right)`` of nonnegative children, so a node over ``2**d`` leaves is
  within ``(1 + u)**d - 1 <= 1.01 * d * u`` (relative) of the exact sum of its (float32) leaves;
- ``P(i) = leaf / root`` then is within ``(d + 2) * u`` of ``p_i**alpha / sum_k p_k**alpha``
  (the leaf's rounding, the root's ``d`` roundings and the float64 division), and a weight
  ``(leaf / min_leaf) ** -beta`` within ``2 * u`` (both leaves rounded once, ``beta <= 1``).

Frequency checks: chi-square goodness of fit rejected at one-sided p = 1e-6 (fixed seeds).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaystore as rs
from conftest import transitions
from replaystore.errors import InvalidArgument
from replaystore.samplers import selector_from_config, sumtree, sumtree_jit

U32 = 2.0**-24
BACKENDS = ["numpy"] + (["numba"] if sumtree_jit.AVAILABLE else [])


def _chi2_upper(df, z=4.7534):
    """Wilson-Hilferty approximation of the chi-square quantile at one-sided p = 1e-6 (z = 4.7534)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def _kernels(backend):
    return sumtree_jit if backend == "numba" else sumtree


def _f32_trees(capacity):
    base = sumtree.leaf_base(capacity)
    return np.zeros(2 * base, np.float32), np.full(2 * base, np.inf, np.float32)


def _rebuilt(leaves32, frontier):
    """The trees built afresh from their leaves (one batch of every leaf)."""
    s, m = _f32_trees(len(leaves32))
    sumtree.update_both(s, m, np.arange(len(leaves32)), leaves32.astype(np.float64), frontier)
    return s, m


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_updates_leave_the_trees_bit_identical_to_a_rebuild(backend):
    """No drift: after 200k leaf writes (huge values later overwritten by small ones) every maintained
    node equals the node of trees built afresh from the same leaves, bit for bit; so no periodic
    re-summation is needed. The root is within ``1.01 * d * u`` of the exact sum of the leaves."""
    k = _kernels(backend)
    rng = np.random.default_rng(321)
    capacity = 1000
    frontier = k.frontier_for(capacity)
    s, m = _f32_trees(capacity)
    leaves = np.zeros(capacity, np.float32)
    done = 0
    while done < 200_000:
        n = int(rng.integers(1, 200))
        idx = rng.choice(capacity, size=n, replace=False)
        vals = rng.random(n) * rng.choice([1e-6, 1.0, 1e20], size=n)
        vals[rng.random(n) < 0.1] = 0.0
        k.update_both(s, m, idx, vals, frontier)
        leaves[idx] = vals.astype(np.float32)
        done += n
    vals = rng.random(capacity) * 1e-3
    vals[::7] = 0.0
    k.update_both(s, m, np.arange(capacity), vals, frontier)
    leaves[:] = vals.astype(np.float32)
    rs_, rm = _rebuilt(leaves, frontier)
    keep = np.arange(frontier, len(s))
    np.testing.assert_array_equal(s[keep], rs_[keep])
    np.testing.assert_array_equal(m[keep], rm[keep])
    depth = sumtree.leaf_base(capacity).bit_length() - 1
    exact = math.fsum(leaves.astype(np.float64).tolist())
    assert abs(sumtree.total(s, frontier) - exact) <= 1.01 * depth * U32 * exact
    assert sumtree.minimum(m, frontier) == leaves[leaves > 0].min()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["tail", "zeros", "spread"])
def test_the_descent_never_returns_a_zero_leaf_at_a_million_leaves(backend, case):
    """Targets at and around the top of the mass (``nextafter(total, 0)``, ``(1 - 1e-7..1e-9) * total``),
    around every internal boundary and uniform ones: the leaf found is always positive, whatever
    float32 rounding does to the inner sums (live leaves only at the front, sparse, or everywhere)."""
    k = _kernels(backend)
    rng = np.random.default_rng({"tail": 1, "zeros": 2, "spread": 3}[case])
    capacity = 1 << 20
    frontier = k.frontier_for(capacity)
    leaves = rng.random(capacity) * rng.choice([1e-8, 1.0, 1e8], size=capacity)
    if case == "tail":  # live up to a point (a ring being filled), nothing past it
        leaves[700_001:] = 0.0
    elif case == "zeros":  # mostly deleted
        leaves[rng.random(capacity) < 0.99] = 0.0
    s, m = _f32_trees(capacity)
    k.update_both(s, m, np.arange(capacity), leaves, frontier)
    prefix = sumtree.frontier_prefix(s, frontier)
    total = float(prefix[-1])
    below = np.nextafter(total, 0.0)
    cum = np.cumsum(leaves.astype(np.float32).astype(np.float64))
    live = np.flatnonzero(leaves.astype(np.float32) > 0)
    edges = cum[live[rng.choice(len(live), 5000)]] * (total / cum[-1])
    targets = np.concatenate(
        [
            [0.0, below, total * (1 - 1e-7), total * (1 - 1e-8), total * (1 - 1e-9)],
            np.nextafter(edges, 0.0),
            edges,
            np.nextafter(edges, np.inf),
            rng.random(20_000) * total,
        ]
    )
    targets = np.minimum(targets, below)
    got = k.find_prefix(s, targets, frontier, prefix)
    assert (got >= 0).all() and (got < capacity).all()
    assert (s[got + len(s) // 2] > 0).all()


def _prioritized_table(capacity, backend, alpha=0.6, beta=0.4, seed=7, stratified=False):
    sampler = rs.Prioritized(alpha, beta, stratified=stratified, backend=backend, tree_dtype=np.float32)
    return rs.Table(capacity, sampler=sampler, seed=seed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_probabilities_and_weights_match_the_exact_ones_within_the_float32_bound(backend):
    capacity = 5000
    t = _prioritized_table(capacity, backend, alpha=0.7, beta=0.6)
    rng = np.random.default_rng(11)
    prio = rng.random(capacity) * rng.choice([1e-4, 1.0, 1e4], size=capacity)
    prio[::10] = 0.0
    keys = t.extend(transitions(capacity), priorities=prio)
    assert t.sampler._sum.dtype == np.float32 and t.sampler._min.dtype == np.float32
    s = t.sample(4000)
    scaled = prio**0.7
    exact_p = scaled / math.fsum(scaled.tolist())
    depth = sumtree.leaf_base(capacity).bit_length() - 1
    assert s.probabilities.dtype == np.float64 and s.weights.dtype == np.float64
    np.testing.assert_allclose(s.probabilities, exact_p[s.keys - keys[0]], rtol=(depth + 2) * U32, atol=0)
    exact_w = (scaled[s.keys - keys[0]] / scaled[scaled > 0].min()) ** -0.6
    np.testing.assert_allclose(s.weights, exact_w, rtol=2 * U32, atol=0)
    assert (s.weights <= 1.0).all()
    assert (prio[s.keys - keys[0]] > 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stratified", [False, True])
def test_frequencies_follow_p_alpha(backend, stratified):
    t = _prioritized_table(40, backend, alpha=0.5, seed=3, stratified=stratified)
    prio = (np.arange(40) % 8 + 1.0) ** 2  # p ** alpha = 1 .. 8
    prio[5] = 0.0
    keys = t.extend(transitions(40), priorities=prio)
    n = 100_000
    counts = np.zeros(40, np.int64)
    for _ in range(n // 1000):
        counts += np.bincount(t.sample(1000).keys - keys[0], minlength=40)
    assert counts[5] == 0
    pos = prio > 0
    expected = n * np.sqrt(prio[pos]) / np.sqrt(prio[pos]).sum()
    chi2 = float(((counts[pos] - expected) ** 2 / expected).sum())
    assert chi2 < _chi2_upper(int(pos.sum()) - 1), chi2


@pytest.mark.parametrize("backend", BACKENDS)
def test_extreme_priorities_are_clamped_into_the_float32_range(backend):
    """A positive priority too small for float32 still samples (clamped to the smallest normal), a
    huge one is clamped to ``float32 max / (2 * leaves)``: the root stays finite."""
    t = _prioritized_table(4, backend, alpha=1.0, beta=1.0)
    t.extend(transitions(4), priorities=[1e-300, 0.0, 1e300, 1e300])
    total, smallest = t.sampler.mass()
    assert math.isfinite(total) and total > 0
    assert smallest == pytest.approx(float(np.finfo(np.float32).tiny))
    assert set(t.sample(1000).keys.tolist()) <= {2, 3}
    assert t.sampler._sum[4 + 2] == np.float32(np.finfo(np.float32).max / 8)
    t.delete([2, 3])
    assert set(t.sample(200).keys.tolist()) == {0}  # the tiny one is positive: not the zero one


def test_tree_dtype_in_the_configuration_and_refusals():
    assert "tree_dtype" not in rs.Prioritized().config()  # (float64 configurations are unchanged)
    cfg = rs.Prioritized(0.5, tree_dtype="float32").config()
    assert cfg["tree_dtype"] == "float32"
    assert selector_from_config(cfg).tree_dtype == np.float32
    assert rs.Prioritized(tree_dtype=np.dtype("float64")).tree_dtype == np.float64
    for bad in ("float16", np.int32, "nope", None, 3):
        with pytest.raises(InvalidArgument, match="tree_dtype"):
            rs.Prioritized(tree_dtype=bad)


def test_checkpoint_round_trip_keeps_float32_trees(tmp_path):
    t = _prioritized_table(64, BACKENDS[-1])
    rng = np.random.default_rng(5)
    prio = rng.random(64) * 10
    keys = t.extend(transitions(64), priorities=prio)
    prio = prio**0.6
    t.delete(keys[:3])
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    assert u.sampler.tree_dtype == np.float32 and u.sampler._sum.dtype == np.float32
    half = len(t.sampler._sum) // 2
    # (a loaded table may place items at other slots: the same leaf values, the same mass)
    np.testing.assert_array_equal(np.sort(u.sampler._sum[half:]), np.sort(t.sampler._sum[half:]))
    assert u.sampler.mass()[1] == t.sampler.mass()[1]
    assert u.sampler.mass()[0] == pytest.approx(t.sampler.mass()[0], rel=2 * 6 * U32)
    s = u.sample(500)
    assert not set(s.keys.tolist()) & set(keys[:3].tolist())
    np.testing.assert_allclose(s.probabilities, (prio / prio[3:].sum())[s.keys - keys[0]], rtol=(6 + 2) * U32)


# --- random operations against a plain model -------------------------------------------------

PRIOS = [0.0, 0.5, 1.0, 2.0, 5.0]
ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.sampled_from(PRIOS), min_size=1, max_size=6)),
        st.tuples(st.just("update"), st.lists(st.tuples(st.integers(0, 200), st.sampled_from(PRIOS)), max_size=6)),
        st.tuples(st.just("delete"), st.lists(st.integers(0, 200), max_size=4)),
        st.tuples(st.just("sample"), st.integers(1, 64)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_st, capacity=st.integers(1, 24))
def test_random_operations_against_a_plain_model(ops, capacity):
    """add (FIFO eviction when full) / update / delete / sample on a float32 prioritized table, against
    a dict of live keys and priorities: no deleted, evicted or zero-priority item is ever sampled while
    one of positive priority lives; probabilities within ``(d + 2) u`` of the model's; at the end a
    chi-square test of 20k draws against the model's distribution (p = 1e-6)."""
    t = _prioritized_table(capacity, BACKENDS[-1], alpha=0.6, seed=capacity)
    model: dict[int, float] = {}
    order: list[int] = []
    next_id = 0
    depth = sumtree.leaf_base(capacity).bit_length() - 1

    def check_sample(n):
        s = t.sample(n)
        assert all(int(k) in model for k in s.keys)
        scaled = {k: p**0.6 for k, p in model.items()}
        total = math.fsum(scaled.values())
        if total > 0:
            assert all(model[int(k)] > 0 for k in s.keys)
            want = np.array([scaled[int(k)] / total for k in s.keys])
            np.testing.assert_allclose(s.probabilities, want, rtol=(depth + 2) * U32, atol=0)
        return s

    for op, arg in ops:
        if op == "add":
            new = t.extend(transitions(len(arg), next_id), priorities=arg)
            next_id += len(arg)
            for k, p in zip(new.tolist(), arg):
                model[k] = p
                order.append(k)
            while len(order) > capacity:
                model.pop(order.pop(0), None)
            order = [k for k in order if k in model]
        elif op == "update":
            pairs = {k: p for k, p in arg if k in model}
            if pairs:
                t.update_priorities(list(pairs), list(pairs.values()))
                model.update(pairs)
        elif op == "delete":
            gone = [k for k in dict.fromkeys(arg) if k in model]
            if gone:
                t.delete(gone)
                for k in gone:
                    del model[k]
                order = [k for k in order if k in model]
        elif model:
            check_sample(arg)
        assert sorted(t.keys().tolist()) == sorted(model)
    scaled = {k: p**0.6 for k, p in model.items()}
    total = math.fsum(scaled.values())
    if total > 0:
        n = 20_000
        s = check_sample(n)
        live = sorted(k for k in model if model[k] > 0)
        counts = np.array([int((s.keys == k).sum()) for k in live])
        expected = n * np.array([scaled[k] / total for k in live])
        if len(live) > 1:
            chi2 = float(((counts - expected) ** 2 / expected).sum())
            assert chi2 < _chi2_upper(len(live) - 1), (chi2, counts, expected)
