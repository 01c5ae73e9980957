"""Offline data: D4RL-style arrays and Minari datasets (built here with minari's API) into Tables."""

import numpy as np
import pytest

import replaystore as rs
from replaystore.offline import (
    OfflineDataError,
    d4rl_transitions,
    load_d4rl,
    load_minari,
    minari_transitions,
)


def d4rl_arrays(with_next=False):
    # episodes: rows 0-2 (terminal at 2), rows 3-5 (timeout at 5), rows 6-7 (dataset ends mid-episode)
    n = 8
    obs = np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    out = {
        "observations": obs,
        "actions": np.arange(n, dtype=np.int64) * 10,
        "rewards": np.arange(n, dtype=np.float64) / 2,
        "terminals": np.array([0, 0, 1, 0, 0, 0, 0, 0], dtype=np.float32),
        "timeouts": np.array([0, 0, 0, 0, 0, 1, 0, 0], dtype=bool),
    }
    if with_next:
        out["next_observations"] = obs + 100
    return out


def test_d4rl_without_next_observations_follows_the_documented_rules():
    c = d4rl_transitions(d4rl_arrays())
    kept = [0, 1, 2, 3, 4, 6]  # 5: timeout (next obs unknown), 7: last row, not terminal
    assert c["action"].tolist() == [10 * i for i in kept]
    assert np.array_equal(c["obs"][:, 0], np.array(kept, np.float32))
    # next obs is the following row; the terminal row 2 keeps its own obs as a placeholder
    assert c["next_obs"][:, 0].tolist() == [1, 2, 2, 4, 5, 7]
    assert c["terminated"].tolist() == [False, False, True, False, False, False]
    assert not c["truncated"].any()
    assert c["reward"].dtype == np.float32 and c["reward"].tolist() == [i / 2 for i in kept]


def test_d4rl_with_next_observations_keeps_every_row_and_timeouts_as_truncated():
    t = load_d4rl(d4rl_arrays(with_next=True), capacity=20, seed=0)
    assert len(t) == 8
    data, _ = t.get(t.keys())
    assert np.array_equal(data["next_obs"], d4rl_arrays(True)["next_observations"])
    assert data["truncated"].tolist() == [False] * 5 + [True] + [False] * 2
    assert data["terminated"].tolist() == [False, False, True] + [False] * 5
    s = t.sample(16)
    assert np.array_equal(s.data["next_obs"], s.data["obs"] + 100)


def test_d4rl_bad_input_changes_nothing():
    t = rs.Table(100)
    t.extend(
        {
            "obs": np.zeros((2, 3), np.float32),
            "action": np.zeros(2, np.int64),
            "reward": np.zeros(2, np.float32),
            "next_obs": np.zeros((2, 3), np.float32),
            "terminated": np.zeros(2, bool),
            "truncated": np.zeros(2, bool),
        }
    )
    cases = []
    a = d4rl_arrays()
    del a["timeouts"]
    cases.append((a, "timeouts"))
    a = d4rl_arrays()
    a["actions"] = a["actions"][:-1]
    cases.append((a, "rows"))
    a = d4rl_arrays()
    a["terminals"] = a["terminals"] * 2
    cases.append((a, "booleans"))
    a = d4rl_arrays()
    a["rewards"][3] = np.nan
    cases.append((a, "NaN"))
    for arrays, msg in cases:
        with pytest.raises(OfflineDataError, match=msg):
            load_d4rl(arrays, table=t)
        assert len(t) == 2 and t.stats()["inserts"] == 2
    with pytest.raises(rs.SpecError):  # obs of the wrong width for this table
        a = d4rl_arrays()
        a["observations"] = np.zeros((8, 5), np.float32)
        load_d4rl(a, table=t)
    with pytest.raises(OfflineDataError, match="free space"):
        load_d4rl(d4rl_arrays(), table=rs.Table(4))
    assert len(t) == 2


# -- Minari -----------------------------------------------------------------------------------------
minari = pytest.importorskip("minari")
pytest.importorskip("h5py")


def _episodes(env_id="CartPole-v1", n=4, seed=0):
    import gymnasium as gym
    from minari.data_collector import EpisodeBuffer

    env = gym.make(env_id)
    env.action_space.seed(seed)
    bufs = []
    for ep in range(n):
        o, _ = env.reset(seed=seed + ep)
        obs, acts, rews, te, tr = [o], [], [], [], []
        for step in range(25):
            a = env.action_space.sample()
            o, r, t1, t2, _ = env.step(a)
            t2 = t2 or (step == 24 and not t1)  # cut long episodes: a truncated end
            obs.append(o)
            acts.append(a)
            rews.append(r)
            te.append(t1)
            tr.append(t2)
            if t1 or t2:
                break
        bufs.append(
            EpisodeBuffer(
                id=ep,
                observations=np.array(obs),
                actions=np.array(acts),
                rewards=np.array(rews),
                terminations=np.array(te),
                truncations=np.array(tr),
            )
        )
    return bufs


@pytest.fixture
def minari_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    return tmp_path / "minari"


def test_minari_dataset_round_trips_as_transitions(minari_dir):
    import warnings

    bufs = _episodes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers("test/cartpole-tiny-v0", bufs, env="CartPole-v1", algorithm_name="random")
    t = load_minari("test/cartpole-tiny-v0", capacity=1000)
    n = sum(len(b.rewards) for b in bufs)
    assert len(t) == n
    data, _ = t.get(np.arange(n))
    exp_obs = np.concatenate([b.observations[:-1] for b in bufs])
    exp_next = np.concatenate([b.observations[1:] for b in bufs])
    assert np.array_equal(data["obs"], exp_obs.astype(data["obs"].dtype))
    assert np.array_equal(data["next_obs"], exp_next.astype(data["obs"].dtype))
    assert np.array_equal(data["action"], np.concatenate([b.actions for b in bufs]))
    assert np.array_equal(data["terminated"], np.concatenate([b.terminations for b in bufs]))
    assert np.array_equal(data["truncated"], np.concatenate([b.truncations for b in bufs]))
    assert data["terminated"].sum() + data["truncated"].sum() == len(bufs)  # one end per episode
    # a subset of episodes, into an existing table
    t2 = rs.Table(500)
    load_minari(minari.load_dataset("test/cartpole-tiny-v0"), table=t2, episode_indices=[1, 3])
    assert len(t2) == len(bufs[1].rewards) + len(bufs[3].rewards)


def test_minari_dict_observations(minari_dir):
    import warnings

    import gymnasium as gym
    from minari.data_collector import EpisodeBuffer

    space = gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1, 1, (2,), np.float32), "img": gym.spaces.Box(0, 255, (4, 4), np.uint8)}
    )
    rng = np.random.default_rng(0)
    bufs = []
    for ep in range(2):
        T = 5 + ep
        obs = {
            "pos": rng.uniform(-1, 1, (T + 1, 2)).astype(np.float32),
            "img": rng.integers(0, 256, (T + 1, 4, 4), dtype=np.uint8),
        }
        bufs.append(
            EpisodeBuffer(
                id=ep,
                observations=obs,
                actions=rng.integers(0, 3, T),
                rewards=rng.random(T),
                terminations=np.r_[np.zeros(T - 1, bool), True],
                truncations=np.zeros(T, bool),
            )
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers(
            "test/dict-tiny-v0",
            bufs,
            observation_space=space,
            action_space=gym.spaces.Discrete(3),
            algorithm_name="random",
        )
    c = minari_transitions("test/dict-tiny-v0")
    assert np.array_equal(c["obs"]["img"], np.concatenate([b.observations["img"][:-1] for b in bufs]))
    assert np.array_equal(c["next_obs"]["pos"], np.concatenate([b.observations["pos"][1:] for b in bufs]))
    t = load_minari("test/dict-tiny-v0", capacity=20, storage=rs.CompressedColumnStorage(20, compress=["obs/img"]))
    s = t.sample(8)
    assert s.data["obs"]["img"].shape == (8, 4, 4)


def test_d4rl_from_npz_and_hdf5_files(tmp_path):
    h5py = pytest.importorskip("h5py")
    a = d4rl_arrays(with_next=True)
    np.savez(tmp_path / "d.npz", **a)
    with h5py.File(tmp_path / "d.hdf5", "w") as f:
        for k, v in a.items():
            f.create_dataset(k, data=v)
        f.create_group("infos").create_dataset("qpos", data=np.zeros((8, 2)))  # ignored
    for name in ("d.npz", "d.hdf5"):
        t = load_d4rl(tmp_path / name, capacity=8)
        data, _ = t.get(t.keys())
        assert np.array_equal(data["next_obs"], a["next_observations"])
        assert data["truncated"].tolist() == a["timeouts"].tolist()
    (tmp_path / "bad.hdf5").write_bytes(b"not an hdf5 file" * 10)
    t = rs.Table(20)
    for bad in ("bad.hdf5", "missing.npz", "d.csv"):
        with pytest.raises(OfflineDataError):
            load_d4rl(tmp_path / bad, table=t)
    assert len(t) == 0


def test_minari_download_reaches_minari_not_the_table(minari_dir, monkeypatch):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minari.create_dataset_from_buffers(
            "test/dl-tiny-v0", _episodes(n=2), env="CartPole-v1", algorithm_name="random"
        )
    real, calls = minari.load_dataset, []

    def spy(dataset_id, download=False, **kwargs):  # records the flag, loads locally (no network here)
        calls.append(download)
        return real(dataset_id, **kwargs)

    monkeypatch.setattr(minari, "load_dataset", spy)
    t = load_minari("test/dl-tiny-v0", capacity=1000, download=True)
    assert calls == [True] and len(t) > 0 and t.capacity == 1000
    load_minari("test/dl-tiny-v0", capacity=1000)
    assert calls == [True, False]
