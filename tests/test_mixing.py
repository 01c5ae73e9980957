"""MixedSampler: exact counts per batch, routing of priorities, per-source weights, statistics."""

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions
from replaystore.mixing import InvalidMix, MixedSampler, mix_counts


def two_tables(seed=0):
    off = rs.Table(1000, seed=seed, name="offline")
    off.extend(transitions(500))  # ids 0..499
    on = rs.Table(1000, sampler=rs.Prioritized(1.0, 1.0), seed=seed + 1, name="online")
    on.extend(transitions(100, start=10_000))  # ids 10000..10099
    return off, on


def test_exact_counts_every_batch():
    off, on = two_tables()
    mix = MixedSampler({"offline": off, "online": on}, ratios=(0.3, 0.7))
    for b in (1, 2, 3, 7, 10, 64, 255):
        expected = mix_counts((0.3, 0.7), b)
        assert expected.sum() == b and (np.abs(expected - np.array([0.3, 0.7]) * b) < 1).all()
        for _ in range(3):
            s = mix.sample(b)
            assert len(s) == b
            assert s.counts.tolist() == expected.tolist()
            assert (s.source == 0).sum() == expected[0]
            # rows of each source are that source's items (ids are disjoint ranges)
            assert (s.data["id"][s.source == 0] < 500).all()
            assert (s.data["id"][s.source == 1] >= 10_000).all()
            assert np.array_equal(s.data["id"][s.rows("online")], s.keys[s.rows("online")] + 10_000)
    assert mix_counts((0.3, 0.7), 10).tolist() == [3, 7]
    assert mix_counts((1, 1, 1), 10).tolist() == [4, 3, 3]  # ties: earlier source first
    assert mix_counts((0.5, 0.5), 1).tolist() == [1, 0]
    assert off.stats()["samples"] + on.stats()["samples"] == 3 * sum((1, 2, 3, 7, 10, 64, 255))


def test_weights_are_per_source_and_mixture_probabilities():
    off, on = two_tables()
    on.update_priorities(np.arange(100), np.arange(1, 101, dtype=np.float64))
    mix = MixedSampler({"offline": off, "online": on}, ratios={"online": 3, "offline": 1})
    s = mix.sample(64)
    assert s.counts.tolist() == [16, 48]
    assert np.allclose(s.weights[s.source == 0], 1.0)  # uniform source
    w_on = s.weights[s.source == 1]
    assert w_on.max() <= 1.0 and w_on.min() < 1.0  # prioritized source: its own IS weights
    p = s.probabilities[s.source == 1]
    assert np.allclose(p, s.priorities[s.source == 1] / np.arange(1, 101).sum())
    assert np.allclose(s.mixture_probabilities[s.source == 1], 0.75 * p)
    assert np.allclose(s.mixture_probabilities[s.source == 0], 0.25 / 500)


def test_update_priorities_routed_by_source():
    a = rs.Table(100, sampler=rs.Prioritized(1.0, 0.4), seed=0)
    b = rs.Table(100, sampler=rs.Prioritized(1.0, 0.4), seed=1)
    a.extend(transitions(10))
    b.extend(transitions(10))  # same keys 0..9 in both tables
    mix = MixedSampler({"a": a, "b": b}, ratios=(0.5, 0.5))
    s = mix.sample(8)
    new = np.where(s.source == 0, 2.0, 7.0)
    applied = mix.update_priorities(s, new)
    assert applied == {"a": len(np.unique(s.keys[s.source == 0])), "b": len(np.unique(s.keys[s.source == 1]))}
    assert np.allclose(a.info(np.unique(s.keys[s.source == 0]))["priorities"], 2.0)
    assert np.allclose(b.info(np.unique(s.keys[s.source == 1]))["priorities"], 7.0)
    # bad priorities: nothing changes in either table
    before = (a.info(np.arange(10))["priorities"].copy(), b.info(np.arange(10))["priorities"].copy())
    bad = new.copy()
    bad[-1] = np.nan
    with pytest.raises(rs.InvalidPriority):
        mix.update_priorities(s, bad)
    with pytest.raises(rs.InvalidPriority):
        mix.update_priorities(s, new[:-1])
    assert np.array_equal(a.info(np.arange(10))["priorities"], before[0])
    assert np.array_equal(b.info(np.arange(10))["priorities"], before[1])


def test_stochastic_rounding_is_unbiased():
    off, on = two_tables()
    mix = MixedSampler({"offline": off, "online": on}, ratios=(0.3, 0.7), rounding="stochastic", seed=0)
    n = 20_000
    got = np.array([mix.counts(1) for _ in range(n)])
    assert set(map(tuple, got.tolist())) == {(1, 0), (0, 1)}
    # offline count ~ Binomial(n, 0.3): 5 sigma = 5 * sqrt(n * 0.21) ~ 324
    assert abs(got[:, 0].sum() - 0.3 * n) < 5 * np.sqrt(n * 0.21)
    got = np.array([mix.counts(5) for _ in range(4000)])  # exact 1.5 / 3.5: 1 or 2 offline rows
    assert set(got[:, 0].tolist()) == {1, 2} and (got.sum(axis=1) == 5).all()
    assert abs(got[:, 0].mean() - 1.5) < 5 * np.sqrt(0.25 / 4000)
    three = MixedSampler({"x": off, "y": on, "z": off}, ratios=(0.2, 0.45, 0.35), rounding="stochastic", seed=1)
    got = np.array([three.counts(3) for _ in range(20_000)])
    assert (got.sum(axis=1) == 3).all()
    assert np.allclose(got.mean(axis=0), [0.6, 1.35, 1.05], atol=0.03)


def test_within_source_sampling_is_uniform():
    off, on = two_tables()
    mix = MixedSampler({"offline": off, "online": on}, ratios=(0.5, 0.5))
    ids = np.concatenate([mix.sample(200).data["id"] for _ in range(200)])
    offline_ids = ids[ids < 500]
    assert len(offline_ids) == 200 * 100
    counts = np.bincount(offline_ids, minlength=500)
    # each count ~ Binomial(20000, 1/500): mean 40, sd ~6.3; chi-square over 499 dof
    chi2 = ((counts - 40) ** 2 / 40).sum()
    assert 499 - 5 * np.sqrt(2 * 499) < chi2 < 499 + 5 * np.sqrt(2 * 499)


def test_bad_configurations():
    off, on = two_tables()
    for ratios in ((0.5,), (-1, 2), (0, 0), (np.nan, 1)):
        with pytest.raises(InvalidMix):
            MixedSampler({"offline": off, "online": on}, ratios=ratios)
    with pytest.raises(InvalidMix):
        MixedSampler({"offline": off, "online": on}, ratios={"offline": 1})
    with pytest.raises(InvalidMix):
        MixedSampler({}, ratios=())
    with pytest.raises(InvalidMix):
        MixedSampler({"offline": off}, ratios=(1,), rounding="nearest")
    mix = MixedSampler({"offline": off, "online": on}, ratios=(1, 1))
    with pytest.raises(ValueError):
        mix.sample(0)
    other = rs.Table(10)
    other.extend({"obs": np.zeros((3, 2), np.float32)})
    with pytest.raises(rs.SpecError):
        MixedSampler({"offline": off, "other": other}, ratios=(1, 1)).sample(4)


def test_zero_ratio_source_is_never_sampled():
    off, on = two_tables()
    empty = rs.Table(10)
    mix = MixedSampler({"offline": off, "empty": empty}, ratios=(1, 0))
    s = mix.sample(16)
    assert s.counts.tolist() == [16, 0] and empty.stats()["sample_calls"] == 0


def test_timeout_from_an_empty_source():
    off, _ = two_tables()
    empty = rs.Table(10)
    mix = MixedSampler({"offline": off, "online": empty}, ratios=(1, 1))
    with pytest.raises(rs.Timeout):
        mix.sample(4, timeout=0.05)
