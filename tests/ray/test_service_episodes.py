"""Episodic Tables through the Ray service: writers of several envs, sequences, n-step, episodes."""

import numpy as np
import pytest
from ray_fixtures import start_ray

import replaystore as rs

pytestmark = pytest.mark.timeout(180)


def steps(ids, rewards=None):
    ids = np.asarray(ids, dtype=np.int64)
    r = np.ones(len(ids)) if rewards is None else np.asarray(rewards, dtype=np.float64)
    return {"obs": ids.astype(np.float32), "next_obs": (ids + 1).astype(np.float32), "reward": r, "id": ids}


def episodic_table():
    return rs.Table(1000, episodes=rs.Episodes(next_obs_field="next_obs"), seed=0)


def prioritized_sequences():
    return rs.Table(
        1000, sampler=rs.Prioritized(alpha=1.0, beta=1.0), seed=0, episodes=rs.Episodes(sequence_length=4, burn_in=1)
    )


@pytest.fixture(scope="module")
def svc():
    ray = start_ray()
    from replaystore import ray as rsr

    client = rsr.serve({"ep": episodic_table, "prio": prioritized_sequences}, name="svc-episodes")
    yield client
    client.shutdown()
    ray.shutdown()


def test_episode_writers_and_readers_through_the_service(svc):
    c = svc.table("ep")
    # a vectorised env of 4 streams, 10 steps, stream 2 terminates at step 5
    for i in range(10):
        ids = np.arange(4) * 1000 + i
        c.extend_steps(steps(ids), streams=np.arange(4), terminated=(np.arange(4) == 2) & (i == 5), timeout=5)
    c.add_step({k: v[0] for k, v in steps([5000]).items()}, stream=7, timeout=5)
    assert c.end_episode([0, 7]) == 2
    keys = c.add_episode(steps([9000, 9001, 9002]), stream=None, timeout=5)
    assert len(keys) == 3
    s = c.sample_sequences(16, 4, burn_in=1, timeout=5)
    assert isinstance(s, rs.SequenceSample) and s.data["id"].shape == (16, 5) and s.mask.all()
    assert (np.diff(s.data["id"], axis=1) == 1).all()
    n = c.sample_nstep(32, 3, 0.5, timeout=5)
    assert isinstance(n, rs.NStepSample) and (n.steps >= 1).all() and (n.steps <= 3).all()
    e = c.sample_episodes(4, timeout=5)
    assert all(len(x["id"]) == length for x, length in zip(e, e.lengths))
    assert set(e.terminated.tolist()) <= {True, False} and len(e.keys) == 4
    with pytest.raises(rs.UnknownStream):
        c.end_episode(99)
    with pytest.raises(rs.NoValidSequence):
        c.sample_sequences(2, 50, timeout=5)
    with pytest.raises(rs.EpisodeError):
        c.sample_nstep(2, 0, 0.9, timeout=5)
    with pytest.raises(rs.EpisodeError):
        c.extend(steps([1]), timeout=5)  # a plain insert into an episodic table


def test_prioritized_sequences_and_priority_updates_through_the_service(svc):
    c = svc.table("prio")
    c.add_episode(steps(np.arange(10)), stream=0, priorities=np.ones(10), timeout=5)
    s = c.sample_sequences(64, 3, burn_in=1, timeout=5)
    assert set(s.data["id"][:, 1].tolist()) <= set(range(1, 8))  # valid starts after 1 burn-in step
    starts = np.arange(1, 8)  # keys == ids in this fresh table
    td = np.zeros((7, 3))
    td[starts == 4] = [1.0, -10.0, 2.0]
    prio = rs.sequence_priority(td, eta=0.9)
    np.testing.assert_allclose(prio[3], 0.9 * 10 + 0.1 * 13 / 3)
    assert c.update_priorities(starts, prio) == 7
    s2 = c.sample_sequences(50, 3, burn_in=1, timeout=5)
    assert (s2.keys == 4).all() and (s2.data["id"] == np.arange(3, 7)).all()
    np.testing.assert_allclose(s2.probabilities, 1.0)


def test_episode_info_and_keys_through_the_service(svc):
    c = svc.table("ep")
    keys = c.add_episode(steps([7000, 7001, 7002, 7003]), stream=None, terminated=False, truncated=True, timeout=5)
    info = c.episode_info(np.append(keys, -5))
    assert isinstance(info, rs.EpisodeInfo)
    assert info.found.tolist() == [True] * 4 + [False]
    assert info.positions[:4].tolist() == [0, 1, 2, 3] and (info.lengths[:4] == 4).all()
    assert info.complete[:4].all() and info.truncated[:4].all() and info.is_last.tolist() == [0, 0, 0, 1, 0]
    np.testing.assert_array_equal(c.episode_keys(keys, 3), np.full(4, keys[3]))
    with pytest.raises(rs.EpisodeError):
        c.episode_keys(keys, [0.5] * 4)
