"""Issue 24, item 1: every live step stays part of its stream, whatever else leaves the table.

Old steps of a stream that outlive many newer ones (the newer ones deleted, retired by
``max_times_sampled``, refused as stale or evicted by a non-FIFO remover) must stay visible to
``sample_sequences``, ``sample_nstep``, ``episode_info`` and checkpoints.
"""

import numpy as np
import pytest

import replaystore as rs


def step(i):
    return {"obs": np.float32([i]), "next_obs": np.float32([i + 1]), "reward": np.float32(1)}


def _check_open_pair(t, a):
    info = t.episode_info(a)
    assert info.found.all()
    assert info.positions.tolist() == [0, 1]
    assert info.stream_positions.tolist() == [0, 1]
    assert (info.lengths == info.lengths[0]).all() and info.lengths[0] >= 2
    assert not info.closed.any()
    assert t.episode_keys(a[:1], 1).tolist() == [a[1]]
    s = t.sample_nstep(64, 3, 0.5)
    assert set(s.keys.tolist()) <= set(t.keys().tolist())
    first = s.keys == a[0]
    assert first.any()
    # the start a[0] has a[1] as its only stored successor: k = 2, return 1 + 0.5
    assert (s.steps[first] == 2).all() and np.allclose(s.returns[first], 1.5)
    q = t.sample_sequences(16, 2)
    assert (q.step_keys == np.array(a)).all()
    p = t.sample_sequences(16, 1)
    assert set(p.keys.tolist()) <= set(t.keys().tolist()) and a[0] in p.keys


def test_issue_snippet_fifo_deletes_keep_the_open_episode_visible(tmp_path):
    t = rs.Table(4, remover=rs.Fifo(), episodes=rs.Episodes(next_obs_field="next_obs"), seed=0)
    a = [t.add_step(step(i)) for i in range(2)]
    for i in range(2, 42):
        t.delete([t.add_step(step(i))])
    assert t.episode_info(a).lengths.tolist() == [42, 42]  # the open episode: 42 steps written so far
    _check_open_pair(t, a)
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    _check_open_pair(u, a)
    # the stream continues: the next step is position 42 of the same episode, its predecessor is gone
    k = u.add_step(step(42), terminated=True)
    info = u.episode_info([a[0], k])
    assert info.positions.tolist() == [0, 42] and info.lengths.tolist() == [43, 43]
    assert info.closed.all() and not info.complete.any()


def test_lifo_with_max_times_sampled_keeps_old_steps_visible():
    # a Lifo sampler with max_times_sampled=1 retires the newest step at every draw
    t = rs.Table(
        4,
        sampler=rs.Lifo(),
        remover=rs.Lifo(),
        max_times_sampled=1,
        episodes=rs.Episodes(next_obs_field="next_obs"),
        seed=0,
    )
    a = [t.add_step(step(i)) for i in range(2)]
    for i in range(2, 42):
        k = t.add_step(step(i))
        assert t.sample(1).keys.tolist() == [k]
    assert t.keys().tolist() == a
    info = t.episode_info(a)
    assert info.lengths.tolist() == [42, 42] and info.found.all()
    assert t.episode_keys(a[:1], 1).tolist() == [a[1]]
    assert (t.sample_sequences(4, 2).step_keys == np.array(a)).all()


def test_lifo_eviction_keeps_the_oldest_steps_in_their_episode():
    # Lifo evicts the newest: the first steps of the stream stay while a thousand positions pass
    t = rs.Table(8, remover=rs.Lifo(), episodes=rs.Episodes(next_obs_field="next_obs"), seed=0)
    keys = [t.add_step(step(i)) for i in range(1000)]
    live = t.keys().tolist()
    assert live == keys[:7] + [keys[-1]]
    info = t.episode_info(live)
    assert info.stream_positions.tolist() == [*range(7), 999]
    assert (info.lengths == 1000).all()
    q = t.sample_sequences(64, 7)
    assert (q.step_keys == np.array(keys[:7])).all()
    s = t.sample_nstep(64, 3, 0.5)
    assert set(s.keys.tolist()) == set(live)
    assert (s.steps[s.keys == keys[6]] == 1).all() and (s.steps[s.keys == keys[0]] == 3).all()


def test_min_heap_keeps_a_high_priority_step_in_its_episode(tmp_path):
    # the former "detached" case: MinHeap keeps the high-priority first step 60 positions behind
    t = rs.Table(8, remover=rs.MinHeap(), episodes=rs.Episodes(next_obs_field="next_obs"), seed=0)
    old = t.add_step(step(0), priority=100.0)
    for i in range(1, 61):
        t.add_step(step(i), priority=float(i))
    assert old in t.keys()
    info = t.episode_info([old])
    assert info.found.all() and info.positions.tolist() == [0] and info.lengths.tolist() == [61]
    for _ in range(5):
        s = t.sample_sequences(16, 2, mode="padded")
        firsts = s.step_keys[:, 0] == old
        assert (~s.mask[firsts, 1]).all()  # its successor is gone: a one-step run
        assert old not in t.sample_sequences(16, 2).step_keys
    n = t.sample_nstep(256, 3, 0.5)
    assert (n.steps[n.keys == old] == 1).all()
    assert old in t.sample_sequences(256, 1).keys
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    assert u.episode_info([old]).lengths.tolist() == [61]
    assert old in u.sample_sequences(256, 1).keys


@pytest.mark.parametrize("how", ["delete", "stale"])
def test_gapless_again_once_the_hole_is_evicted(how):
    # a hole makes the stream take the verified path; once FIFO eviction passed it, the stream is
    # gapless again (docs/sequences.md: "no delete ... since its oldest live step")
    t = rs.Table(16, remover=rs.Fifo(), max_staleness=1, episodes=rs.Episodes(next_obs_field="next_obs"))
    idx = t._episodes
    for i in range(10):
        if i == 5:
            if how == "delete":
                t.delete([t.add_step(step(i))])
            else:
                t.add_step(step(i), version=t.version - 5)
            continue
        t.add_step(step(i))
    assert not idx.gapless(np.array([0]))[0]
    for i in range(10, 40):
        t.add_step(step(i))
    assert idx.gapless(np.array([0]))[0]
    assert idx.oldest_t[0] == 24


def test_gapless_again_after_a_hole_of_thousands_of_positions():
    t = rs.Table(16, remover=rs.Fifo(), episodes=rs.Episodes(next_obs_field="next_obs"))
    idx = t._episodes
    keep = [t.add_step(step(i)) for i in range(3)]
    for i in range(3, 1200):  # a hole of ~1200 positions (newer steps deleted one by one)
        t.delete([t.add_step(step(i))])
    for i in range(1200, 1210):
        t.add_step(step(i))
    assert not idx.gapless(np.array([0]))[0]
    t.delete(keep)  # the oldest steps leave: the oldest live step is now position 1200
    assert idx.oldest_t[0] == 1200 and idx.gapless(np.array([0]))[0]
    assert idx.n_overflow == 0
    q = t.sample_sequences(8, 10)
    assert (t.episode_info(q.keys).stream_positions == 1200).all()
