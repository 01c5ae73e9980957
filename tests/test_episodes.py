"""Episode structure in the Table: writers, strict/padded sequences, n-step, whole episodes, errors."""

import numpy as np
import pytest

import replaystore as rs
from replaystore.episodes.sequences import exact_valid_starts


def step(i, reward=1.0):
    """One step whose ``id`` identifies it; ``next_obs`` is ``obs + 1``."""
    return {"obs": np.float32(i), "next_obs": np.float32(i + 1), "reward": float(reward), "id": np.int64(i)}


def steps(ids, rewards=None):
    ids = np.asarray(ids, dtype=np.int64)
    r = np.ones(len(ids)) if rewards is None else np.asarray(rewards, dtype=np.float64)
    return {"obs": ids.astype(np.float32), "next_obs": (ids + 1).astype(np.float32), "reward": r, "id": ids}


def table(capacity=100, **kw):
    ep = kw.pop("episodes", None) or rs.Episodes(next_obs_field="next_obs")
    kw.setdefault("seed", 0)
    return rs.Table(capacity, episodes=ep, **kw)


def snapshot(t):
    """Everything observable that an error must not change."""
    st = t.stats()
    st.pop("staleness_histogram", None)
    st.pop("insert_blocked_s")  # time spent waiting is measured, not state
    st.pop("sample_blocked_s")
    idx = t._episodes
    return (
        t.keys().tolist(),
        st,
        idx.next_t.tolist(),
        idx.cur_ep.tolist(),
        idx.next_episode,
        idx.flags.tolist(),
        t.rate_limiter.state(),
    )


# -- writers ---------------------------------------------------------------------------------------
def test_plain_table_has_no_episodes_and_episodic_refuses_plain_inserts():
    plain = rs.Table(10)
    assert not plain.episodic
    with pytest.raises(rs.EpisodeError, match="no episode structure"):
        plain.sample_sequences(1, 2)
    t = table()
    assert t.episodic
    before = snapshot(t)
    with pytest.raises(rs.EpisodeError, match="add_step"):
        t.extend(steps([0, 1]))
    with pytest.raises(rs.EpisodeError):
        t.add(step(0))
    assert snapshot(t) == before and len(t) == 0


def test_object_storage_is_refused():
    with pytest.raises(rs.EpisodeError, match="column storage"):
        rs.Table(10, storage="objects", episodes=rs.Episodes())


def test_positions_and_episodes_of_interleaved_streams():
    t = table()
    # two envs, rows alternate; stream 1 terminates at its 3rd step, stream 0 truncates at its 4th
    t.extend_steps(
        steps([0, 100, 1, 101, 2, 102, 3, 103]),
        streams=[0, 1] * 4,
        terminated=[0, 0, 0, 0, 0, 1, 0, 0],
        truncated=[0, 0, 0, 0, 0, 0, 1, 0],
    )
    idx = t._episodes
    slots = t._index.lookup(np.arange(8))
    assert idx.streams(slots).tolist() == [0, 1] * 4
    assert idx.positions(slots).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    ep = idx.episode_of[slots]
    assert ep[[0, 2, 4, 6]].tolist() == [ep[0]] * 4  # stream 0: one episode
    assert ep[[1, 3, 5]].tolist() == [ep[1]] * 3 and ep[7] != ep[1]  # stream 1: new episode after end
    assert idx.pos_of[slots].tolist() == [0, 0, 1, 1, 2, 2, 3, 0]
    # single adds continue the same streams
    k = t.add_step(step(4), stream=0)
    assert idx.episode_of[t._index.lookup([k])[0]] not in (ep[0], ep[1], ep[7])  # stream 0 was truncated
    k2 = t.add_step(step(104), stream=1)
    assert idx.episode_of[t._index.lookup([k2])[0]] == ep[7]


def test_add_episode_and_end_episode():
    t = table()
    keys = t.add_episode(steps([0, 1, 2]), stream=5)
    assert keys.tolist() == [0, 1, 2]
    e = t.sample_episodes(1)
    assert e[0]["id"].tolist() == [0, 1, 2] and e.terminated.tolist() == [True] and e.streams.tolist() == [5]
    # an open episode is never returned; end_episode closes it
    t.add_episode(steps([10, 11]), stream=None, terminated=False)
    s_new = int(t._episodes.streams(t._index.lookup([4])[0]))
    assert s_new == 6  # stream=None: a fresh id above every used one
    with pytest.raises(rs.EpisodeError, match="open episode"):
        t.add_episode(steps([12]), stream=s_new)
    for _ in range(5):
        assert t.sample_episodes(3).lengths.tolist() == [3, 3, 3]
    assert t.end_episode(s_new, truncated=True) == 1
    assert t.end_episode([s_new, 5]) == 0  # both closed already
    e = t.sample_episodes(2, replace=False)
    assert sorted(x["id"].tolist() for x in e) == [[0, 1, 2], [10, 11]]
    by_len = dict(zip(e.lengths.tolist(), e.truncated.tolist()))
    assert by_len == {3: False, 2: True}


def test_end_episode_unknown_stream_and_bad_ids_change_nothing():
    t = table()
    t.extend_steps(steps([0, 1]), streams=[0, 1])
    before = snapshot(t)
    with pytest.raises(rs.UnknownStream, match=r"\[7\]"):
        t.end_episode([0, 7])
    with pytest.raises(rs.EpisodeError):
        t.end_episode(np.zeros((2, 2), dtype=np.int64))
    assert snapshot(t) == before


@pytest.mark.parametrize(
    "streams, match",
    [
        (0.5, "integers"),
        ([0, 1, 2], "shape"),
        (np.array([[0, 1]]), "shape"),
        ([-1, 0], "outside"),
        ("a", "integers"),
        ([True, False], "integers"),
    ],
)
def test_bad_stream_ids_are_refused_and_change_nothing(streams, match):
    t = table()
    t.extend_steps(steps([0, 1]), streams=[0, 1])
    before = snapshot(t)
    with pytest.raises(rs.EpisodeError, match=match):
        t.extend_steps(steps([2, 3]), streams=streams)
    assert snapshot(t) == before


def test_max_streams_bound_and_bad_flags():
    t = table(episodes=rs.Episodes(max_streams=2))
    with pytest.raises(rs.EpisodeError, match=r"outside \[0, 2\)"):
        t.add_step(step(0), stream=2)
    with pytest.raises(rs.EpisodeError, match="terminated"):
        t.extend_steps(steps([0, 1]), streams=0, terminated=[1, 0, 1])
    with pytest.raises(rs.EpisodeError, match="booleans"):
        t.extend_steps(steps([0, 1]), streams=0, truncated=[2, 0])
    with pytest.raises(rs.EpisodeError, match="one stream id"):
        t.add_step(step(0), stream=[0])
    assert len(t) == 0 and t._episodes.next_t.tolist() == [0, 0]


def test_failed_insert_leaves_streams_unchanged():
    t = table(rate_limiter=rs.SampleToInsertRatio(1.0, 1, 2.0))
    t.extend_steps(steps([0, 1]), streams=0)
    before = snapshot(t)
    with pytest.raises(rs.Timeout):
        t.extend_steps(steps([2, 3]), streams=0, timeout=0.01)
    with pytest.raises(rs.SpecError):
        t.add_step({"obs": np.float32(0)}, stream=0)
    assert snapshot(t) == before
    t.sample(2)
    t.extend_steps(steps([2]), streams=0)
    assert t._episodes.positions(t._index.lookup([2])[0]) == 2  # positions continued without a gap


# -- strict sequences --------------------------------------------------------------------------------
def test_strict_sequences_never_cross_ends_head_or_holes():
    t = table(200)
    rng = np.random.default_rng(1)
    nxt = 0
    for _ in range(60):  # 3 streams, random episode ends
        ids = np.arange(nxt, nxt + 3)
        nxt += 3
        t.extend_steps(steps(ids), streams=[0, 1, 2], terminated=rng.random(3) < 0.15, truncated=rng.random(3) < 0.05)
    t.delete(rng.choice(t.keys(), 10, replace=False))
    idx = t._episodes
    for _ in range(20):
        s = t.sample_sequences(16, 4, burn_in=2)
        assert s.data["id"].shape == (16, 6) and s.mask.all()
        # consecutive positions of one stream: ids step by 3 (3 interleaved streams)
        assert (np.diff(s.data["id"], axis=1) == 3).all()
        slots = t._index.lookup(s.step_keys.ravel())
        assert (slots >= 0).all()
        assert (idx.episode_of[slots].reshape(16, 6) == s.episodes[:, None]).all()
        assert (s.step_keys[:, 2] == s.keys).all()
        # no step except possibly the last is an episode end
        assert (idx.flags[slots].reshape(16, 6)[:, :-1] == 0).all()
        assert (s.data["id"][:, 2] == s.keys).all()  # ids were assigned in key order


def test_strict_sequence_longer_than_every_episode_raises_and_changes_nothing():
    t = table()
    for i in range(4):
        t.add_episode(steps(np.arange(5) + 10 * i), stream=0)
    before = snapshot(t)
    with pytest.raises(rs.NoValidSequence, match="5 consecutive|6 consecutive"):
        t.sample_sequences(4, 6)
    assert snapshot(t) == before
    s = t.sample_sequences(4, 5)
    assert (s.data["id"][:, 0] % 10 == 0).all()


def test_uniform_strict_starts_are_uniform_over_valid_starts():
    # episodes of lengths 3..12 in two streams: valid starts of length 4 are a known set
    t = table(500, seed=3)
    for i, n in enumerate(range(3, 13)):
        t.add_episode(steps(np.arange(n) + 100 * i), stream=i % 2)
    valid = np.concatenate([np.arange(n - 3) + 100 * i for i, n in enumerate(range(3, 13))])
    draws = 12000
    counts = {}
    for _ in range(draws // 400):
        s = t.sample_sequences(400, 4)
        for v in s.data["id"][:, 0].tolist():
            counts[v] = counts.get(v, 0) + 1
    assert set(counts) == set(valid.tolist())
    p = 1 / len(valid)
    sigma = np.sqrt(draws * p * (1 - p))
    assert all(abs(c - draws * p) < 5 * sigma for c in counts.values())


def test_exact_valid_set_fallback_matches_brute_force():
    t = table(300, seed=4)
    rng = np.random.default_rng(4)
    for i in range(40):  # mostly short episodes: rejection acceptance is low for length 6
        t.add_episode(steps(np.arange(rng.integers(1, 9)) + 100 * i), stream=int(rng.integers(0, 3)))
    idx = t._episodes
    got = set(t._index.key_of_slot[exact_valid_starts(idx, 7, 1)].tolist())
    ids, _ = t.get(t.keys())[0]["id"], None
    expect = set()
    for k in t.keys().tolist():
        slot = t._index.lookup([k])[0]
        ep = idx.episode_of[slot]
        same = idx.episode_of == ep
        pos = idx.pos_of[slot]
        have = set(idx.pos_of[same & (idx.uid >= 0)].tolist())
        if all(p in have for p in range(pos - 1, pos + 6)):
            expect.add(k)
    assert got == expect and len(ids)
    s = t.sample_sequences(64, 6, burn_in=1)
    assert set(s.keys.tolist()) <= expect


def test_wraparound_and_eviction_mid_episode():
    t = table(20)
    for i in range(0, 50, 10):  # 50 steps through 20 slots: evicted mid-episode
        t.extend_steps(steps(np.arange(i, i + 10)), streams=0)
    s = t.sample_sequences(32, 20)
    assert (s.data["id"] == np.arange(30, 50)).all()
    with pytest.raises(rs.NoValidSequence):
        t.sample_sequences(1, 21)


# -- padded sequences --------------------------------------------------------------------------------
def test_padded_sequences_zero_and_mask_outside_the_run():
    t = table()
    t.add_episode(steps([0, 1, 2]), stream=0)
    t.add_episode(steps([10, 11, 12, 13]), stream=0, terminated=False)  # open: write head at 13
    s = t.sample_sequences(200, 3, burn_in=2, mode="padded")
    assert s.data["id"].shape == (200, 5)
    key_ids = s.data["id"][:, 2]
    for row, kid in enumerate(key_ids.tolist()):
        base = 0 if kid < 10 else 10
        last = 2 if kid < 10 else 13
        pos = np.arange(kid - 2, kid + 3)
        expect_mask = (pos >= base) & (pos <= last)
        assert s.mask[row].tolist() == expect_mask.tolist()
        assert s.data["id"][row].tolist() == np.where(expect_mask, pos, 0).tolist()
        assert s.step_keys[row][~expect_mask].tolist() == [-1] * int((~expect_mask).sum())
    assert set(key_ids.tolist()) == {0, 1, 2, 10, 11, 12, 13}


# -- n-step --------------------------------------------------------------------------------------------
def nstep_table(next_obs=True):
    ep = rs.Episodes(next_obs_field="next_obs" if next_obs else None)
    t = rs.Table(100, episodes=ep, seed=0)
    # stream 0: terminated episode r = 1, 2, 3, 4 (ids 0..3)
    t.add_episode(steps([0, 1, 2, 3], [1, 2, 3, 4]), stream=0)
    # stream 1: truncated episode r = 10, 20, 30 (ids 10..12)
    t.add_episode(steps([10, 11, 12], [10, 20, 30]), stream=1, terminated=False, truncated=True)
    # stream 2: open episode r = 100, 200 (ids 20, 21): 21 is the write head
    t.extend_steps(steps([20, 21], [100, 200]), streams=2)
    return t


def all_nstep(t, n, gamma):
    """Sample until every start was seen; return {start id: (ret, k, done, disc, next_obs)}."""
    out = {}
    for _ in range(50):
        s = t.sample_nstep(64, n, gamma)
        for i in range(64):
            out[int(s.data["id"][i])] = (
                round(float(s.returns[i]), 9),
                int(s.steps[i]),
                bool(s.done[i]),
                round(float(s.discount[i]), 9),
                float(s.next_obs[i]),
            )
        if len(out) == len(t):
            break
    return out


def test_nstep_reference_with_next_obs():
    g = 0.5
    got = all_nstep(nstep_table(), 3, g)
    expect = {
        0: (1 + 2 * g + 3 * g**2, 3, False, g**3, 3.0),
        1: (2 + 3 * g + 4 * g**2, 3, True, 0.0, 4.0),  # terminates at id 3 (k = 3)
        2: (3 + 4 * g, 2, True, 0.0, 4.0),
        3: (4.0, 1, True, 0.0, 4.0),
        10: (10 + 20 * g + 30 * g**2, 3, False, g**3, 13.0),  # truncated at 12: bootstrap next_obs of 12
        11: (20 + 30 * g, 2, False, g**2, 13.0),
        12: (30.0, 1, False, g, 13.0),
        20: (100 + 200 * g, 2, False, g**2, 22.0),  # stops at the write head
        21: (200.0, 1, False, g, 22.0),
    }
    assert got == {k: tuple(round(x, 9) if isinstance(x, float) else x for x in v) for k, v in expect.items()}


def test_nstep_reference_without_next_obs_field():
    g = 0.9
    got = all_nstep(nstep_table(next_obs=False), 2, g)
    expect = {
        0: (1 + 2 * g, 2, False, g**2, 2.0),  # bootstrap obs of id 2
        1: (2 + 3 * g, 2, False, g**2, 3.0),
        2: (3 + 4 * g, 2, True, 0.0, 3.0),
        3: (4.0, 1, True, 0.0, 3.0),
        10: (10 + 20 * g, 2, False, g**2, 12.0),  # id 12 is the final observation of a truncated episode
        11: (20.0, 1, False, g, 12.0),
        20: (100.0, 1, False, g, 21.0),  # 21 has no successor yet: it is never a start
    }
    assert got == {k: tuple(round(x, 9) if isinstance(x, float) else x for x in v) for k, v in expect.items()}


def test_nstep_n1_is_the_one_step_transition_and_gamma_one():
    got = all_nstep(nstep_table(), 1, 1.0)
    assert got[0] == (1.0, 1, False, 1.0, 1.0) and got[3] == (4.0, 1, True, 0.0, 4.0)


def test_nstep_stops_before_a_deleted_step():
    t = nstep_table()
    t.delete([2])  # id 2 (key 2)
    got = all_nstep(t, 3, 0.5)
    assert got[0] == (1 + 2 * 0.5, 2, False, 0.25, 2.0)  # bootstrap next_obs of id 1


@pytest.mark.parametrize(
    "n, gamma, match",
    [
        (0, 0.9, "n must"),
        (1.5, 0.9, "n must"),
        (3, 0.0, "gamma"),
        (3, 1.01, "gamma"),
        (3, float("nan"), "gamma"),
        (3, "x", "gamma"),
    ],
)
def test_nstep_bad_arguments_change_nothing(n, gamma, match):
    t = nstep_table()
    before = snapshot(t)
    with pytest.raises(rs.EpisodeError, match=match):
        t.sample_nstep(4, n, gamma)
    assert snapshot(t) == before


def test_nstep_with_prioritized_sampler_returns_weights_and_updates():
    t = rs.Table(
        100, sampler=rs.Prioritized(alpha=1.0, beta=1.0), episodes=rs.Episodes(next_obs_field="next_obs"), seed=0
    )
    k = t.add_episode(steps(np.arange(10)), stream=0, priorities=np.arange(1, 11, dtype=float))
    s = t.sample_nstep(2000, 3, 0.9)
    np.testing.assert_allclose(s.probabilities, (s.keys + 1) / 55)
    np.testing.assert_allclose(s.weights, 1 / (s.keys + 1))
    counts = np.bincount(s.keys, minlength=10)
    p = np.arange(1, 11) / 55
    assert (np.abs(counts - 2000 * p) < 5 * np.sqrt(2000 * p * (1 - p))).all()
    assert t.update_priorities(k[:2], [0.0, 0.0]) == 2
    assert not np.isin(t.sample_nstep(500, 3, 0.9).keys, k[:2]).any()


# -- accounting -----------------------------------------------------------------------------------------
def test_rate_limiter_counts_one_sample_per_sequence_and_max_times_sampled_per_start():
    t = table(100, rate_limiter=rs.SampleToInsertRatio(0.5, 1, 100.0), max_times_sampled=1)
    t.add_episode(steps(np.arange(20)), stream=0)
    s = t.sample_sequences(5, 8)
    assert t.rate_limiter.samples == 5 and t.stats()["samples"] == 5
    # each start step was retired (max_times_sampled=1 per start); the other steps stay
    assert len(t) == 20 - len(np.unique(s.keys))
    assert not np.isin(s.keys, t.keys()).any()
    n = t.sample_nstep(3, 2, 0.9)
    assert t.rate_limiter.samples == 8
    assert not np.isin(n.keys, t.keys()).any()


def test_staleness_and_clear_keep_the_index_consistent():
    t = table(100, max_staleness=2)
    t.extend_steps(steps(np.arange(10)), streams=0, version=0)
    t.extend_steps(steps(np.arange(10, 20)), streams=0, version=2)
    assert t.set_version(2) == 0
    t.set_version(3)  # version 0 steps are now stale: dropped
    s = t.sample_sequences(20, 10)
    assert (s.data["id"][:, 0] == 10).all()
    # a stale-refused batch leaves a hole in the stream
    keys = t.extend_steps(steps([20, 21]), streams=0, version=[0, 3])
    assert keys[0] == -1
    with pytest.raises(rs.NoValidSequence):
        t.sample_sequences(1, 11)
    t.clear()
    assert t._episodes.live.size == 0
    t.extend_steps(steps(np.arange(30, 35)), streams=0)
    assert (t.sample_sequences(5, 5).data["id"] == np.arange(30, 35)).all()


def test_caches_of_the_index_do_not_survive_clear():
    t = table(100)
    t.add_episode(steps(np.arange(5)), stream=0)
    assert t.sample_episodes(1).lengths.tolist() == [5]  # caches the complete episodes
    assert len(exact_valid_starts(t._episodes, 2, 0)) == 4
    t.clear()
    t.add_episode(steps(np.arange(10, 13)), stream=0)  # as many index changes as before the clear
    b = t.sample_episodes(1)
    assert b.lengths.tolist() == [3] and b[0]["id"].tolist() == [10, 11, 12]
    assert len(exact_valid_starts(t._episodes, 2, 0)) == 2


def test_sequence_priority_r2d2():
    td = np.array([[1.0, -3.0, 2.0], [0.5, 0.5, 0.5]])
    np.testing.assert_allclose(rs.sequence_priority(td, eta=0.9), [0.9 * 3 + 0.1 * 2, 0.5])
    m = np.array([[True, False, True], [False, False, False]])
    np.testing.assert_allclose(rs.sequence_priority(td, 0.5, mask=m), [0.5 * 2 + 0.5 * 1.5, 0.0])
    with pytest.raises(rs.InvalidPriority):
        rs.sequence_priority(np.ones(3))
    with pytest.raises(rs.InvalidPriority):
        rs.sequence_priority(td, eta=1.5)


def test_fifo_batch_larger_than_capacity_keeps_the_newest_steps_in_place():
    t = table(20)
    keys = t.extend_steps(steps(np.arange(50)), streams=0)
    assert len(keys) == 50 and len(t) == 20
    slots = t._index.lookup(t.keys())
    assert t._episodes.positions(slots).tolist() == list(range(30, 50))
    assert (t.sample_sequences(8, 20).data["id"] == np.arange(30, 50)).all()
    t.add_step(step(50), stream=0)
    assert (t.sample_sequences(8, 20).data["id"] == np.arange(31, 51)).all()


# -- prioritized sequences ---------------------------------------------------------------------------
def prio_table(capacity=200, length=4, burn_in=1, **kw):
    return rs.Table(
        capacity,
        sampler=rs.Prioritized(alpha=1.0, beta=1.0),
        seed=0,
        episodes=rs.Episodes(sequence_length=length + burn_in, burn_in=burn_in, next_obs_field="next_obs"),
        **kw,
    )


def valid_keys(t, width, burn_in):
    return set(t._index.key_of_slot[exact_valid_starts(t._episodes, width, burn_in)].tolist())


def test_prioritized_sequences_give_zero_mass_to_invalid_starts_and_exact_probabilities():
    t = prio_table()
    rng = np.random.default_rng(0)
    for i in range(12):
        n = int(rng.integers(2, 10))
        t.add_episode(steps(np.arange(n) + 100 * i), stream=i % 3, priorities=rng.uniform(0.5, 4.0, n))
    t.extend_steps(steps([5000, 5001, 5002]), streams=7)  # open episode: 3 steps, no valid start yet
    valid = valid_keys(t, 5, 1)
    assert valid == set(t._index.key_of_slot[t._episodes.validity.valid.contents()].tolist())
    keys = t.keys()
    prio = t.info(keys)["priorities"]
    mass = np.where(np.isin(keys, list(valid)), prio, 0.0)
    p = dict(zip(keys.tolist(), mass / mass.sum()))
    draws = 20000
    s = t.sample_sequences(draws, 4, burn_in=1)
    assert set(s.keys.tolist()) <= valid
    np.testing.assert_allclose(s.probabilities, [p[k] for k in s.keys.tolist()])
    pmin = min(v for v in p.values() if v > 0)
    np.testing.assert_allclose(s.weights, (s.probabilities / pmin) ** -1.0)
    counts = {k: 0 for k in valid}
    for k in s.keys.tolist():
        counts[k] += 1
    for k, c in counts.items():
        sd = np.sqrt(draws * p[k] * (1 - p[k]))
        assert abs(c - draws * p[k]) < 5 * sd + 1e-9
    # the user's priority of an invalid start is kept aside and restored when it becomes valid
    t.update_priorities(t.keys()[-3:], [50.0, 50.0, 50.0])  # the open episode's steps: still invalid
    assert t.info(t.keys()[-3:])["priorities"].tolist() == [50.0] * 3
    assert not np.isin(t.sample_sequences(500, 4, burn_in=1).keys, t.keys()[-3:]).any()
    t.extend_steps(steps([5003, 5004]), streams=7)  # now id 5001 (after 1 burn-in step) starts a window
    k5001 = int(t.keys()[-4])
    s = t.sample_sequences(2000, 4, burn_in=1)
    assert (s.keys == k5001).mean() > 0.2  # priority 50 against a total of ~ 50 + 60
    assert (s.data["id"][s.keys == k5001] == np.arange(5000, 5005)).all()


def test_prioritized_sequences_follow_eviction_and_deletes():
    t = prio_table(capacity=30, length=3, burn_in=0)
    for i in range(10):
        t.add_episode(steps(np.arange(6) + 10 * i), stream=0, priorities=np.full(6, 1.0 + i))
        assert valid_keys(t, 3, 0) == set(t._index.key_of_slot[t._episodes.validity.valid.contents()].tolist())
    victim = int(t.keys()[-2])
    t.delete([victim])
    assert valid_keys(t, 3, 0) == set(t._index.key_of_slot[t._episodes.validity.valid.contents()].tolist())
    s = t.sample_sequences(3000, 3)
    assert not (s.step_keys == victim).any()
    assert s.data["id"].min() >= 40  # the evicted episodes are gone


def test_prioritized_sequences_refuse_other_windows_and_all_zero_falls_back_to_uniform():
    t = prio_table(length=4, burn_in=1)
    t.add_episode(steps(np.arange(8)), stream=0)
    with pytest.raises(rs.EpisodeError, match="sequence_length=5"):
        t.sample_sequences(2, 5)
    with pytest.raises(rs.EpisodeError, match="sequence_length=5"):
        t.sample_sequences(2, 4, burn_in=1, mode="padded")
    t.update_priorities(t.keys(), np.zeros(8))
    s = t.sample_sequences(400, 4, burn_in=1)
    assert set(s.data["id"][:, 1].tolist()) == {1, 2, 3, 4}
    np.testing.assert_allclose(s.probabilities, 1 / 4)
    plain = rs.Table(10, sampler=rs.Prioritized(), episodes=rs.Episodes())
    plain.add_step(step(0))
    with pytest.raises(rs.EpisodeError, match="sequence_length"):
        plain.sample_sequences(1, 1)


def test_uniform_with_a_tracked_window_is_exact():
    t = rs.Table(100, seed=0, episodes=rs.Episodes(sequence_length=3))
    t.add_episode(steps(np.arange(5)), stream=0)
    t.add_episode(steps(np.arange(10, 12)), stream=1)
    s = t.sample_sequences(300, 3)
    np.testing.assert_allclose(s.probabilities, 1 / 3)
    assert set(s.data["id"][:, 0].tolist()) == {0, 1, 2}


# -- rings and threads -------------------------------------------------------------------------------
def test_a_step_kept_alive_far_behind_its_stream_stays_in_it_and_is_not_misread(tmp_path):
    # MinHeap evicts the lowest priority: the high-priority first step outlives 60 newer steps of its
    # stream, further than a ring may reach (2 x capacity rounded up = 16 positions): it moves to
    # the index's overflow map and stays reachable (issue 24)
    t = rs.Table(8, remover=rs.MinHeap(), episodes=rs.Episodes(next_obs_field="next_obs"), seed=0)
    old = t.add_step(step(0), stream=0, priority=100.0)
    for i in range(1, 61):
        t.add_step(step(i), stream=0, priority=float(i))
    assert old in t
    idx = t._episodes
    assert idx.n_overflow == 1
    assert (idx.attached(t._index.lookup(t.keys()))).all()
    for _ in range(5):
        s = t.sample_sequences(16, 2, mode="padded")
        assert (np.diff(s.data["id"], axis=1)[s.mask[:, 1]] == 1).all()
        assert (~s.mask[s.step_keys[:, 0] == old, 1]).all()  # its successor is gone
        assert old not in t.sample_sequences(16, 3).step_keys
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    assert u._episodes.attached(u._index.lookup([old]))[0] and u._episodes.n_overflow == 1
    assert (u.sample_sequences(16, 3).data["id"] >= 53).all()
    assert old in u.sample_sequences(64, 1).keys


def test_concurrent_writers_blocked_by_the_rate_limiter_keep_their_streams_consecutive():
    import threading

    t = table(10_000, rate_limiter=rs.SampleToInsertRatio(1.0, 1, 6.0))
    errors = []

    def writer(s):
        try:
            for i in range(40):
                ids = np.arange(3) + 3 * i + 1000 * s
                t.extend_steps(steps(ids), streams=s, terminated=[False, False, i % 7 == 6], timeout=20)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(s,)) for s in range(3)]
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        try:
            t.sample(3, timeout=0.05)
        except rs.Timeout:
            pass
    assert not errors
    idx = t._episodes
    slots = t._index.lookup(t.keys())
    for s in range(3):
        mine = slots[idx.streams(slots) == s]
        ids = t.storage.columns["id"][mine]
        order = np.argsort(idx.positions(mine))
        assert idx.positions(mine)[order].tolist() == list(range(120))
        assert (ids[order] == np.arange(120) + 1000 * s).all()
        assert len(np.unique(idx.episode_of[mine])) == 120 // 21 + 1


def test_padded_starts_are_uniform_over_live_steps_and_episodes_uniform_over_complete_ones():
    t = table(300, seed=5)
    for i, n in enumerate((2, 5, 9)):
        t.add_episode(steps(np.arange(n) + 100 * i), stream=0)
    t.extend_steps(steps([900, 901]), streams=1)  # open: never a whole episode, but padded starts
    draws = 8000
    s = t.sample_sequences(draws, 3, burn_in=1, mode="padded")
    ids, counts = np.unique(s.data["id"][:, 1], return_counts=True)
    assert ids.tolist() == sorted([*range(2), *range(100, 105), *range(200, 209), 900, 901])
    p = 1 / 18
    assert (np.abs(counts - draws * p) < 5 * np.sqrt(draws * p * (1 - p))).all()
    e = t.sample_episodes(3000)
    lengths, c = np.unique(e.lengths, return_counts=True)
    assert lengths.tolist() == [2, 5, 9]
    assert (np.abs(c - 1000) < 5 * np.sqrt(3000 * (1 / 3) * (2 / 3))).all()
    assert t.stats()["samples"] == draws + 3000  # one per sequence, one per episode


@pytest.mark.parametrize(
    "kw",
    [
        {"max_streams": 0},
        {"max_streams": 1 << 24},
        {"sequence_length": 0},
        {"sequence_length": 3, "burn_in": 3},
        {"burn_in": -1},
        {"next_obs_field": 3},
    ],
)
def test_bad_episode_options_are_refused(kw):
    with pytest.raises(rs.EpisodeError):
        rs.Episodes(**kw)


def test_samplers_and_writers_in_threads_always_see_valid_windows():
    import threading

    t = table(
        400,
        episodes=rs.Episodes(next_obs_field="next_obs", sequence_length=6, burn_in=2),
        sampler=rs.Prioritized(alpha=1.0),
    )
    t.add_episode(steps(np.arange(10) * 4), stream=0, terminated=False)
    stop = threading.Event()
    bad = []

    def write():
        i = 10
        while not stop.is_set() and i < 3000:
            ids = np.arange(i, i + 5)
            t.extend_steps(
                steps(ids * 4 + np.arange(5) % 4),
                streams=np.arange(5) % 4,
                terminated=(ids % 37) == 0,
                priorities=np.full(5, 1.0 + i % 3),
            )
            i += 5
        stop.set()

    def sample():
        while not stop.is_set():
            s = t.sample_sequences(16, 4, burn_in=2)
            idx_ok = (np.diff(s.data["id"], axis=1) > 0).all()  # one stream's steps, in order
            n = t.sample_nstep(16, 3, 0.9)
            if not idx_ok or not ((n.steps >= 1) & (n.steps <= 3)).all():
                bad.append(s)

    threads = [threading.Thread(target=write), threading.Thread(target=sample)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not bad and stop.is_set()
    assert set(t._index.key_of_slot[t._episodes.validity.valid.contents()].tolist()) == set(
        t._index.key_of_slot[exact_valid_starts(t._episodes, 6, 2)].tolist()
    )
