"""The sharded table's arithmetic without Ray: keys that carry their shard, merged samples."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore.sharding import keys as shard_keys
from replaystore.sharding import sampling as shard_sampling


@settings(max_examples=200, deadline=None)
@given(tag=st.integers(1, (1 << 15) - 1), n=st.integers(1, 256), data=st.data())
def test_keys_round_trip_and_foreign_keys_are_named(tag, n, data):
    shards = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=20)))
    local = np.array(
        data.draw(st.lists(st.integers(0, shard_keys.LOCAL_MASK), min_size=len(shards), max_size=len(shards)))
    )
    keys = np.concatenate([shard_keys.encode(tag, int(s), np.array([k])) for s, k in zip(shards, local)])
    assert (keys >= 0).all()
    got_s, got_l = shard_keys.decode(tag, keys, n)
    assert got_s.tolist() == shards.tolist() and got_l.tolist() == local.tolist()
    groups = shard_keys.group(got_s, n)
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(keys)))
    for s, g in enumerate(groups):
        assert (got_s[g] == s).all() and list(g) == sorted(g)
    other = tag + 1 if tag < (1 << 15) - 1 else 1
    with pytest.raises(shard_keys.ForeignKey, match="does not belong"):
        shard_keys.decode(other, keys, n)
    with pytest.raises(shard_keys.ForeignKey):
        shard_keys.decode(tag, local[:1], n)  # a plain Table's key (tag 0)
    if n > 1 and shards.max() > 0:
        with pytest.raises(shard_keys.ForeignKey):  # a shard this table does not have
            shard_keys.decode(tag, keys, int(shards.max()))


def test_merge_gives_one_tables_probabilities_and_weights():
    """Shard samples of every item, merged: P and w equal a single prioritized table's formulas."""
    alpha, beta = 0.6, 0.4
    prios = [np.array([1.0, 2.0, 3.0]), np.array([4.0]), np.array([0.5, 5.0])]
    scaled = [p**alpha for p in prios]
    mass = np.array([s.sum() for s in scaled])
    states = [(len(p), s.sum(), s.min(), "prioritized", beta) for p, s in zip(prios, scaled)]
    parts = []
    for i, (p, s) in enumerate(zip(prios, scaled)):
        p_local = s / s.sum()
        w_local = (p_local / p_local.min()) ** -beta
        n = len(p)
        parts.append(
            (
                i,
                rs.Sample(
                    data={"x": np.arange(n) + 10 * i},
                    keys=np.arange(n),
                    indices=np.arange(n),
                    probabilities=p_local,
                    weights=w_local,
                    priorities=p,
                    times_sampled=np.ones(n, np.int64),
                    versions=np.zeros(n, np.int64),
                ),
            )
        )
    merged = shard_sampling.merge(parts, 5, mass, states, rng=np.random.default_rng(0))
    all_scaled = np.concatenate(scaled)
    x = np.concatenate([np.arange(len(p)) + 10 * i for i, p in enumerate(prios)])
    order = np.argsort(merged.data["x"])
    np.testing.assert_array_equal(merged.data["x"][order], np.sort(x))
    expect_p = (all_scaled / all_scaled.sum())[np.argsort(x)]
    np.testing.assert_allclose(merged.probabilities[order], expect_p, rtol=1e-12)
    np.testing.assert_allclose(merged.weights[order], (expect_p / expect_p.min()) ** -beta, rtol=1e-12)
    shards, _ = shard_keys.decode(5, merged.keys, 3)
    np.testing.assert_array_equal(shards, merged.data["x"] // 10)


def test_masses_fall_back_to_sizes_and_skip_dead_shards():
    states = [(3, 0.0, np.inf, "prioritized", 0.4), (5, 0.0, np.inf, "prioritized", 0.4), None]
    np.testing.assert_array_equal(shard_sampling.masses(states, np.array([True, True, True])), [3, 5, 0])
    states[1] = (5, 2.5, 0.5, "prioritized", 0.4)
    np.testing.assert_array_equal(shard_sampling.masses(states, np.array([True, False, True])), [3, 0, 0])
    np.testing.assert_array_equal(shard_sampling.masses(states, np.array([True, True, True])), [0, 2.5, 0])
    counts = shard_sampling.draw_plan(np.random.default_rng(0), 1000, np.array([1.0, 0.0, 3.0]), 1)[0]
    assert counts.sum() == 1000 and counts[1] == 0 and 650 < counts[2] < 850


def test_split_fetch_gives_the_planned_rows_of_each_shard_per_batch():
    """A fetch of k batches: batch j holds rows counts[j, s] of shard s (the next ones, in order), merged."""
    alpha, beta, k = 0.6, 0.4, 5
    rng = np.random.default_rng(1)
    prios = [np.array([1.0, 2.0, 3.0]), np.array([4.0, 0.5])]
    scaled = [p**alpha for p in prios]
    mass = np.array([x.sum() for x in scaled])
    states = [(len(p), x.sum(), x.min(), "prioritized", beta, np.inf) for p, x in zip(prios, scaled)]
    counts = shard_sampling.draw_plan(rng, 7, mass, k)
    assert counts.shape == (k, 2) and (counts.sum(axis=1) == 7).all()
    got = {}
    for s, (p, x) in enumerate(zip(prios, scaled)):
        n = int(counts[:, s].sum())
        slot = rng.integers(0, len(p), n)
        p_local = (x / x.sum())[slot]
        got[s] = rs.Sample(
            data={"row": np.arange(n) + 1000 * s, "pair": np.stack([slot, slot], axis=1)},
            keys=slot,
            indices=slot,
            probabilities=p_local,
            weights=(p_local / (x.min() / x.sum())) ** -beta,
            priorities=p[slot],
            times_sampled=np.ones(n, np.int64),
            versions=np.zeros(n, np.int64),
        )
    shuffles = [np.random.default_rng(j) for j in range(k)]
    batches = shard_sampling.split_fetch(got, counts, 5, mass, states, shuffles)
    offsets = np.vstack([np.zeros(2, np.int64), np.cumsum(counts, axis=0)])
    p_min = min(x.min() for x in scaled) / mass.sum()
    for j, b in enumerate(batches):
        shard, local = shard_keys.decode(5, b.keys, 2)
        for s in range(2):
            rows = np.sort(b.data["row"][shard == s]) - 1000 * s
            np.testing.assert_array_equal(rows, np.arange(offsets[j, s], offsets[j + 1, s]))
        np.testing.assert_array_equal(b.data["pair"][:, 0], local)  # every column gathered alike
        expect = np.concatenate(scaled)[np.where(shard == 0, local, 3 + local)] / mass.sum()
        np.testing.assert_allclose(b.probabilities, expect, rtol=1e-12)
        np.testing.assert_allclose(b.weights, (expect / p_min) ** -beta, rtol=1e-12)
    counts[:, 1] = 0  # a shard with no rows in the plan, and one missing from the replies
    assert all(b is None for b in shard_sampling.split_fetch({}, counts, 5, mass, states, shuffles))


def test_fetch_depth_fits_every_shards_room_before_the_counts_are_drawn():
    mass = np.array([1.0, 3.0, 0.0])
    assert shard_sampling.fetch_depth(64, mass, np.full(3, np.inf), 8) == 8
    assert shard_sampling.fetch_depth(64, mass, np.full(3, np.inf), 1) == 1
    assert shard_sampling.fetch_depth(64, mass, np.array([0.0, np.inf, 0.0]), 8) == 1  # no room: one batch
    # shard 0 gets 16 rows a batch on average: j batches need 16 j + 4 sd(j) rows of its room of 50
    got = shard_sampling.fetch_depth(64, mass, np.array([50.0, np.inf, 0.0]), 8)  # shard 2 has no mass: ignored
    j = np.arange(1, 9)
    need = j * 16 + 4 * np.sqrt(j * 64 * 0.25 * 0.75)
    assert got == max(1, int((need <= 50).sum())) and got < 8
    assert shard_sampling.fetch_depth(64, mass, np.array([1e4, 1e4, 0.0]), 8) == 8
