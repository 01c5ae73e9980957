"""A sharded table acts as one Table in the calls where it used to differ (issue 32, item 3).

Marked slow: tests/conformance runs these calls in the default run (sharded-1 and sharded-2
against an in-process Table, plus its ``test_sharded_edges``); these are the issue's cases one by
one, with their own services.
"""

import functools
import uuid
import warnings

import numpy as np
import pytest
from ray_fixtures import start_ray, transitions

import replaystore as rs
from replaystore import ray as rsr

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_local():
    try:
        ray = start_ray(namespace=f"one-{uuid.uuid4().hex[:8]}")
        yield ray
    finally:
        import ray as _ray

        _ray.shutdown()


def episodic(capacity=64, **kw):
    return rs.Table(capacity, sampler=rs.Prioritized(0.6, 0.4), seed=1, episodes=rs.Episodes(max_streams=16), **kw)


def steps(n, start=0):
    return {"x": np.arange(start, start + n, dtype=np.float32)}


@pytest.fixture(scope="module")
def sharded(ray_local):
    c = rsr.serve_sharded(episodic, 2, name=f"one-{uuid.uuid4().hex[:8]}", seed=5, depth=1)
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def plain(ray_local):
    make = functools.partial(rs.Table, 64, sampler=rs.Prioritized(0.6, 0.4), seed=1)
    c = rsr.serve_sharded(make, 2, name=f"pl-{uuid.uuid4().hex[:8]}", seed=5, depth=1)
    yield c
    c.shutdown()


def test_default_priority_is_the_whole_tables_max(plain):
    sharded = plain
    sharded.clear()
    hi = sharded.extend(transitions(2), priorities=7.0, route=[0, 0])
    lo = sharded.extend(transitions(2, 2), priorities=1.0, route=[1, 1])
    new = sharded.extend(transitions(4, 4), route=[1, 1, 1, 1])  # the shard whose own max is 1.0
    assert np.all(sharded.info(new)["priorities"] == 7.0)
    assert np.all(sharded.info(hi)["priorities"] == 7.0) and np.all(sharded.info(lo)["priorities"] == 1.0)
    assert sharded.stats()["total"]["max_priority_seen"] == 7.0
    k = sharded.add({f: v[0] for f, v in transitions(1, 9).items()})  # round robin, whichever shard
    assert sharded.info([k])["priorities"][0] == 7.0


def test_fresh_streams_never_span_shards(sharded):
    sharded.clear()
    one = sharded.add_episode(steps(3), terminated=False)
    two = sharded.add_episode(steps(2, 10), terminated=False)
    info = sharded.episode_info(np.concatenate([one, two]))
    assert info.streams.tolist() == [0, 0, 0, 1, 1]
    more = sharded.add_step({"x": np.float32(20)}, stream=1)  # continues stream 1 on its own shard, position 2
    i2 = sharded.episode_info([more])
    assert i2.streams[0] == 1 and i2.positions[0] == 2 and i2.episodes[0] == info.episodes[-1]
    assert sharded.episode_keys([two[0]], 2)[0] == more


def test_a_refused_write_changes_no_shard(sharded, plain):
    sharded.clear()
    plain.clear()
    before = sharded.stats()["total"]["inserts"]
    with pytest.raises(rs.EpisodeError):
        sharded.extend_steps(steps(2), streams=[99, 0])
    with pytest.raises(rs.InvalidPriority):
        sharded.extend_steps(steps(2), streams=[1, 0], priorities=[1.0, np.nan])
    assert len(sharded) == 0 and sharded.stats()["total"]["inserts"] == before
    with pytest.raises(rs.InvalidPriority):
        plain.extend(transitions(2), priorities=[1.0, -1.0], route=[0, 1])
    with pytest.raises(rs.InvalidArgument):
        plain.extend(transitions(2), route=[0])
    assert len(plain) == 0


def test_episode_reads_and_sample_episodes(sharded):
    sharded.clear()
    for i in range(4):
        sharded.add_episode(steps(2 + i, 10 * i))
    sharded.add_episode(steps(3, 90), terminated=False)  # open: never sampled
    b = sharded.sample_episodes(16)
    assert len(b) == 16 and set(b.lengths.tolist()) <= {2, 3, 4, 5}
    for ep, keys in zip(b, b.keys):
        assert np.array_equal(sharded.get(keys)[0]["x"], ep["x"])
    assert len(set(np.asarray(b.episodes).tolist())) <= 4
    distinct = sharded.sample_episodes(4, replace=False)
    assert sorted(distinct.lengths.tolist()) == [2, 3, 4, 5]
    with pytest.raises(rs.NoValidSequence):
        sharded.sample_episodes(5, replace=False)


def test_stats_total_aggregates_gauges_and_capacity_is_the_tables(plain):
    sharded = plain
    sharded.clear()
    sharded.set_version(3)
    sharded.extend(transitions(3), priorities=[1.0, 2.0, 3.0], version=[3, 2, 1], route=[0, 1, 1])
    tot = sharded.stats()["total"]
    assert tot["capacity"] == 64 and tot["size"] == 3 and tot["version"] == 3
    assert (tot["priority_min"], tot["priority_max"]) == (1.0, 3.0)
    assert tot["priority_mean"] == pytest.approx(2.0)
    assert tot["staleness_histogram"] == {"0": 1, "1": 1, "2": 1}
    sharded.set_version(0, reset=True)  # back for the other tests


def test_uneven_capacity_split_and_oversized_batches(ray_local):
    c = rsr.serve_sharded(functools.partial(rs.Table, 5, seed=2), 2, name=f"cap-{uuid.uuid4().hex[:8]}", depth=1)
    try:
        assert [st["capacity"] for st in c.stats()["shards"]] == [3, 2]
        keys = c.extend(transitions(5))  # larger than a shard: split over both, as one Table keeps all 5
        assert len(c) == 5 and np.array_equal(np.sort(c.get(keys)[0]["id"]), np.arange(5))
    finally:
        c.shutdown()


def test_closed_sharded_table_raises_closed_and_errors_come_once(ray_local):
    c = rsr.serve_sharded(episodic, 2, name=f"cl-{uuid.uuid4().hex[:8]}", depth=1)
    try:
        c.extend_steps(steps(4), streams=[0, 1, 0, 1])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(rs.InvalidArgument):  # the Table's class, raised once
                c.sample_nstep(2, 0, 0.9)
        assert c.keys()[0] in c and 12345 not in c
        c.close()
        for call in (lambda: c.sample(1, timeout=0.1), lambda: c.extend(transitions(1)), c.stats, c.keys):
            with pytest.raises(rs.Closed):
                call()
        other = rsr.connect_sharded(c.name)  # another client learns it from the shards
        with pytest.raises(rs.Closed):
            other.sample(1, timeout=0.1)
    finally:
        c.shutdown()
