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
from stable_baselines3.common.buffers import ReplayBuffer  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.type_aliases import ReplayBufferSamples  # noqa: E402
from stable_baselines3.common.vec_env import VecNormalize  # noqa: E402

from replaystore.integrations.sb3 import ReplaystoreReplayBuffer  # noqa: E402


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
        infos = [{"TimeLimit.truncated": bool(timeout_every and (t + e) % timeout_every == 0 and done[e])}
                 for e in range(n_envs)]
        for b in buffers:
            b.add(obs, nobs, act, rew, done, infos)
        steps.append((obs, nobs, act, rew, done, infos))
    return steps


def _spaces(obs_dim=3):
    return spaces.Box(-10, 10, (obs_dim,), np.float32), spaces.Discrete(4)


def test_is_an_sb3_replay_buffer():
    assert issubclass(ReplaystoreReplayBuffer, ReplayBuffer)


@pytest.mark.parametrize("action_space", [spaces.Discrete(4), spaces.Box(-1, 1, (2,), np.float64),
                                          spaces.Box(-1, 1, (2, 3), np.float32)])
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
        buf.add(np.array([[t]], np.float32), np.array([[t + 1]], np.float32), np.array([0]), np.array([0.0]),
                np.array([False]), [{}])
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
        buf.add(np.array([t, t + 1]), np.array([t + 1, t + 2]), np.array([0, 1]), np.array([1.0, 1.0]),
                np.array([False, False]), [{}, {}])
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
    with pytest.raises(ValueError, match="empty"):
        buf.sample(4)


def test_unsupported_options():
    with pytest.raises(ValueError, match="optimize_memory_usage"):
        ReplaystoreReplayBuffer(10, *_spaces(), optimize_memory_usage=True, handle_timeout_termination=False)
    with pytest.raises(TypeError, match="Dict"):
        ReplaystoreReplayBuffer(10, spaces.Dict({"a": spaces.Discrete(2)}), spaces.Discrete(2))


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
        "MlpPolicy", "CartPole-v1", replay_buffer_class=ReplaystoreReplayBuffer, buffer_size=10_000,
        learning_starts=500, learning_rate=2.3e-3, batch_size=64, train_freq=1, gradient_steps=1,
        target_update_interval=100, exploration_fraction=0.3, exploration_final_eps=0.05,
        policy_kwargs={"net_arch": [64, 64]}, seed=0, device="cpu",
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
    model = SAC("MlpPolicy", "Pendulum-v1", replay_buffer_class=ReplaystoreReplayBuffer, buffer_size=1_000,
                learning_starts=100, batch_size=32, policy_kwargs={"net_arch": [32, 32]}, seed=0, device="cpu")
    model.learn(300)
    assert model.replay_buffer.size() == 300
    s = model.replay_buffer.sample(16)
    assert s.actions.shape == (16, 1) and s.actions.dtype == th.float32
