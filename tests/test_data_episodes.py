"""Offline episodes and mixed sequence/n-step sampling on episodic tables (needs the episode API)."""

import numpy as np
import pytest

import replaystore as rs

if not hasattr(rs.Table, "sample_sequences"):  # the episode API (issue #11) is not in this core
    pytest.skip("episodic tables are not available", allow_module_level=True)

from replaystore.mixing import InvalidMix, MixedSampler  # noqa: E402
from replaystore.offline import OfflineDataError, load_d4rl  # noqa: E402


def d4rl_episodes(lengths=(5, 7, 4), seed=0, with_next=True):
    rng = np.random.default_rng(seed)
    n = sum(lengths)
    obs = np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    terminals = np.zeros(n, bool)
    timeouts = np.zeros(n, bool)
    ends = np.cumsum(lengths) - 1
    terminals[ends[0]] = True  # episode 0 terminal, episode 1 time limit, episode 2 cut by the data
    timeouts[ends[1]] = True
    out = {
        "observations": obs,
        "actions": rng.integers(0, 3, n),
        "rewards": np.ones(n),
        "terminals": terminals,
        "timeouts": timeouts,
    }
    if with_next:
        out["next_observations"] = obs + 0.5
    return out


def test_d4rl_as_episodes_keeps_episode_structure():
    t = load_d4rl(d4rl_episodes(), capacity=64, as_episodes=True)
    assert t.episodic and len(t) == 16
    eps = t.sample_episodes(50)
    eps = eps[0] if isinstance(eps, tuple) else eps
    lengths = sorted({len(e["reward"]) for e in eps})
    assert lengths == [4, 5, 7]
    for e in eps:  # each episode's obs are consecutive rows of the arrays
        assert np.array_equal(np.diff(e["obs"][:, 0]), np.ones(len(e["obs"]) - 1, np.float32))
    s = t.sample_sequences(32, 4)
    assert s.data["obs"].shape == (32, 4, 2)
    # a window of one episode is consecutive rows; none crosses an episode end
    assert (np.diff(s.data["obs"][:, :, 0], axis=1) == 1).all()
    ns = t.sample_nstep(64, 3, 0.9)
    assert ns.steps.min() >= 1 and ns.steps.max() <= 3
    # episode 0 is terminal at its step 4 (row 4): a start at rows 2..4 ends the episode in the window
    assert ns.done[ns.data["obs"][:, 0] == 4].all()


def test_episodes_into_a_non_episodic_table_raise_and_change_nothing():
    t = rs.Table(100)
    with pytest.raises(OfflineDataError, match="episodic"):
        load_d4rl(d4rl_episodes(), table=t, as_episodes=True)
    assert len(t) == 0
    small = rs.Table(8, episodes=rs.Episodes(next_obs_field="next_obs"))
    with pytest.raises(OfflineDataError, match="free space"):
        load_d4rl(d4rl_episodes(), table=small, as_episodes=True)
    assert len(small) == 0


def episodic_table(start, lengths, seed):
    t = rs.Table(500, episodes=rs.Episodes(), seed=seed)
    pos = start
    for length in lengths:
        ids = np.arange(pos, pos + length)
        t.add_episode({"obs": ids.astype(np.float32)[:, None], "reward": np.ones(length, np.float32), "id": ids})
        pos += length
    return t


def test_mixed_sequences_exact_counts_and_sources():
    off = episodic_table(0, [20, 30, 25], seed=0)
    on = episodic_table(10_000, [15, 40], seed=1)
    mix = MixedSampler({"offline": off, "online": on}, ratios=(0.25, 0.75))
    s = mix.sample_sequences(16, 5, burn_in=2)
    assert s.counts.tolist() == [4, 12]
    assert s.data["id"].shape == (16, 7)
    assert (s.data["id"][s.rows("offline")] < 10_000).all() and (s.data["id"][s.rows("online")] >= 10_000).all()
    assert (np.diff(s.data["id"], axis=1) == 1).all()
    assert s.extra["mask"].shape == (16, 7) and s.extra["step_keys"].shape == (16, 7)
    assert s.extra["burn_in"] == 2
    assert (s.indices == -1).all()
    # keys are the start steps after burn-in: priority updates route back per source
    applied = mix.update_priorities(s, 1.5)
    assert applied == {"offline": len(np.unique(s.keys[:4])), "online": len(np.unique(s.keys[4:]))}


def test_mixed_nstep():
    off = episodic_table(0, [20, 30], seed=0)
    on = episodic_table(10_000, [15], seed=1)
    s = MixedSampler({"offline": off, "online": on}, ratios=(1, 1)).sample_nstep(10, 3, 0.99)
    assert s.counts.tolist() == [5, 5]
    assert s.extra["returns"].shape == (10,) and s.extra["discount"].shape == (10,)


def test_sequences_need_episodic_sources():
    off = episodic_table(0, [20], seed=0)
    flat = rs.Table(10)
    flat.extend({"obs": np.zeros((3, 1), np.float32), "reward": np.zeros(3, np.float32), "id": np.arange(3)})
    if hasattr(flat, "sample_sequences"):  # the method exists on every Table: it raises for flat ones
        with pytest.raises(rs.ReplayError):
            MixedSampler({"a": off, "b": flat}, ratios=(1, 1)).sample_sequences(4, 2)
    else:
        with pytest.raises(InvalidMix):
            MixedSampler({"a": off, "b": flat}, ratios=(1, 1)).sample_sequences(4, 2)


def test_minari_as_episodes(tmp_path, monkeypatch):
    minari = pytest.importorskip("minari")
    pytest.importorskip("h5py")
    import warnings

    from minari.data_collector import EpisodeBuffer

    from replaystore.offline import load_minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    rng = np.random.default_rng(0)
    bufs, lengths = [], (6, 9, 4)
    for ep, T in enumerate(lengths):
        obs = rng.normal(size=(T + 1, 3)).astype(np.float32)
        term = np.zeros(T, bool)
        trunc = np.zeros(T, bool)
        (term if ep != 1 else trunc)[-1] = True  # episode 1 ends by a time limit
        bufs.append(
            EpisodeBuffer(
                id=ep,
                observations=obs,
                actions=rng.integers(0, 2, T),
                rewards=np.ones(T),
                terminations=term,
                truncations=trunc,
            )
        )
    import gymnasium as gym

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers(
            "test/eps-tiny-v0",
            bufs,
            algorithm_name="random",
            observation_space=gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
            action_space=gym.spaces.Discrete(2),
        )
    t = load_minari("test/eps-tiny-v0", capacity=50, as_episodes=True, stream=0)
    assert len(t) == sum(lengths)
    s = t.sample_nstep(200, 3, 0.5)
    # every step has its true next observation (next_obs_field), truncated episode 1 bootstraps:
    # done only where a terminal step lies within the n steps
    assert s.next_obs.shape == (200, 3)
    all_obs = np.concatenate([b.observations[:-1] for b in bufs])
    ep_of = np.repeat(np.arange(3), lengths)
    pos = np.array([np.flatnonzero((all_obs == o).all(axis=1))[0] for o in s.data["obs"]])
    assert not s.done[ep_of[pos] == 1].any()
    assert s.done[(ep_of[pos] != 1) & (np.r_[np.cumsum(lengths)][ep_of[pos]] - pos <= 3)].all()
