"""ReplaystoreReplayBuffer against Stable-Baselines3's ReplayBuffer expectations.

Ported from SB3's tests/test_buffers.py (DummyEnv, normalisation, device) plus the semantics SB3's
algorithms rely on: shapes and dtypes, timeouts, n_envs > 1, pos/full/size(), reset, pickling.
"""

import pickle

import numpy as np
import pytest

sb3 = pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")
import torch as th  # noqa: E402
from gymnasium import spaces  # noqa: E402
from stable_baselines3 import DQN, SAC  # noqa: E402
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.type_aliases import ReplayBufferSamples  # noqa: E402
from stable_baselines3.common.vec_env import VecNormalize  # noqa: E402

from replaystore.errors import InvalidType  # noqa: E402
from replaystore.integrations.sb3 import (  # noqa: E402
    ReplaystoreDictReplayBuffer,
    ReplaystoreNStepReplayBuffer,
    ReplaystorePrioritizedReplayBuffer,
    ReplaystoreReplayBuffer,
    SB3BufferError,
)


class DummyEnv(gym.Env):
    """SB3's test env: Box(1, 5) observations cycling 1..5, rewards 1..5, time limit 100."""

    def __init__(self):
        self.action_space = spaces.Box(1, 5, (1,))
        self.observation_space = spaces.Box(1, 5, (1,))
        self._observations = np.array([[1.0], [2.0], [3.0], [4.0], [5.0]], dtype=np.float32)
        self._rewards = [1, 2, 3, 4, 5]
        self._t = 0
        self._ep_length = 100

    def reset(self, *, seed=None, options=None):
        self._t = 0
        return self._observations[0], {}

    def step(self, action):
        self._t += 1
        index = self._t % len(self._observations)
        truncated = self._t >= self._ep_length
        return self._observations[index], self._rewards[index], False, truncated, {}


def _fill(buffers, n, n_envs=1, obs_dim=3, seed=0, done_every=7, timeout_every=None):
    """Add the same ``n`` steps of ``n_envs`` transitions to every buffer; return them."""
    rng = np.random.default_rng(seed)
    steps = []
    for t in range(n):
        obs = rng.standard_normal((n_envs, obs_dim)).astype(np.float32)
        nobs = obs + 1
        act = rng.integers(0, 4, size=n_envs)
        rew = rng.standard_normal(n_envs)
        done = np.array([(t + e) % done_every == 0 for e in range(n_envs)])
        infos = [
            {"TimeLimit.truncated": bool(timeout_every and (t + e) % timeout_every == 0 and done[e])}
            for e in range(n_envs)
        ]
        for b in buffers:
            b.add(obs, nobs, act, rew, done, infos)
        steps.append((obs, nobs, act, rew, done, infos))
    return steps


def _spaces(obs_dim=3):
    return spaces.Box(-10, 10, (obs_dim,), np.float32), spaces.Discrete(4)


def test_is_an_sb3_replay_buffer():
    assert issubclass(ReplaystoreReplayBuffer, ReplayBuffer)


@pytest.mark.parametrize(
    "action_space", [spaces.Discrete(4), spaces.Box(-1, 1, (2,), np.float64), spaces.Box(-1, 1, (2, 3), np.float32)]
)
def test_sample_shapes_and_dtypes_match_sb3(action_space):
    obs_space = spaces.Box(-10, 10, (3,), np.float32)
    ours = ReplaystoreReplayBuffer(100, obs_space, action_space, device="cpu")
    ref = ReplayBuffer(100, obs_space, action_space, device="cpu")
    rng = np.random.default_rng(0)
    for _ in range(20):
        obs = rng.standard_normal((1, 3)).astype(np.float32)
        act = np.array([action_space.sample()])
        for b in (ours, ref):
            b.add(obs, obs + 1, act, np.array([1.0]), np.array([False]), [{}])
    a, b = ours.sample(8), ref.sample(8)
    assert isinstance(a, ReplayBufferSamples)
    for name in ("observations", "actions", "next_observations", "dones", "rewards"):
        ta, tb = getattr(a, name), getattr(b, name)
        assert isinstance(ta, th.Tensor)
        assert ta.shape == tb.shape, name
        assert ta.dtype == tb.dtype, name
    assert a.discounts is None


def test_stored_transitions_equal_sb3_contents():
    obs_space, act_space = _spaces()
    ours = ReplaystoreReplayBuffer(50, obs_space, act_space, device="cpu")
    ref = ReplayBuffer(50, obs_space, act_space, device="cpu")
    _fill([ours, ref], 80)  # wraps around
    data, _ = ours.table.get(ours.table.keys())
    assert np.array_equal(np.sort(data["obs"][:, 0]), np.sort(ref.observations[:, 0, 0]))
    assert np.array_equal(np.sort(data["action"][:, 0]), np.sort(ref.actions[:, 0, 0]))
    assert np.allclose(np.sort(data["reward"]), np.sort(ref.rewards[:, 0]))


def test_pos_full_and_size_follow_sb3():
    obs_space, act_space = _spaces()
    ours = ReplaystoreReplayBuffer(10, obs_space, act_space, device="cpu")
    ref = ReplayBuffer(10, obs_space, act_space, device="cpu")
    for t in range(25):
        _fill([ours, ref], 1, seed=t)
        assert (ours.pos, ours.full, ours.size()) == (ref.pos, ref.full, ref.size())
        assert len(ours.table) == ref.size()
    ours.reset()
    assert (ours.pos, ours.full, ours.size(), len(ours.table)) == (0, False, 0, 0)


def test_oldest_transitions_leave_first():
    obs_space, act_space = _spaces(1)
    buf = ReplaystoreReplayBuffer(5, obs_space, act_space, device="cpu")
    for t in range(12):
        buf.add(
            np.array([[t]], np.float32),
            np.array([[t + 1]], np.float32),
            np.array([0]),
            np.array([0.0]),
            np.array([False]),
            [{}],
        )
    obs = buf.sample(200).observations.numpy().ravel()
    assert set(obs.tolist()) == {7.0, 8.0, 9.0, 10.0, 11.0}


@pytest.mark.parametrize("handle", [True, False])
def test_timeouts(handle):
    obs_space, act_space = _spaces()
    ours = ReplaystoreReplayBuffer(100, obs_space, act_space, device="cpu", handle_timeout_termination=handle)
    ref = ReplayBuffer(100, obs_space, act_space, device="cpu", handle_timeout_termination=handle)
    # every transition ends its episode; every other one by a time limit
    for t in range(40):
        obs = np.full((1, 3), t, np.float32)
        for b in (ours, ref):
            b.add(obs, obs, np.array([0]), np.array([1.0]), np.array([True]), [{"TimeLimit.truncated": t % 2 == 0}])
    s = ours.sample(400)
    t_of = s.observations[:, 0].numpy().astype(int)
    dones = s.dones[:, 0].numpy()
    if handle:
        assert np.all(dones[t_of % 2 == 0] == 0)
        assert np.all(dones[t_of % 2 == 1] == 1)
    else:
        assert np.all(dones == 1)
    # same as SB3 on the same rows
    r = ref._get_samples(np.arange(40))
    assert r.dones.sum().item() == (20 if handle else 40)


def test_n_envs():
    obs_space, act_space = _spaces()
    n_envs = 3
    ours = ReplaystoreReplayBuffer(30, obs_space, act_space, device="cpu", n_envs=n_envs)
    ref = ReplayBuffer(30, obs_space, act_space, device="cpu", n_envs=n_envs)
    assert ours.buffer_size == ref.buffer_size == 10
    assert ours.table.capacity == 30
    steps = _fill([ours, ref], 14, n_envs=n_envs)
    assert (ours.pos, ours.full, ours.size()) == (ref.pos, ref.full, ref.size()) == (4, True, 10)
    assert len(ours.table) == 30
    # the live items are the last 10 steps of every environment
    kept = {float(x) for obs, *_ in steps[-10:] for x in obs[:, 0]}
    s = ours.sample(500)
    assert s.observations.shape == (500, 3)
    assert {float(x) for x in s.observations[:, 0].numpy()} <= kept
    assert len({float(x) for x in s.observations[:, 0].numpy()}) > 20  # from all environments


def test_discrete_observations_with_n_envs():
    obs_space, act_space = spaces.Discrete(10), spaces.Discrete(2)
    buf = ReplaystoreReplayBuffer(20, obs_space, act_space, device="cpu", n_envs=2)
    for t in range(5):
        buf.add(
            np.array([t, t + 1]),
            np.array([t + 1, t + 2]),
            np.array([0, 1]),
            np.array([1.0, 1.0]),
            np.array([False, False]),
            [{}, {}],
        )
    s = buf.sample(4)
    assert s.observations.shape == (4, 1) and s.observations.dtype == th.int64


def test_replay_buffer_normalization():
    env = VecNormalize(make_vec_env(DummyEnv))
    buffer = ReplaystoreReplayBuffer(100, env.observation_space, env.action_space, device="cpu")
    env.reset()
    obs = env.get_original_obs()
    for _ in range(100):
        action = env.action_space.sample()
        _, _, done, info = env.step(action)
        next_obs = env.get_original_obs()
        reward = env.get_original_reward()
        buffer.add(obs, next_obs, action, reward, done, info)
        obs = next_obs
    sample = buffer.sample(50, env)
    for observations in [sample.observations, sample.next_observations]:
        assert th.allclose(observations.mean(0), th.zeros(1), atol=1)
    assert np.allclose(sample.rewards.mean(0), np.zeros(1), atol=1)


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_device_buffer(device):
    from stable_baselines3.common.utils import get_device

    env = make_vec_env(DummyEnv)
    buffer = ReplaystoreReplayBuffer(100, env.observation_space, env.action_space, device=device)
    obs = env.reset()
    for _ in range(100):
        action = env.action_space.sample()
        next_obs, reward, done, info = env.step(action)
        buffer.add(obs, next_obs, action, reward, done, info)
        obs = next_obs
    for value in buffer.sample(50):
        if value is not None:
            assert value.device.type == get_device(device).type


def test_sample_from_empty_buffer_raises():
    buf = ReplaystoreReplayBuffer(10, *_spaces(), device="cpu")
    with pytest.raises(SB3BufferError, match="empty"):
        buf.sample(4)
    with pytest.raises(ValueError, match="empty"):  # also a ValueError, as SB3 raises
        buf.sample(4)


def test_bad_options_raise_named_errors():
    with pytest.raises(SB3BufferError, match="optimize_memory_usage"):
        ReplaystoreReplayBuffer(10, *_spaces(), optimize_memory_usage=True)  # with handle_timeout_termination
    with pytest.raises(InvalidType, match="Dict"):
        ReplaystoreReplayBuffer(10, spaces.Dict({"a": spaces.Discrete(2)}), spaces.Discrete(2))
    with pytest.raises(InvalidType, match="Dict"):
        ReplaystoreDictReplayBuffer(10, *_spaces())
    with pytest.raises(SB3BufferError):
        ReplaystoreNStepReplayBuffer(10, *_spaces(), n_steps=0)
    with pytest.raises(SB3BufferError):
        ReplaystoreNStepReplayBuffer(10, *_spaces(), gamma=0.0)
    with pytest.raises(SB3BufferError):
        ReplaystorePrioritizedReplayBuffer(10, *_spaces(), alpha=-1)


def test_arrays_are_sb3_shaped_views_of_the_table_storage():
    obs_space, act_space = _spaces()
    ours = ReplaystoreReplayBuffer(30, obs_space, act_space, device="cpu", n_envs=3)
    ref = ReplayBuffer(30, obs_space, act_space, device="cpu", n_envs=3)
    _fill([ours, ref], 14, n_envs=3, timeout_every=3)
    for name in ("observations", "next_observations", "actions", "rewards", "dones", "timeouts"):
        a, b = getattr(ours, name), getattr(ref, name)
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert np.array_equal(a, b), name
    # the arrays are the table's storage: a write through them is what the next sample reads
    ours.rewards[:] = 7.0
    assert np.all(ours.sample(64).rewards.numpy() == 7.0)
    assert np.shares_memory(ours.observations, ours.table.storage.arrays["obs"])


def test_failed_add_changes_nothing():
    obs_space, act_space = _spaces()
    buf = ReplaystoreReplayBuffer(4, obs_space, act_space, device="cpu")
    _fill([buf], 6)  # full, wrapped
    before = {n: getattr(buf, n).copy() for n in ("observations", "next_observations", "rewards")}
    state = (buf.pos, buf.full, len(buf.table), buf.table.stats()["inserts"])
    good = np.zeros((1, 3), np.float32)
    with pytest.raises(SB3BufferError, match="obs"):
        buf.add(np.zeros((1, 5), np.float32), good, np.array([0]), np.array([1.0]), np.array([False]), [{}])
    with pytest.raises(SB3BufferError, match="reward"):
        buf.add(good, good, np.array([0]), np.array([1.0, 2.0]), np.array([False]), [{}])
    with pytest.raises(SB3BufferError, match="infos"):
        buf.add(good, good, np.array([0]), np.array([1.0]), np.array([False]), [])
    with pytest.raises(SB3BufferError, match="action"):
        buf.add(good, good, np.array([0, 1]), np.array([1.0]), np.array([False]), [{}])
    assert (buf.pos, buf.full, len(buf.table), buf.table.stats()["inserts"]) == state
    for n, arr in before.items():
        assert np.array_equal(getattr(buf, n), arr), n


@pytest.mark.parametrize("n_envs", [1, 2])
def test_optimize_memory_usage_matches_sb3(n_envs):
    obs_space, act_space = spaces.Box(-1e6, 1e6, (2,), np.float32), spaces.Discrete(3)
    kw = dict(device="cpu", n_envs=n_envs, optimize_memory_usage=True, handle_timeout_termination=False)
    ours = ReplaystoreReplayBuffer(8 * n_envs, obs_space, act_space, **kw)
    ref = ReplayBuffer(8 * n_envs, obs_space, act_space, **kw)
    assert not hasattr(ours, "next_observations") and not hasattr(ref, "next_observations")
    for t in range(21):  # step t: obs t, next obs t + 1 in every environment (+ 1000 * env)
        obs = (t + 1000 * np.arange(n_envs, dtype=np.float32))[:, None].repeat(2, axis=1)
        for b in (ours, ref):
            b.add(
                obs,
                obs + 1,
                np.zeros(n_envs, np.int64),
                np.full(n_envs, t, np.float32),
                np.zeros(n_envs),
                [{}] * n_envs,
            )
        assert np.array_equal(ours.observations, ref.observations)
        s = ours.sample(400)
        o, no, r = s.observations[:, 0].numpy(), s.next_observations[:, 0].numpy(), s.rewards[:, 0].numpy()
        assert np.all(no == o + 1)  # never the row whose observation the newest add overwrote
        assert np.all(o % 1000 == r)
        # exactly the rows SB3 samples: every row but the overwritten one (when full)
        valid = min(t + 1, 7)
        assert len(ours.table) == valid * n_envs
        assert set(np.unique(r).tolist()) == set(range(t + 1 - valid, t + 1))
    r = ref._get_samples(np.arange(8))
    np.random.seed(0)
    a = ours._get_samples(np.arange(8))
    np.random.seed(0)
    b = ref._get_samples(np.arange(8))
    assert all(th.equal(x, y) for x, y in zip(a[:5], b[:5]))


def test_external_pos_and_full_changes_are_followed():
    # SB3's test_buffer_dtypes sets `full = True` on an empty buffer and samples: SB3 reads every row
    buf = ReplaystoreReplayBuffer(5, *_spaces(), device="cpu")
    buf.full = True
    assert buf.sample(10).observations.shape == (10, 3)
    assert len(buf.table) == 5
    buf.reset()
    _fill([buf], 3)
    buf.pos = 1  # rewind by hand: SB3 samples only row 0
    assert len(buf.table) == 1
    assert buf.sample(5).observations.shape == (5, 3)


def test_dict_buffer_matches_sb3():
    obs_space = spaces.Dict(
        {
            "img": spaces.Box(0, 255, (2, 3), np.uint8),
            "vec": spaces.Box(-1, 1, (4,), np.float32),
            "d": spaces.Discrete(5),
        }
    )
    act_space = spaces.Box(-1, 1, (2,), np.float64)
    n_envs = 2
    ours = ReplaystoreDictReplayBuffer(12, obs_space, act_space, device="cpu", n_envs=n_envs)
    ref = DictReplayBuffer(12, obs_space, act_space, device="cpu", n_envs=n_envs)
    rng = np.random.default_rng(0)
    for t in range(9):
        obs = {
            "img": rng.integers(0, 255, (n_envs, 2, 3), dtype=np.uint8),
            "vec": rng.standard_normal((n_envs, 4)).astype(np.float32),
            "d": rng.integers(0, 5, n_envs),
        }
        nobs = {k: v.copy() for k, v in obs.items()}
        act = rng.standard_normal((n_envs, 2))
        for b in (ours, ref):
            b.add(
                {k: v.copy() for k, v in obs.items()},
                {k: v.copy() for k, v in nobs.items()},
                act,
                np.full(n_envs, t, np.float32),
                np.zeros(n_envs),
                [{"TimeLimit.truncated": t % 2 == 0}] * n_envs,
            )
    for k in obs_space.spaces:
        assert np.array_equal(ours.observations[k], ref.observations[k]), k
        assert np.array_equal(ours.next_observations[k], ref.next_observations[k]), k
    assert np.array_equal(ours.actions, ref.actions) and ours.actions.dtype == np.float32
    np.random.seed(1)
    a = ours._get_samples(np.arange(6))
    np.random.seed(1)
    b = ref._get_samples(np.arange(6))
    for k in obs_space.spaces:
        assert th.equal(a.observations[k], b.observations[k]) and a.observations[k].dtype == b.observations[k].dtype
    assert th.equal(a.dones, b.dones) and th.equal(a.rewards, b.rewards) and th.equal(a.actions, b.actions)
    s = ours.sample(50)
    assert set(s.observations) == set(obs_space.spaces) and s.observations["img"].shape == (50, 2, 3)
    assert set(np.unique(s.rewards.numpy()).tolist()) <= set(range(3, 9))  # 6 rows kept of 9


def test_dict_buffer_optimize_memory_usage():
    box = spaces.Box(-1e6, 1e6, (1,), np.float32)
    obs_space = spaces.Dict({"a": box, "b": spaces.Box(-1e6, 1e6, (2,), np.float32)})
    buf = ReplaystoreDictReplayBuffer(
        6, obs_space, spaces.Discrete(2), device="cpu", optimize_memory_usage=True, handle_timeout_termination=False
    )
    for t in range(10):
        o = {"a": np.full((1, 1), t, np.float32), "b": np.full((1, 2), -t, np.float32)}
        n = {"a": np.full((1, 1), t + 1, np.float32), "b": np.full((1, 2), -t - 1, np.float32)}
        buf.add(o, n, np.array([0]), np.array([t], np.float32), np.array([0.0]), [{}])
    s = buf.sample(300)
    assert th.all(s.next_observations["a"] == s.observations["a"] + 1)
    assert th.all(s.next_observations["b"] == s.observations["b"] - 1)
    assert set(np.unique(s.rewards.numpy()).tolist()) == {5.0, 6.0, 7.0, 8.0, 9.0}


def _nstep_fill(buffers, steps, n_envs, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        obs = rng.standard_normal((n_envs, 3)).astype(np.float32)
        done = rng.random(n_envs) < 0.15
        trunc = done & (rng.random(n_envs) < 0.4)
        rew = rng.standard_normal(n_envs).astype(np.float32)
        for b in buffers:
            infos = [{"TimeLimit.truncated": bool(x)} for x in trunc]
            b.add(obs, obs + 1, np.zeros(n_envs, np.int64), rew, done, infos)


@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("steps", [7, 10, 23])
@pytest.mark.parametrize("n_steps", [1, 3, 5])
def test_nstep_equals_sb3_nstep_buffer(n_envs, steps, n_steps):
    from stable_baselines3.common.buffers import NStepReplayBuffer

    kw = dict(device="cpu", n_envs=n_envs, n_steps=n_steps, gamma=0.9)
    ours = ReplaystoreNStepReplayBuffer(10 * n_envs, *_spaces(), **kw)
    ref = NStepReplayBuffer(10 * n_envs, *_spaces(), **kw)
    assert isinstance(ours, NStepReplayBuffer)
    _nstep_fill([ours, ref], steps, n_envs, seed=steps)
    rows = np.arange(ours.size())
    np.random.seed(3)
    a = ours._get_samples(rows)
    np.random.seed(3)
    b = ref._get_samples(rows)
    for name in ("observations", "actions", "next_observations", "dones", "rewards", "discounts"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert th.allclose(x, y, rtol=1e-6, atol=1e-6), name
    # sample() draws start transitions through the table; each equals SB3's n-step sample of its row
    s = ours.sample(64)
    assert s.discounts.shape == (64, 1)
    table_rows = {tuple(ours.observations[r, e].tolist()): (r, e) for r in rows for e in range(n_envs)}
    for i in range(64):
        r, e = table_rows[tuple(s.observations[i].tolist())]
        exp = ours._nstep(np.array([r]), np.array([e]), None)
        assert th.allclose(s.rewards[i], exp.rewards[0]) and th.equal(s.dones[i], exp.dones[0])


def test_nstep_algorithm_uses_discounts():
    th.set_num_threads(1)
    model = DQN(
        "MlpPolicy",
        "CartPole-v1",
        replay_buffer_class=ReplaystoreNStepReplayBuffer,
        replay_buffer_kwargs={"n_steps": 3, "gamma": 0.9},
        gamma=0.9,
        learning_starts=50,
        buffer_size=500,
        policy_kwargs={"net_arch": [16]},
        seed=0,
        device="cpu",
    )
    model.learn(200)
    s = model.replay_buffer.sample(32)
    assert s.discounts is not None and th.all(s.discounts <= 0.9 + 1e-6)


def test_prioritized_sampling_follows_priorities_and_weights():
    buf = ReplaystorePrioritizedReplayBuffer(
        4, spaces.Box(-10, 10, (1,), np.float32), spaces.Discrete(2), device="cpu", alpha=1.0, beta=1.0, eps=0.0, seed=0
    )
    for t in range(4):
        buf.add(
            np.array([[t]], np.float32),
            np.array([[t]], np.float32),
            np.array([0]),
            np.array([0.0]),
            np.array([False]),
            [{}],
        )
    s = buf.sample(4)
    keys_by_obs = dict(zip(s.observations[:, 0].tolist(), s.keys.tolist()))
    assert np.all(s.weights.numpy() == 1.0)  # every priority is the initial maximum
    all_keys = buf.table.keys()
    buf.update_priorities(all_keys, np.array([1.0, 2.0, 3.0, 4.0]))  # td errors -> priorities |td| + eps
    n = 20_000
    s = buf.sample(n)
    counts = np.bincount(s.observations[:, 0].numpy().astype(int), minlength=4)
    p = np.array([1, 2, 3, 4]) / 10
    assert np.all(np.abs(counts / n - p) < 4 * np.sqrt(p * (1 - p) / n))
    w = s.weights[:, 0].numpy()
    expected_w = (p / p.min()) ** -1.0
    assert np.allclose(w, expected_w[s.observations[:, 0].numpy().astype(int)])
    # a newer transition gets the largest priority seen so far, also when registered lazily
    buf.add(
        np.array([[9]], np.float32),
        np.array([[9]], np.float32),
        np.array([0]),
        np.array([0.0]),
        np.array([False]),
        [{}],
    )
    info = buf.table.info(buf.table.keys())
    assert info["priorities"][-1] == 4.0
    assert keys_by_obs  # keys were returned with the first sample
    # updates for transitions that left are skipped
    assert buf.update_priorities(all_keys[:1], [5.0]) == 0


def test_prioritized_pickle_keeps_priorities_and_rng():
    buf = ReplaystorePrioritizedReplayBuffer(50, *_spaces(), device="cpu", seed=1)
    _fill([buf], 30)
    s = buf.sample(16)
    buf.update_priorities(s.keys, np.linspace(0.1, 5, 16))
    clone = pickle.loads(pickle.dumps(buf))
    assert np.array_equal(
        clone.table.info(clone.table.keys())["priorities"], buf.table.info(buf.table.keys())["priorities"]
    )
    a, b = buf.sample(32), clone.sample(32)
    assert th.equal(a.observations, b.observations) and th.equal(a.weights, b.weights)


def test_prioritized_dqn_updates_priorities_and_anneals_beta():
    from replaystore.integrations.sb3 import PrioritizedDQN

    th.set_num_threads(1)
    model = PrioritizedDQN(
        "MlpPolicy",
        "CartPole-v1",
        learning_starts=100,
        buffer_size=1_000,
        batch_size=32,
        train_freq=4,
        replay_buffer_kwargs={"beta": 0.4},
        beta_end=1.0,
        policy_kwargs={"net_arch": [16]},
        seed=0,
        device="cpu",
    )
    assert isinstance(model.replay_buffer, ReplaystorePrioritizedReplayBuffer)
    model.learn(600)
    st = model.replay_buffer.table.stats()
    assert st["priority_min"] < st["priority_max"]  # TD errors were fed back
    assert 0.9 < model.replay_buffer.beta <= 1.0


def test_seeded_sampling_repeats():
    a = ReplaystoreReplayBuffer(50, *_spaces(), device="cpu", seed=3)
    b = ReplaystoreReplayBuffer(50, *_spaces(), device="cpu", seed=3)
    _fill([a, b], 30)
    assert th.equal(a.sample(16).observations, b.sample(16).observations)


def test_pickle_roundtrip():
    buf = ReplaystoreReplayBuffer(20, *_spaces(), device="cpu", n_envs=2)
    _fill([buf], 13, n_envs=2)
    clone = pickle.loads(pickle.dumps(buf))
    assert (clone.pos, clone.full, clone.size()) == (buf.pos, buf.full, buf.size())
    stored = buf.table.get(buf.table.keys())[0]["obs"]
    assert np.array_equal(clone.table.get(clone.table.keys())[0]["obs"], stored)  # same items, same order
    sampled = clone.sample(8).observations.numpy()
    assert all((stored == row).all(axis=1).any() for row in sampled)
    _fill([clone], 3, n_envs=2)  # still usable
    assert len(clone.table) == 20


def test_dqn_cartpole_trains_with_replaystore_buffer(tmp_path):
    th.set_num_threads(1)
    model = DQN(
        "MlpPolicy",
        "CartPole-v1",
        replay_buffer_class=ReplaystoreReplayBuffer,
        buffer_size=10_000,
        learning_starts=500,
        learning_rate=2.3e-3,
        batch_size=64,
        train_freq=1,
        gradient_steps=1,
        target_update_interval=100,
        exploration_fraction=0.3,
        exploration_final_eps=0.05,
        policy_kwargs={"net_arch": [64, 64]},
        seed=0,
        device="cpu",
    )
    assert isinstance(model.replay_buffer, ReplaystoreReplayBuffer)
    before = [p.detach().clone() for p in model.policy.q_net.parameters()]
    model.learn(3_000)
    assert len(model.replay_buffer.table) == 3_000 and model.replay_buffer.size() == 3_000
    assert any(not th.equal(a, b) for a, b in zip(before, model.policy.q_net.parameters()))
    stats = model.replay_buffer.table.stats()
    assert stats["samples"] == 64 * (3_000 - 500)  # one batch per step after learning_starts
    # learns something: the greedy policy beats a random one (about 22 on CartPole)
    env = gym.make("CartPole-v1")
    returns = []
    for ep in range(5):
        obs, _ = env.reset(seed=100 + ep)
        done, ret = False, 0.0
        while not done:
            obs, r, term, trunc, _ = env.step(int(model.predict(obs, deterministic=True)[0]))
            ret += r
            done = term or trunc
        returns.append(ret)
    assert np.mean(returns) > 40, returns
    # save_replay_buffer / load_replay_buffer go through pickling
    model.save_replay_buffer(tmp_path / "rb.pkl")
    model.load_replay_buffer(tmp_path / "rb.pkl")
    assert len(model.replay_buffer.table) == 3_000


def test_sac_pendulum_runs_with_replaystore_buffer():
    th.set_num_threads(1)
    model = SAC(
        "MlpPolicy",
        "Pendulum-v1",
        replay_buffer_class=ReplaystoreReplayBuffer,
        buffer_size=1_000,
        learning_starts=100,
        batch_size=32,
        policy_kwargs={"net_arch": [32, 32]},
        seed=0,
        device="cpu",
    )
    model.learn(300)
    assert model.replay_buffer.size() == 300
    s = model.replay_buffer.sample(16)
    assert s.actions.shape == (16, 1) and s.actions.dtype == th.float32


def _live_positions(buf):
    table = buf.table
    keys = table.keys()  # oldest first
    return buf._storage.position[table._index.lookup(keys)]


def _sb3_valid_positions(ref, optimize):
    """The ring positions SB3's sample() can return, oldest first."""
    bs, n = ref.buffer_size, ref.n_envs
    if not ref.full:
        rows = np.arange(ref.pos)
    else:
        rows = (np.arange(bs) + ref.pos) % bs
        if optimize:
            rows = rows[1:]
    return (rows[:, None] * n + np.arange(n)).ravel()


@pytest.mark.parametrize("optimize", [False, True])
@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("seed", range(4))
def test_table_items_are_sb3_valid_rows_under_random_operations(optimize, n_envs, seed):
    """Random adds, samples, resets, hand-set pos/full and pickling: the table holds exactly SB3's rows."""
    rng = np.random.default_rng(seed)
    kw = dict(device="cpu", n_envs=n_envs, optimize_memory_usage=optimize, handle_timeout_termination=not optimize)
    bs = int(rng.integers(2, 7))
    obs_space, act_space = spaces.Box(-1e6, 1e6, (2,), np.float32), spaces.Discrete(3)
    ours = ReplaystoreReplayBuffer(bs * n_envs, obs_space, act_space, **kw)
    ref = ReplayBuffer(bs * n_envs, obs_space, act_space, **kw)
    t = 0
    tampered = False
    for _ in range(60):
        op = rng.choice(["add"] * 6 + ["sample", "reset", "rewind", "pickle"])
        if op == "add":
            for _ in range(int(rng.integers(1, 2 * bs))):
                obs = np.full((n_envs, 2), t, np.float32)
                for b in (ours, ref):
                    b.add(
                        obs,
                        obs + 1,
                        np.zeros(n_envs, np.int64),
                        np.full(n_envs, t, np.float32),
                        np.zeros(n_envs),
                        [{}] * n_envs,
                    )
                t += 1
        elif op == "sample" and ref.size() > (1 if optimize and ref.full else 0):
            s = ours.sample(16)
            if not (optimize and tampered):  # (a rewind breaks the next-row rule for SB3 too)
                assert np.all(s.next_observations.numpy() == s.observations.numpy() + 1)
        elif op == "reset":
            ours.reset()
            ref.reset()
            tampered = True
        elif op == "rewind" and ref.size():
            pos = int(rng.integers(0, bs))
            ours.pos = ref.pos = pos
            tampered = True
        elif op == "pickle":
            ours = pickle.loads(pickle.dumps(ours))
        assert (ours.pos, ours.full, ours.size()) == (ref.pos, ref.full, ref.size())
        expected = _sb3_valid_positions(ref, optimize)
        live = _live_positions(ours)
        assert np.array_equal(live, expected), (op, live, expected)  # same rows, in age order
        assert np.array_equal(ours.observations, ref.observations)


@pytest.mark.parametrize("steps", [9, 30])
def test_nstep_agrees_with_the_core_sample_nstep(steps):
    """SB3's n-step rules on the arrays give what the core's episodic Table.sample_nstep gives."""
    import replaystore as rs

    n_envs, bs, n, gamma = 2, 12, 3, 0.9
    obs_space = spaces.Box(-1e6, 1e6, (2,), np.float32)
    ours = ReplaystoreNStepReplayBuffer(
        bs * n_envs, obs_space, spaces.Discrete(2), device="cpu", n_envs=n_envs, n_steps=n, gamma=gamma
    )
    core = rs.Table(
        bs * n_envs,
        remover=rs.Fifo(),
        seed=0,
        episodes=rs.Episodes(obs_field="obs", next_obs_field="next_obs", reward_field="reward"),
    )
    rng = np.random.default_rng(steps)
    for t in range(steps):
        row = t % bs
        ident = (row * n_envs + np.arange(n_envs)).astype(np.float32)
        obs = np.stack([ident, np.full(n_envs, t, np.float32)], axis=1)
        nobs = obs + 0.5
        rew = rng.standard_normal(n_envs).astype(np.float32)
        term = rng.random(n_envs) < 0.15
        trunc = ~term & (rng.random(n_envs) < 0.1)
        ours.add(
            obs, nobs, np.zeros(n_envs, np.int64), rew, term | trunc, [{"TimeLimit.truncated": bool(x)} for x in trunc]
        )
        core.extend_steps(
            {"obs": obs, "next_obs": nobs, "reward": rew}, streams=np.arange(n_envs), terminated=term, truncated=trunc
        )
    assert len(core) == len(ours.table)
    s = core.sample_nstep(200, n, gamma)
    pos = s.data["obs"][:, 0].astype(np.int64)
    exp = ours._nstep(pos // n_envs, pos % n_envs, None)
    assert np.allclose(exp.rewards[:, 0].numpy(), s.returns, rtol=1e-5, atol=1e-5)
    assert np.array_equal(exp.dones[:, 0].numpy().astype(bool), s.done)
    assert np.allclose((exp.discounts * (1 - exp.dones))[:, 0].numpy(), s.discount, rtol=1e-6)
    assert np.array_equal(exp.next_observations.numpy(), s.next_obs)


def test_add_accepts_what_numpy_assignment_accepts():
    # SB3's test_save_load_replay_buffer passes infos whose values are arrays of shape (n_envs,)
    ours = ReplaystoreReplayBuffer(10, *_spaces(), device="cpu")
    ref = ReplayBuffer(10, *_spaces(), device="cpu")
    obs = np.ones((1, 1, 3), np.float32)  # a leading 1 more than the row, as NumPy allows
    for b in (ours, ref):
        b.add(
            obs, obs, np.array([[1]]), np.array([[2.0]]), np.array([[True]]), [{"TimeLimit.truncated": np.array([1.0])}]
        )
    for name in ("observations", "actions", "rewards", "dones", "timeouts"):
        assert np.array_equal(getattr(ours, name), getattr(ref, name)), name
    with pytest.raises(SB3BufferError):
        ours.add(obs, obs, np.array([1]), np.array([2.0]), np.array([True]), [{"TimeLimit.truncated": [1, 2]}])
    assert ours.pos == 1
