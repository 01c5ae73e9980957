"""Sampler behaviour and statistics.

Frequency checks: with D independent draws and probability P, a count is Binomial(D, P) with
standard deviation sqrt(D P (1 - P)); each bin must lie within 5 standard deviations (a false
alarm rate below 6e-7 per bin with fixed seeds, so the tests are deterministic and meaningful).
"""

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions


def counts_of(table, draws, batch=1000):
    counts = {}
    for _ in range(draws // batch):
        keys = table.sample(batch).keys
        u, c = np.unique(keys, return_counts=True)
        for k, v in zip(u.tolist(), c.tolist()):
            counts[k] = counts.get(k, 0) + v
    return counts


def assert_frequencies(counts, expected, draws):
    for key, p in expected.items():
        got = counts.get(key, 0)
        sd = np.sqrt(draws * p * (1 - p))
        assert abs(got - draws * p) <= 5 * sd + 1e-9, (key, got, draws * p, sd)


def test_uniform_frequencies():
    t = rs.Table(10, sampler=rs.Uniform(), seed=1)
    t.extend(transitions(10))
    draws = 200_000
    assert_frequencies(counts_of(t, draws), {k: 0.1 for k in range(10)}, draws)


def test_uniform_after_deletes_only_returns_live_items():
    t = rs.Table(10, sampler=rs.Uniform(), seed=2)
    t.extend(transitions(10))
    t.delete([0, 3, 9])
    draws = 70_000
    counts = counts_of(t, draws)
    assert set(counts) == {1, 2, 4, 5, 6, 7, 8}
    assert_frequencies(counts, {k: 1 / 7 for k in counts}, draws)


@pytest.mark.parametrize("stratified", [False, True])
def test_prioritized_frequencies_follow_p_alpha(stratified):
    prios = np.array([0.1, 0.5, 1.0, 2.0, 5.0, 0.0, 3.0])
    alpha = 0.6
    t = rs.Table(10, sampler=rs.Prioritized(alpha=alpha, beta=0.4, stratified=stratified), seed=3)
    t.extend(transitions(len(prios)), priorities=prios)
    p = prios**alpha / (prios**alpha).sum()
    draws = 300_000
    counts = counts_of(t, draws)
    assert 5 not in counts  # zero priority: never sampled
    assert_frequencies(counts, dict(enumerate(p)), draws)


def test_prioritized_probabilities_and_is_weights_match_direct_computation():
    prios = np.array([0.2, 1.0, 4.0, 2.5])
    alpha, beta = 0.7, 0.5
    t = rs.Table(8, sampler=rs.Prioritized(alpha=alpha, beta=beta), seed=4)
    t.extend(transitions(4), priorities=prios)
    s = t.sample(64)
    N = len(prios)
    P = prios**alpha / (prios**alpha).sum()
    w_all = (N * P) ** (-beta)
    expected_w = w_all / w_all.max()
    np.testing.assert_allclose(s.probabilities, P[s.keys], rtol=1e-12)
    np.testing.assert_allclose(s.weights, expected_w[s.keys], rtol=1e-12)
    # beta is settable for annealing
    t.sampler.beta = 1.0
    s = t.sample(64)
    w_all = (N * P) ** -1.0
    np.testing.assert_allclose(s.weights, (w_all / w_all.max())[s.keys], rtol=1e-12)


def test_prioritized_priority_updates_change_distribution():
    t = rs.Table(4, sampler=rs.Prioritized(alpha=1.0), seed=5)
    keys = t.extend(transitions(4), priorities=[1, 1, 1, 1])
    t.update_priorities(keys, [0, 0, 0, 1])
    assert set(t.sample(500).keys.tolist()) == {3}


def test_prioritized_all_zero_falls_back_to_uniform():
    t = rs.Table(4, sampler=rs.Prioritized(), seed=6)
    t.extend(transitions(4), priorities=[0, 0, 0, 0])
    s = t.sample(400)
    assert set(s.keys.tolist()) == {0, 1, 2, 3}
    assert np.all(s.weights == 1.0)


def test_fifo_and_lifo_sampler_order():
    t = rs.Table(10, sampler=rs.Fifo(), seed=0)
    t.extend(transitions(5))
    t.delete([0])
    assert t.sample(3).keys.tolist() == [1, 2, 3]
    t = rs.Table(10, sampler=rs.Lifo(), seed=0)
    t.extend(transitions(5))
    t.delete([4])
    assert t.sample(3).keys.tolist() == [3, 2, 1]
    assert np.all(t.sample(2).probabilities == 1.0)


def test_heap_samplers_order_with_oldest_first_ties():
    t = rs.Table(10, sampler=rs.MaxHeap(), seed=0)
    t.extend(transitions(5), priorities=[1.0, 5.0, 3.0, 5.0, 0.0])
    assert t.sample(3).keys.tolist() == [1, 3, 2]
    t.update_priorities([4], [10.0])
    assert t.sample(1).keys.tolist() == [4]
    t = rs.Table(10, sampler=rs.MinHeap(), seed=0)
    t.extend(transitions(5), priorities=[1.0, 5.0, 3.0, 1.0, 0.5])
    assert t.sample(3).keys.tolist() == [4, 0, 3]
    t.delete([4])
    assert t.sample(1).keys.tolist() == [0]


@pytest.mark.parametrize(
    "remover,survivors",
    [
        (rs.Fifo, [3, 4, 5, 6]),
        (rs.Lifo, [0, 1, 2, 6]),
        (rs.MinHeap, [0, 2, 4, 6]),  # lowest priorities leave
        (rs.MaxHeap, [1, 3, 5, 6]),  # highest priorities leave
    ],
)
def test_removers(remover, survivors):
    t = rs.Table(4, sampler=rs.Uniform(), remover=remover(), seed=0)
    prios = [9.0, 1.0, 8.0, 2.0, 7.0, 3.0, 5.0]
    for i, p in enumerate(prios):
        t.extend(transitions(1, i), priorities=[p])
    assert sorted(t.keys().tolist()) == survivors


def test_uniform_remover_evicts_random_items():
    t = rs.Table(5, remover=rs.Uniform(), seed=0)
    t.extend(transitions(5))
    t.extend(transitions(5, 5))
    t.extend(transitions(3, 10))
    assert len(t) == 5 and len(set(t.keys().tolist())) == 5
    assert t.keys().tolist() != [8, 9, 10, 11, 12]  # not FIFO (fixed seed)


def test_without_replacement_each_item_once_per_epoch():
    t = rs.Table(20, sampler=rs.WithoutReplacement(), seed=7)
    t.extend(transitions(12))
    epochs = []
    for _ in range(3):
        seen = np.concatenate([t.sample(4).keys for _ in range(3)])
        assert sorted(seen.tolist()) == list(range(12))
        epochs.append(seen.tolist())
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]  # reshuffled


def test_without_replacement_new_items_join_epoch_and_deleted_leave():
    t = rs.Table(20, sampler=rs.WithoutReplacement(), seed=8)
    t.extend(transitions(4))
    first = t.sample(2).keys.tolist()
    t.extend(transitions(2, 4))
    remaining = [k for k in range(6) if k not in first]
    t.delete([remaining[0]])
    rest = t.sample(3).keys.tolist()
    assert sorted(rest) == sorted(remaining[1:])


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("capacity", [1, 2, 5, 64, 1000])
def test_tournament_tree_orders_as_sorting(capacity, compiled):
    """The heap selectors' placed order (samplers/heap_tree.py): lowest priority first, ties by key."""
    from replaystore.samplers.heap_tree import AVAILABLE, TournamentTree

    if compiled and not AVAILABLE:
        pytest.skip("numba is not installed")
    tree = TournamentTree(capacity, compiled=compiled)
    rng = np.random.default_rng(capacity)
    live = {}
    for step in range(60):
        slots = rng.choice(capacity, size=int(rng.integers(1, capacity + 1)), replace=False)
        if rng.random() < 0.3:
            gone = np.array([s for s in slots.tolist() if s in live], dtype=np.int64)
            tree.drop(gone)
            for s in gone.tolist():
                del live[s]
        else:
            prios = rng.integers(0, 4, len(slots)).astype(np.float64)  # many ties
            keys = step * capacity + slots  # unique, as a table's keys
            tree.set(slots, prios, keys)
            live.update({s: (p, k) for s, p, k in zip(slots.tolist(), prios.tolist(), keys.tolist())})
        n = int(rng.integers(0, capacity + 2))
        want = sorted(live, key=live.__getitem__)
        assert tree.first(n).tolist() == want[:n]
        assert tree.peek() == (want[0] if want else -1)


@pytest.mark.parametrize(
    "make, ring",
    [
        (lambda: rs.Uniform(), True),  # the ring's arithmetic
        (lambda: rs.Uniform(), False),  # the dense set (after a delete that is not the oldest)
        (lambda: rs.Prioritized(0.7, 0.5), True),
        (lambda: rs.Prioritized(0.7, 0.5, stratified=True), True),
        (lambda: rs.Prioritized(0.7, 0.5), False),
    ],
)
def test_uniforms_drawn_beforehand_give_the_draw_of_the_same_stream(make, ring):
    """``sample(n, uniforms=rng.random(n))`` is ``sample(n)`` (what a shared table draws outside its lock)."""
    tables = []
    for _ in range(2):
        t = rs.Table(64, spec={"x": ((), np.float32)}, sampler=make(), seed=11)
        keys = t.extend({"x": np.arange(40, dtype=np.float32)}, priorities=np.linspace(0.1, 4, 40))
        if not ring:
            t.delete(keys[[5, 17]])
        tables.append(t)
    for n in (1, 7, 256):
        a = tables[0].sampler.sample(n)
        s = tables[1].sampler
        assert s.takes_uniforms
        b = s.sample(n, s.rng.random(n))
        for x, y in zip(a, b):
            assert (x is None and y is None) or np.array_equal(x, y)
