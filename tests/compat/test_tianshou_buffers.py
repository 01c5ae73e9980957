"""replaystore.compat.tianshou against Tianshou 2.0.1's own buffers as the model.

Skipped where Tianshou is not installed (it lives in its own environment: see
docs/compat/tianshou.md). Tianshou's own ``test_buffer.py`` runs through tests/test_tianshou_suite.py.
"""

import pickle

import numpy as np
import pytest

ts = pytest.importorskip("tianshou.data")
torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tianshou.algorithm.algorithm_base import Algorithm  # noqa: E402
from tianshou.data import Batch  # noqa: E402

import replaystore.compat.tianshou as rs  # noqa: E402
from replaystore.compat.tianshou.position_tree import PositionSampler  # noqa: E402
from replaystore.errors import InvalidPriority  # noqa: E402


def rows(n, t, done):
    return Batch(
        obs=np.full((n, 3), t, dtype=np.float32) + np.arange(n)[:, None],
        act=np.arange(n) + t,
        rew=np.arange(n, dtype=np.float64) + 0.5 * t,
        terminated=np.asarray(done, dtype=bool),
        truncated=np.zeros(n, bool),
        obs_next=np.full((n, 3), t + 1, dtype=np.float32),
        info=Batch(env_id=np.arange(n)),
    )


def assert_same_state(ours, theirs):
    assert len(ours) == len(theirs)
    np.testing.assert_array_equal(ours._lengths, theirs._lengths)
    np.testing.assert_array_equal(ours.last_index, theirs.last_index)
    for k in ("obs", "act", "rew", "terminated", "truncated", "done", "obs_next"):
        np.testing.assert_array_equal(getattr(ours, k), getattr(theirs, k))
    idx = np.arange(ours.maxsize)
    np.testing.assert_array_equal(ours.prev(idx), theirs.prev(idx))
    np.testing.assert_array_equal(ours.next(idx), theirs.next(idx))
    np.testing.assert_array_equal(ours.unfinished_index(), theirs.unfinished_index())
    np.testing.assert_array_equal(np.sort(ours.sample_indices(0)), np.sort(theirs.sample_indices(0)))
    for a, b in zip(ours.buffers, theirs.buffers):
        assert (a._insertion_idx, len(a), a._ep_len, a._ep_start_idx) == (
            b._insertion_idx,
            len(b),
            b._ep_len,
            b._ep_start_idx,
        )
    # the Table holds exactly the positions Tianshou can sample
    live = np.sort(ours.table.sample(1).data["pos"]) if len(ours) else None
    assert live is None or live[0] in set(theirs.sample_indices(0).tolist())
    assert len(ours.table) == len(theirs)


adds = st.lists(
    st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True), st.integers(0, 2**4 - 1)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=25, deadline=None)
@given(adds, st.sampled_from([4, 8, 13]))
def test_vector_buffer_matches_tianshou(steps, total):
    ours, theirs = rs.VectorReplayBuffer(total, 4), ts.VectorReplayBuffer(total, 4)
    for t, (ids, bits) in enumerate(steps):
        done = [(bits >> j) & 1 for j in range(len(ids))]
        a = ours.add(rows(len(ids), t, done), buffer_ids=ids)
        b = theirs.add(rows(len(ids), t, done), buffer_ids=ids)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert_same_state(ours, theirs)
    idx = np.arange(total)
    for stack in (1, 3):
        np.testing.assert_array_equal(ours.get(idx, "obs", stack_num=stack), theirs.get(idx, "obs", stack_num=stack))
    got, want = ours[idx], theirs[idx]
    for k in ("obs", "act", "rew", "done", "obs_next"):
        np.testing.assert_array_equal(got[k], want[k])
    np.testing.assert_array_equal(got.info.env_id, want.info.env_id)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=30), st.integers(1, 4), st.booleans())
def test_single_buffer_matches_tianshou(dones, stack_num, ignore_obs_next):
    kw = {"stack_num": stack_num, "ignore_obs_next": ignore_obs_next}
    ours, theirs = rs.ReplayBuffer(7, **kw), ts.ReplayBuffer(7, **kw)
    for t, d in enumerate(dones):
        one = Batch(obs=np.full(2, t), act=t, rew=float(t), terminated=d, truncated=False, obs_next=np.full(2, t + 1))
        a, b = ours.add(one), theirs.add(Batch(one))
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    idx = np.arange(len(theirs))
    np.testing.assert_array_equal(ours.prev(idx), theirs.prev(idx))
    np.testing.assert_array_equal(ours.next(idx), theirs.next(idx))
    got, want = ours[idx], theirs[idx]
    np.testing.assert_array_equal(got.obs, want.obs)
    np.testing.assert_array_equal(got.obs_next, want.obs_next)
    assert len(ours.table) == len(theirs)


def test_uniform_sampling_is_uniform_over_live_transitions():
    buf = rs.VectorReplayBuffer(40, 4)  # 4 x 10
    for t in range(6):  # sub-buffers hold 6 each: 24 live positions out of 40
        buf.add(rows(4, t, [0, 0, 0, t == 5]))
    live = set(buf.sample_indices(0).tolist())
    counts = np.bincount(buf.sample_indices(24_000), minlength=40)
    assert set(np.flatnonzero(counts).tolist()) == live
    # each live position: Binomial(24000, 1/24), mean 1000, sd ~31; 6 sd
    assert np.abs(counts[sorted(live)] - 1000).max() < 190


def test_prioritized_weights_and_frequencies_match_tianshou():
    ours = rs.PrioritizedVectorReplayBuffer(12, 3, alpha=0.5, beta=0.4)
    theirs = ts.PrioritizedReplayBuffer(12, alpha=0.5, beta=0.4)
    for t in range(4):
        ours.add(rows(3, t, [0, 0, 0]))
        for j in range(3):
            theirs.add(Batch({k: v[j] for k, v in rows(3, t, [0, 0, 0]).items() if k != "info"}))
    pos = np.arange(12)
    prio = np.linspace(0.5, 6.0, 12)
    ours.update_weight(pos, -prio)
    theirs.update_weight(pos, -prio)
    np.testing.assert_allclose(ours.weight[pos], theirs.weight[pos])
    np.testing.assert_allclose(ours.get_weight(pos), theirs.get_weight(pos))
    np.testing.assert_allclose(ours[pos].weight, theirs[pos].weight)
    counts = np.bincount(ours.sample_indices(60_000), minlength=12)
    p = (prio + np.finfo(np.float32).eps) ** 0.5
    expected = 60_000 * p / p.sum()
    sd = np.sqrt(expected * (1 - p / p.sum()))
    assert np.all(np.abs(counts - expected) < 6 * sd)
    # new transitions get the largest priority so far
    ours.add(rows(3, 9, [0, 0, 0]))
    np.testing.assert_allclose(ours.weight[ours.last_index], (6.0 + np.finfo(np.float32).eps) ** 0.5)


def test_nstep_return_through_tianshou_algorithm_is_identical():
    ours, theirs = rs.VectorReplayBuffer(30, 3), ts.VectorReplayBuffer(30, 3)
    rng = np.random.default_rng(0)
    for t in range(25):
        done = rng.random(3) < 0.2
        ours.add(rows(3, t, done))
        theirs.add(rows(3, t, done))
    idx = np.arange(30)

    def target_q(buffer, indices):
        return torch.as_tensor(buffer.obs_next[indices][:, :1] * 0.1)

    a = Algorithm.compute_nstep_return(ours[idx], ours, idx, target_q, gamma=0.9, n_step=3)
    b = Algorithm.compute_nstep_return(theirs[idx], theirs, idx, target_q, gamma=0.9, n_step=3)
    torch.testing.assert_close(a.returns, b.returns)


def test_pickle_and_hdf5_round_trip(tmp_path):
    buf = rs.PrioritizedVectorReplayBuffer(20, 4, alpha=0.6, beta=0.4)
    for t in range(8):
        buf.add(rows(4, t, [t % 3 == 2] * 4))
    buf.update_weight(np.arange(8), np.arange(1.0, 9.0))
    path = tmp_path / "buf.hdf5"
    buf.save_hdf5(str(path))
    for other in (pickle.loads(pickle.dumps(buf)), rs.PrioritizedVectorReplayBuffer.load_hdf5(str(path))):
        assert len(other) == len(buf) == len(other.table)
        np.testing.assert_allclose(other.weight[np.arange(20)], buf.weight[np.arange(20)])
        np.testing.assert_array_equal(other.next(np.arange(20)), buf.next(np.arange(20)))
        other.add(rows(4, 9, [0] * 4))  # the counters still work: the next add goes where it would have
        buf2 = pickle.loads(pickle.dumps(buf))
        buf2.add(rows(4, 9, [0] * 4))
        np.testing.assert_array_equal(other.last_index, buf2.last_index)


def test_bad_input_raises_and_leaves_the_buffer_unchanged():
    buf = rs.VectorReplayBuffer(8, 2)
    buf.add(rows(2, 0, [0, 0]))
    before = (buf._lengths.copy(), buf.last_index.copy(), buf._rs_ins.copy(), len(buf.table))
    with pytest.raises(AssertionError):  # Tianshou's contract: a missing required key
        buf.add(Batch(obs=np.zeros((2, 3)), act=np.zeros(2), terminated=np.zeros(2, bool), truncated=np.zeros(2, bool)))
    after = (buf._lengths, buf.last_index, buf._rs_ins, len(buf.table))
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="empty"):
        rs.VectorReplayBuffer(8, 2).sample_indices(3)
    with pytest.raises(ValueError, match="buffer_num"):
        rs.VectorReplayBuffer(8, 0)


def test_a_collector_and_dqn_update_run_on_our_buffer():
    gym = pytest.importorskip("gymnasium")
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, CollectStats
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import Net
    from tianshou.utils.torch_utils import policy_within_training_step

    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)])
    env = gym.make("CartPole-v1")
    policy = DiscreteQLearningPolicy(
        model=Net(state_shape=(4,), action_shape=2, hidden_sizes=[16]), action_space=env.action_space, eps_training=0.5
    )
    algo = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), n_step_return_horizon=3, target_update_freq=0)
    buf = rs.PrioritizedVectorReplayBuffer(300, 3, alpha=0.6, beta=0.4)
    collector = Collector[CollectStats](algo, envs, buf, exploration_noise=True)
    collector.reset()
    stats = collector.collect(n_step=150)
    assert stats.n_collected_steps == 150 and len(buf) == 150 == len(buf.table)
    before = buf.weight[np.arange(300)].copy()
    with policy_within_training_step(policy):
        algo.update(buffer=buf, sample_size=32)  # n-step targets, weighted loss, update_weight
    assert not np.allclose(before, buf.weight[np.arange(300)])


ops = st.lists(
    st.tuples(
        st.sampled_from(["write", "set", "rebuild", "sample"]),
        st.lists(st.integers(0, 11), min_size=1, max_size=8),
        st.lists(st.floats(0.0, 5.0), min_size=8, max_size=8),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=40, deadline=None)
@given(ops, st.sampled_from([0.5, 1.0]))
def test_position_sampler_matches_a_plain_model(steps, alpha):
    ps, model = PositionSampler(12, alpha=alpha, seed=0), {}  # model: live position -> priority
    for op, pos, prio in steps:
        p = np.array(prio[: len(pos)])
        if op == "write":  # distinct positions per write, as an add
            pos, first = np.unique(pos, return_index=True)
            ps.written(pos.astype(np.int64), p[first])
            model.update(zip(pos.tolist(), p[first].tolist()))
        elif op == "set":  # repeats and positions not live: the last write to a live one wins
            ps.set_priorities(np.array(pos, dtype=np.int64), p)
            model.update({k: v for k, v in zip(pos, p.tolist()) if k in model})
        elif op == "rebuild":
            live = np.unique(pos)
            ps.rebuild(live, np.full(len(live), 2.0))
            model = dict.fromkeys(live.tolist(), 2.0)
        elif model:
            drawn = set(ps.sample(50).tolist())
            positive = {k for k, v in model.items() if v > 0}
            assert drawn <= (positive or set(model))  # all zero: uniform over the live ones
    assert len(ps) == len(model)
    want = np.array([model.get(i, 0.0) ** alpha if i in model else 0.0 for i in range(12)])
    np.testing.assert_allclose(ps.leaves(np.arange(12)), want, rtol=1e-12)
    np.testing.assert_allclose(ps.total_mass(), want.sum(), rtol=1e-9)
    assert len(ps.table) == len(model)  # the inspection Table holds the live positions


def test_a_nan_weight_is_refused_and_changes_nothing():
    buf = rs.PrioritizedVectorReplayBuffer(12, 3, alpha=0.6, beta=0.4)
    for t in range(3):
        buf.add(rows(3, t, [0, 0, 0]))
    live = buf.sample_indices(0)
    buf.update_weight(live, np.linspace(1, 2, len(live)))
    before = (buf.weight[np.arange(12)].copy(), buf._max_prio, buf._min_prio, buf.get_weight(live))
    with pytest.raises(InvalidPriority):
        buf.update_weight(live[:2], np.array([3.0, np.nan]))
    with pytest.raises(InvalidPriority):
        buf.weight[live[2:3]] = np.inf
    after = (buf.weight[np.arange(12)], buf._max_prio, buf._min_prio, buf.get_weight(live))
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)


def test_unnormalised_weights_match_tianshou():
    ours = rs.PrioritizedReplayBuffer(8, alpha=0.7, beta=0.5, weight_norm=False)
    theirs = ts.PrioritizedReplayBuffer(8, alpha=0.7, beta=0.5, weight_norm=False)
    for t in range(6):
        one = Batch(obs=np.full(2, t), act=t, rew=float(t), terminated=False, truncated=False, obs_next=np.full(2, t))
        ours.add(one)
        theirs.add(Batch(one))
    idx = np.arange(6)
    for b in (ours, theirs):
        b.update_weight(idx, np.linspace(0.2, 3.0, 6))
    np.testing.assert_allclose(ours[idx].weight, theirs[idx].weight, rtol=1e-12)
    np.testing.assert_allclose(ours[np.array([4, 1, 4])].weight, theirs[np.array([4, 1, 4])].weight, rtol=1e-12)
