"""Hindsight experience replay: goal strategies, relabelling exactness, bookkeeping, SB3 adapter."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from replaystore.errors import ReplayError, SpecError
from replaystore.her import (
    HindsightError,
    HindsightReplay,
    NoCompleteEpisode,
    goal_offsets,
    her_ratio,
)


def reward_fn(achieved, desired, infos):
    """Exact, vectorised: minus the L1 distance (so every relabelled reward can be checked)."""
    return -np.abs(np.asarray(achieved) - np.asarray(desired)).sum(-1).astype(np.float32)


class Streams:
    """Synthetic goal-conditioned streams: the achieved goal after step t of episode e of stream s
    is (s, e, t + 1); the desired goal is (s, e, -1); an episode of stream s has length lens[s][e]."""

    def __init__(self, lens: list[list[int]]) -> None:
        self.lens = lens
        self.n = len(lens)
        self.ep = [0] * self.n
        self.t = [0] * self.n

    def step(self):
        obs = {"observation": [], "achieved_goal": [], "desired_goal": []}
        nxt = {"observation": [], "achieved_goal": [], "desired_goal": []}
        done = []
        for s in range(self.n):
            e, t = self.ep[s], self.t[s]
            length = self.lens[s][e % len(self.lens[s])]
            obs["observation"].append([s, e, t])
            obs["achieved_goal"].append([s, e, t])
            obs["desired_goal"].append([s, e, -1])
            nxt["observation"].append([s, e, t + 1])
            nxt["achieved_goal"].append([s, e, t + 1])
            nxt["desired_goal"].append([s, e, -1])
            d = t + 1 == length
            done.append(d)
            self.t[s] = 0 if d else t + 1
            self.ep[s] += int(d)
        f = {k: np.asarray(v, np.float32) for k, v in obs.items()}
        g = {k: np.asarray(v, np.float32) for k, v in nxt.items()}
        action = np.zeros((self.n, 1), np.float32)
        reward = reward_fn(g["achieved_goal"], g["desired_goal"], None)
        return f, g, action, reward, np.asarray(done)


def fill(buf: HindsightReplay, src: Streams, steps: int) -> None:
    for _ in range(steps):
        buf.add(*src.step())


# -- building blocks ------------------------------------------------------------------------------
def test_her_ratio():
    assert her_ratio(0) == 0.0
    assert her_ratio(4) == pytest.approx(0.8)
    with pytest.raises(HindsightError):
        her_ratio(-1)
    with pytest.raises(HindsightError):
        her_ratio(1.5)


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_goal_offsets_ranges_and_uniformity(strategy):
    rng = np.random.default_rng(0)
    n = 200_000
    length = np.full(n, 10)
    position = np.full(n, 3)
    off = goal_offsets(position, length, strategy, rng)
    if strategy == "final":
        assert (off == 9).all()
        return
    lo = 3 if strategy == "future" else 0
    assert off.min() == lo and off.max() == 9
    counts = np.bincount(off - lo, minlength=10 - lo)
    p = 1 / (10 - lo)
    # each count ~ Binomial(n, p): 5 standard deviations
    assert np.abs(counts - n * p).max() < 5 * np.sqrt(n * p * (1 - p))


def test_goal_offsets_bad_strategy():
    with pytest.raises(HindsightError):
        goal_offsets(np.zeros(2), np.ones(2), "past", np.random.default_rng(0))


# -- relabelling ----------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_relabelling_is_exact(strategy):
    lens = [[5, 9, 3], [7, 2], [11]]
    buf = HindsightReplay(200, reward_fn, n_streams=3, strategy=strategy, n_sampled_goal=3, seed=1)
    src = Streams(lens)
    fill(buf, src, 60)
    b = buf.sample(4000)
    n_virtual = int(0.75 * 4000)
    assert b.relabelled.sum() == n_virtual and not b.relabelled[: 4000 - n_virtual].any()
    s, e, t = b.obs["observation"].T
    # real rows: exactly as stored
    real = ~b.relabelled
    np.testing.assert_array_equal(b.obs["desired_goal"][real][:, 2], -1)
    np.testing.assert_array_equal(
        b.reward[real], reward_fn(b.next_obs["achieved_goal"][real], b.obs["desired_goal"][real], None)
    )
    # virtual rows: goal from the same stream and episode, index by the strategy
    v = b.relabelled
    g = b.obs["desired_goal"][v]
    np.testing.assert_array_equal(g, b.next_obs["desired_goal"][v])
    np.testing.assert_array_equal(g[:, 0], s[v])
    np.testing.assert_array_equal(g[:, 1], e[v])
    length = np.array([lens[int(a)][int(c) % len(lens[int(a)])] for a, c in zip(s[v], e[v])])
    goal_step = g[:, 2]  # t' + 1 for the chosen step t'
    if strategy == "final":
        np.testing.assert_array_equal(goal_step, length)
    elif strategy == "future":
        assert (goal_step >= t[v] + 1).all() and (goal_step <= length).all()
        assert (goal_step == t[v] + 1).any() and (goal_step > t[v] + 1).any()
    else:
        assert (goal_step >= 1).all() and (goal_step <= length).all()
        assert (goal_step < t[v] + 1).any()  # past goals occur
    np.testing.assert_array_equal(b.reward[v], reward_fn(b.next_obs["achieved_goal"][v], g, None))
    # rewards are really recomputed: a goal reached by this very step gives 0
    hit = goal_step == t[v] + 1
    assert (b.reward[v][hit] == 0).all() and (b.reward[v][~hit] < 0).all()


def test_only_finished_episodes_are_sampled_and_end_episodes():
    buf = HindsightReplay(100, reward_fn, n_streams=2, n_sampled_goal=1, seed=0)
    src = Streams([[4], [50]])  # stream 1 does not finish an episode in 10 steps
    with pytest.raises(NoCompleteEpisode):
        buf.sample(8)
    fill(buf, src, 10)
    b = buf.sample(2000)
    # stream 0 finished 2 episodes (8 steps); stream 1 none; step 8, 9 of stream 0 are open
    assert (b.obs["observation"][:, 0] == 0).all()
    assert set(np.unique(b.obs["observation"][:, 1])) == {0, 1}
    open_streams = buf.end_episodes()
    np.testing.assert_array_equal(open_streams, [0, 1])
    last = (buf.pos - 1) % buf.capacity
    assert buf.dones[last].tolist() == [1, 1] and buf.timeouts[last].tolist() == [1, 1]
    b = buf.sample(4000)
    assert set(np.unique(b.obs["observation"][:, 0])) == {0, 1}
    assert (buf.current_ep_start == buf.pos).all()
    assert len(buf.end_episodes()) == 0


def test_ring_overwrite_makes_partial_episodes_unsampleable():
    buf = HindsightReplay(10, reward_fn, n_streams=1, strategy="episode", n_sampled_goal=1, seed=0)
    src = Streams([[6]])
    fill(buf, src, 14)  # episodes 0 (steps 0-5), 1 (6-11), open 2; ring of 10: episode 0 partly gone
    assert len(buf) == 10
    b = buf.sample(3000)
    assert set(np.unique(b.obs["observation"][:, 1])) == {1}
    # an episode longer than the ring is never sampleable (its start was overwritten)
    buf2 = HindsightReplay(5, reward_fn, seed=0)
    fill(buf2, Streams([[3, 8]]), 11)  # episode 0: steps 0-2 (overwritten), episode 1: steps 3-10
    assert buf2.open_length.tolist() == [0] and (buf2.ep_length == 0).all()
    with pytest.raises(NoCompleteEpisode):
        buf2.sample(8)


def test_bad_input_changes_nothing():
    buf = HindsightReplay(20, reward_fn, n_streams=2, seed=0)
    src = Streams([[3], [4]])
    fill(buf, src, 5)
    before = (len(buf), buf.pos, buf.ep_length.copy(), buf.open_length.copy())
    obs, nxt, act, rew, done = src.step()
    with pytest.raises(SpecError):
        buf.add(obs, nxt, act[:1], rew, done)  # one row too few
    with pytest.raises(SpecError):
        buf.add({"observation": obs["observation"]}, nxt, act, rew, done)
    bad = dict(obs, observation=obs["observation"][:, :2])  # wrong shape for the table's spec
    with pytest.raises(ReplayError):
        buf.add(bad, nxt, act, rew, done)
    after = (len(buf), buf.pos, buf.ep_length, buf.open_length)
    assert before[:2] == after[:2]
    np.testing.assert_array_equal(before[2], after[2])
    np.testing.assert_array_equal(before[3], after[3])
    for kw in ({"strategy": "past"}, {"n_sampled_goal": -2}, {"capacity": 0}, {"n_streams": 0}):
        args = {"capacity": 10, "compute_reward": reward_fn, **kw}
        with pytest.raises(HindsightError):
            HindsightReplay(**args)
    with pytest.raises(HindsightError):
        buf.sample(0)
    with pytest.raises(HindsightError):
        buf.end_episodes([5])


def test_pickle_roundtrip_keeps_data_and_bookkeeping():
    buf = HindsightReplay(8, reward_fn, n_streams=2, seed=3)
    fill(buf, Streams([[3, 5], [4]]), 13)  # wrapped
    clone = pickle.loads(pickle.dumps(buf))
    for path in (("obs", "observation"), ("next_obs", "achieved_goal"), ("action",), ("reward",)):
        np.testing.assert_array_equal(buf.field_view(path), clone.field_view(path))
    np.testing.assert_array_equal(buf.ep_length, clone.ep_length)
    a, b = buf.sample(64), clone.sample(64)  # same generator state -> same batch
    np.testing.assert_array_equal(a.obs["desired_goal"], b.obs["desired_goal"])
    np.testing.assert_array_equal(a.reward, b.reward)


def test_info_dicts_reach_compute_reward():
    seen = []

    def fn(a, d, infos):
        seen.append(infos)
        return reward_fn(a, d, infos)

    buf = HindsightReplay(20, fn, n_streams=1, n_sampled_goal=1, copy_info=True, seed=0)
    src = Streams([[3]])
    for i in range(6):
        buf.add(*src.step(), infos=[{"step": i}])
    b = buf.sample(10)
    assert [i["step"] for i in seen[0]] == [i["step"] for i in b.infos[5:]]
    assert all(i["step"] == int(o[2]) + 3 * int(o[1]) for i, o in zip(b.infos, b.obs["observation"]))


# -- SB3 adapter ----------------------------------------------------------------------------------
sb3 = pytest.importorskip("stable_baselines3")


def _bitflip_vec(n_envs, n_bits=4, continuous=False):
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.envs import BitFlippingEnv

    return make_vec_env(lambda: BitFlippingEnv(n_bits=n_bits, continuous=continuous), n_envs)


def test_sb3_adapter_matches_sb3_bookkeeping_and_relabels_correctly():
    from stable_baselines3 import HerReplayBuffer

    from replaystore.integrations.sb3_her import ReplaystoreHerReplayBuffer

    venv = _bitflip_vec(2)
    kw = dict(
        buffer_size=40,
        observation_space=venv.observation_space,
        action_space=venv.action_space,
        env=venv,
        n_envs=2,
        n_sampled_goal=4,
    )
    theirs, ours = HerReplayBuffer(**kw), ReplaystoreHerReplayBuffer(**kw)
    obs = venv.reset()
    rng = np.random.default_rng(0)
    for _ in range(57):  # wraps the 20-step ring
        act = rng.integers(0, 4, 2)
        nxt, r, d, infos = venv.step(act)
        theirs.add(obs, nxt, act, r, d, infos)
        ours.add(obs, nxt, act, r, d, infos)
        obs = nxt
    for name in ("dones", "timeouts", "ep_start", "ep_length", "_current_ep_start", "pos", "full"):
        np.testing.assert_array_equal(getattr(theirs, name), getattr(ours, name), err_msg=name)
    np.testing.assert_array_equal(theirs.rewards, ours.rewards)
    np.testing.assert_array_equal(theirs.actions, ours.actions)
    for k in theirs.observations:
        np.testing.assert_array_equal(theirs.observations[k], ours.observations[k])
        np.testing.assert_array_equal(theirs.next_observations[k], ours.next_observations[k])
    s = ours.sample(512)
    n_virtual = int(0.8 * 512)
    des = s.observations["desired_goal"].numpy()
    ach = s.next_observations["achieved_goal"].numpy()
    np.testing.assert_array_equal(des, s.next_observations["desired_goal"].numpy())
    expect = venv.env_method("compute_reward", ach[-n_virtual:], des[-n_virtual:], None, indices=[0])[0]
    np.testing.assert_array_equal(s.rewards.numpy()[-n_virtual:, 0], expect)


def test_sb3_dqn_runs_with_adapter_and_truncates():
    from stable_baselines3 import DQN

    from replaystore.integrations.sb3_her import ReplaystoreHerReplayBuffer

    venv = _bitflip_vec(2)
    model = DQN(
        "MultiInputPolicy",
        venv,
        replay_buffer_class=ReplaystoreHerReplayBuffer,
        replay_buffer_kwargs=dict(n_sampled_goal=2, goal_selection_strategy="final"),
        learning_starts=20,
        train_freq=4,
        buffer_size=1000,
        policy_kwargs=dict(net_arch=[16]),
        seed=0,
    )
    model.learn(120)
    rb = model.replay_buffer
    assert isinstance(rb, ReplaystoreHerReplayBuffer) and len(rb.hindsight) == 120
    obs = venv.reset()
    nxt, r, _d, infos = venv.step(np.zeros(2, np.int64))
    rb.add(obs, nxt, np.zeros(2, np.int64), r, np.zeros(2, bool), infos)  # an open episode per env
    with pytest.warns(UserWarning, match="truncated"):
        rb.truncate_last_trajectory()
    assert (rb._current_ep_start == rb.pos).all()
    assert (rb.dones[rb.pos - 1] == 1).all() and (rb.timeouts[rb.pos - 1] == 1).all()
    assert (rb.ep_length[rb.pos - 1] > 0).all()
