"""MixedSampler checks its sources' specs when it is built, and casts on request."""

import numpy as np
import pytest

import replaystore as rs
from replaystore.mixing import spec_of


def _offline(n=64):
    t = rs.Table(1000, seed=0)
    t.extend({"obs": np.zeros((n, 3), np.float32), "reward": np.ones(n, np.float32)})
    return t


def _online_gym_style(n=64):
    t = rs.Table(1000, seed=1)
    for i in range(n):  # gymnasium's step returns a Python float reward: the column is float64
        t.add({"obs": np.full(3, i, np.float32), "reward": float(i)})
    return t


def test_dtype_mismatch_fails_at_construction_with_the_fix():
    offline, online = _offline(), _online_gym_style()
    with pytest.raises(rs.SpecError) as e:
        rs.MixedSampler({"offline": offline, "online": online}, ratios=(0.5, 0.5))
    msg = str(e.value)
    assert "'reward'" in msg and "float32" in msg and "float64" in msg
    assert "cast=True" in msg and "spec_of" in msg
    assert offline.stats()["samples"] == 0 and online.stats()["samples"] == 0


def test_cast_true_casts_to_the_first_sources_dtype():
    offline, online = _offline(), _online_gym_style()
    mix = rs.MixedSampler({"offline": offline, "online": online}, ratios=(0.25, 0.75), cast=True, seed=0)
    s = mix.sample(32)
    assert s.data["reward"].dtype == np.float32 and s.data["obs"].dtype == np.float32
    on = s.data["reward"][s.rows("online")]
    assert np.array_equal(on, on.astype(np.int64).astype(np.float32))  # values kept (small ints)
    assert (s.data["reward"][s.rows("offline")] == 1).all()


def test_spec_of_makes_the_online_table_match():
    offline = _offline()
    online = rs.Table(1000, spec=spec_of(offline), seed=1)
    online.add({"obs": np.zeros(3, np.float32), "reward": 1.5})  # a Python float fits float32
    assert spec_of(online) == spec_of(offline)
    mix = rs.MixedSampler({"offline": offline, "online": online}, ratios=(0.5, 0.5))
    assert mix.sample(8).data["reward"].dtype == np.float32


def test_shape_mismatch_and_impossible_cast_fail_even_with_cast():
    offline = _offline()
    wide = rs.Table(10)
    wide.add({"obs": np.zeros(4, np.float32), "reward": np.float32(0)})
    with pytest.raises(rs.SpecError, match="shape"):
        rs.MixedSampler({"a": offline, "b": wide}, ratios=(1, 1), cast=True)
    ints = rs.Table(10)
    ints.add({"obs": np.zeros(3, np.float32), "reward": np.int64(0)})
    with pytest.raises(rs.SpecError, match="same_kind"):
        rs.MixedSampler({"ints": ints, "floats": offline}, ratios=(1, 1), cast=True)


def test_source_without_spec_yet_is_checked_per_batch():
    offline, online = _offline(), rs.Table(1000)
    plain = rs.MixedSampler({"offline": offline, "online": online}, ratios=(0.5, 0.5))
    casting = rs.MixedSampler({"offline": offline, "online": online}, ratios=(0.5, 0.5), cast=True)
    for i in range(8):
        online.add({"obs": np.zeros(3, np.float32), "reward": float(i)})
    with pytest.raises(rs.SpecError, match="cast=True"):
        plain.sample(8)
    assert casting.sample(8).data["reward"].dtype == np.float32
