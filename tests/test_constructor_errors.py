"""Constructor and configuration mistakes fail at the call that is wrong, named (issue 38 item 4)."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import replaystore as rs  # noqa: E402
from replaystore.shared import SharedTable  # noqa: E402

SPEC = {"x": ((2,), np.float32)}

TABLE_MISTAKES = [
    ("rate_limiter=100", dict(rate_limiter=100), r"RateLimiter.*rs\.MinSize\(100\)"),
    ("rate_limiter class", dict(rate_limiter=rs.MinSize), r"the class MinSize: pass an instance"),
    ("sampler string", dict(sampler="prioritized"), r"sampler .*the string 'prioritized'.*rs\.Prioritized\(\)"),
    ("sampler class", dict(sampler=rs.Prioritized), r"the class Prioritized: pass an instance, sampler=rs\.Prio"),
    ("remover class", dict(remover=rs.Fifo), r"remover .*the class Fifo"),
    ("remover string", dict(remover="fifo"), r"remover .*the string 'fifo'"),
    ("episodes", dict(episodes=True), r"episodes must be an instance of Episodes"),
]


@pytest.mark.parametrize("kwargs, match", [m[1:] for m in TABLE_MISTAKES], ids=[m[0] for m in TABLE_MISTAKES])
def test_table_parts_of_the_wrong_kind_are_named_at_construction(kwargs, match):
    with pytest.raises(rs.InvalidArgument, match=match):
        rs.Table(10, **kwargs)


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"x": (np.float32, (2,))}, r"field 'x'.*the order is \(shape, dtype\), e\.g\. \(\(2,\), float32\)"),
        ({"x": (np.float32, 3)}, r"e\.g\. \(\(3,\), float32\)"),
        ({"x": ((2,), "no-such-dtype")}, r"field 'x': expected \(shape, dtype\)"),
        ({"x": ((-1,), np.float32)}, r"field 'x'"),
        ([("x", np.float32)], r"spec must be a dict"),
    ],
)
def test_bad_specs_are_spec_errors_at_construction(spec, match):
    with pytest.raises(rs.SpecError, match=match):
        rs.Table(10, spec=spec)


def test_prioritized_beta_outside_0_1_is_refused():
    for beta in (2, 1.0001, -0.1, float("nan")):
        with pytest.raises(rs.InvalidArgument, match=r"beta must be in \[0, 1\]"):
            rs.Prioritized(beta=beta)
    rs.Prioritized(beta=1.0)
    rs.Prioritized(beta=0.0)


def test_set_version_never_goes_down_without_reset():
    t = rs.Table(10, max_staleness=1)
    t.extend({"x": np.zeros((3, 2), np.float32)}, version=5)
    assert t.set_version(5) == 0
    before = t.stats()
    with pytest.raises(rs.InvalidArgument, match=r"set_version\(2\): versions only go up \(the current one is 5\)"):
        t.set_version(2)
    assert t.version == 5 and t.stats() == before
    assert t.set_version(5) == 0  # the same version again: a no-op
    assert t.set_version(2, reset=True) == 0 and t.version == 2  # a new run / a restore


def test_shared_table_create_names_the_mistake_and_leaves_no_segment(tmp_path):
    for kwargs, match in [
        (dict(sampler=rs.Prioritized), "the class Prioritized"),
        (dict(sampler="uniform"), "the string 'uniform'"),
        (dict(remover=rs.Fifo), "the class Fifo"),
        (dict(rate_limiter=100), "rate_limiter must be an instance of RateLimiter"),
    ]:
        with pytest.raises(rs.InvalidArgument, match=match):
            SharedTable.create("bad", 10, SPEC, directory=tmp_path, **kwargs)
    with pytest.raises(rs.SpecError, match="the order is"):
        SharedTable.create("bad", 10, {"x": (np.float32, (2,))}, directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_serve_a_table_instead_of_a_factory_is_named_before_ray_starts():
    ray = pytest.importorskip("ray")
    from replaystore.ray import serve

    started = ray.is_initialized()
    with pytest.raises(rs.InvalidArgument, match=r"tables must be a factory returning a Table .*got a Table instance"):
        serve(rs.Table(10), name="newcomer-instance")
    with pytest.raises(rs.InvalidArgument, match=r"tables\['a'\] must be a factory"):
        serve({"a": rs.Table(10)}, name="newcomer-instance")
    with pytest.raises(rs.InvalidArgument, match=r"got int 5"):
        serve(5, name="newcomer-instance")
    assert ray.is_initialized() == started  # refused before Ray was started


def test_sb3_prioritized_buffer_beta_above_one_is_its_named_error():
    pytest.importorskip("stable_baselines3")
    from gymnasium import spaces

    from replaystore.integrations.sb3 import ReplaystorePrioritizedReplayBuffer
    from replaystore.integrations.sb3.table_backed import SB3BufferError

    obs, act = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2)
    with pytest.raises(SB3BufferError, match=r"beta must be in \[0, 1\]"):
        ReplaystorePrioritizedReplayBuffer(10, obs, act, beta=2.0)
    ReplaystorePrioritizedReplayBuffer(10, obs, act, beta=1.0)
