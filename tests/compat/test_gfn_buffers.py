"""torchgfn's replay-buffer test suite, ported: testing/test_replay_buffer.py and the buffer tests
of test_containers_extended.py, run against replaystore.compat.gfn with three container flavours
(replaystore's TensorContainer, a contract-only container, torchgfn's own containers)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from gfn_conftest import KIT_NAMES, ContractContainer, make_kit, needs_gfn
from hypothesis import given, settings
from hypothesis import strategies as st

from replaystore.compat.gfn import (
    NormBasedDiversePrioritizedReplayBuffer,
    ReplayBuffer,
    ReplayBufferManager,
    TensorContainer,
    TerminatingStateBuffer,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=KIT_NAMES)
def kit(request):
    return make_kit(request.param)


@pytest.fixture
def gkit():
    return make_kit("gfn")


# -- basic buffer behaviour ---------------------------------------------------------------------------
def test_init_rb(kit):
    rb = ReplayBuffer(kit.env)
    assert rb.capacity == 1000 and not rb.prioritized_capacity and not rb.prioritized_sampling
    assert len(rb) == 0
    assert "ReplayBuffer" in repr(rb) and "empty" in repr(rb)
    assert rb.training_container is None


def test_add_main_type(kit):
    rb = ReplayBuffer(kit.env, capacity=10)
    rb.add(kit.make(range(5)))
    assert type(rb.training_container).__name__ == kit.main_type
    assert len(rb) == 5
    assert kit.main_type in repr(rb) and "5" in repr(rb)


@needs_gfn
def test_add_transitions(gkit):
    rb = ReplayBuffer(gkit.env, capacity=100)
    tr = gkit.transitions(range(5))
    rb.add(tr)
    assert type(rb.training_container).__name__ == "Transitions"
    assert len(rb) == len(tr) == 10


@needs_gfn
def test_add_state_pairs(gkit):
    rb = ReplayBuffer(gkit.env, capacity=100)
    rb.add(gkit.make_states(range(10)))
    assert type(rb.training_container).__name__ == "StatesContainer"
    assert len(rb) == 10


@pytest.mark.parametrize("prioritized", [False, True])
def test_capacity_limit(kit, prioritized):
    rb = ReplayBuffer(kit.env, capacity=3, prioritized_capacity=prioritized)
    rb.add(kit.make(range(5)))
    assert len(rb) == 3
    assert kit.rewards(rb.training_container) == [2, 3, 4]


def test_prioritized_capacity_sorted_ascending(kit):
    rb = ReplayBuffer(kit.env, capacity=10, prioritized_capacity=True)
    rb.add(kit.make([3, 0, 4, 1, 2]))
    assert kit.rewards(rb.training_container) == [0, 1, 2, 3, 4]


def test_sample(kit):
    rb = ReplayBuffer(kit.env, capacity=10)
    with pytest.raises(ValueError, match="Buffer is empty"):
        rb.sample(1)
    rb.add(kit.make(range(5)))
    s = rb.sample(3)
    assert len(s) == 3 and type(s).__name__ == kit.main_type
    assert len(set(kit.rewards(s))) == 3  # without replacement
    assert len(rb.sample(50)) == 5  # uniform: at most len(buffer) items, as torchgfn


def test_type_error(kit):
    rb = ReplayBuffer(kit.env)
    with pytest.raises(AssertionError, match="Must be a container type"):
        rb.add("not a container")
    with pytest.raises(TypeError):
        rb.add(42)


# -- diverse buffer -------------------------------------------------------------------------------------
def test_init_ndrb(kit):
    rb = NormBasedDiversePrioritizedReplayBuffer(kit.env, capacity=5, cutoff_distance=0.5, p_norm_distance=2)
    assert rb.prioritized_capacity and not rb.prioritized_sampling
    assert rb.cutoff_distance == 0.5 and rb.p_norm_distance == 2
    assert len(rb) == 0


def test_add_with_diversity(kit):
    rb = NormBasedDiversePrioritizedReplayBuffer(kit.env, capacity=5, cutoff_distance=0.5, p_norm_distance=2)
    rb.add(kit.make(range(5)))
    # similar (identical) high-reward states: rejected as duplicates of each other and of the buffer
    rb.add(kit.make([10, 10, 10], states=[[0, 0], [0, 0], [0, 0]]))
    assert len(rb) == 5
    assert min(kit.rewards(rb.training_container)) >= 0


def test_skip_diversity_check(kit):
    rb = NormBasedDiversePrioritizedReplayBuffer(kit.env, capacity=5, cutoff_distance=-1)
    rb.add(kit.make(range(5)))
    rb.add(kit.make([10, 11], states=[[0, 0], [0, 0]]))  # duplicates allowed with a negative cutoff
    assert len(rb) == 5
    assert min(kit.rewards(rb.training_container)) >= 2
    assert sorted(kit.rewards(rb.training_container))[-2:] == [10, 11]


# -- sampling and eviction ----------------------------------------------------------------------------------
def test_prioritized_sampling(kit):
    torch.manual_seed(0)
    rb = ReplayBuffer(kit.env, capacity=10, prioritized_sampling=True)
    rb.add(kit.make([0.0, 1.0, 2.0, 3.0, 4.0]))
    counts = {r: 0 for r in range(5)}
    for r in kit.rewards(rb.sample(1000)):
        counts[int(r)] += 1
    seq = [counts[r] for r in range(5)]
    assert seq == sorted(seq), seq
    expected = np.exp(np.arange(5)) / np.exp(np.arange(5)).sum() * 1000
    assert abs(seq[4] - expected[4]) < 60


def test_prioritized_capacity_evicts_lowest_rewards(kit):
    rb = ReplayBuffer(kit.env, capacity=3, prioritized_capacity=True)
    rb.add(kit.make([10.0, 20.0, 30.0]))
    rb.add(kit.make([5.0, 25.0]))
    assert kit.rewards(rb.training_container) == [20, 25, 30]


def test_non_prioritized_capacity_keeps_newest(kit):
    rb = ReplayBuffer(kit.env, capacity=3)
    rb.add(kit.make([100.0, 200.0, 300.0]))
    rb.add(kit.make([1.0, 2.0]))
    assert kit.rewards(rb.training_container) == [300, 1, 2]


def test_add_clears_stale_fields(kit):
    rb = ReplayBuffer(kit.env, capacity=10)
    c = kit.make(range(3), log_probs=True)
    assert c.log_probs is not None
    rb.add(c)
    tc = rb.training_container
    assert getattr(tc, "log_probs", None) is None
    assert getattr(tc, "estimator_outputs", None) is None
    assert getattr(rb.sample(2), "log_probs", None) is None
    assert c.log_probs is not None  # the caller's container is not modified


@needs_gfn
def test_add_clears_log_probs_on_transitions(gkit):
    rb = ReplayBuffer(gkit.env, capacity=100)
    rb.add(gkit.transitions(range(3), log_probs=True))
    assert rb.training_container.log_probs is None


def test_type_consistency_rejects_mismatched_containers(kit):
    rb = ReplayBuffer(kit.env, capacity=10)
    rb.add(kit.make(range(3)))
    with pytest.raises(AssertionError):
        rb.add(kit.other())
    assert len(rb) == 3


@pytest.mark.parametrize("prioritized", [False, True])
def test_multiple_add_cycles_maintain_capacity(kit, prioritized):
    rb = ReplayBuffer(kit.env, capacity=7, prioritized_capacity=prioritized)
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        rb.add(kit.make(torch.rand(3, generator=gen).tolist()))
        assert len(rb) <= 7
    assert len(rb) == 7


def test_prioritized_sample_with_replacement(kit):
    rb = ReplayBuffer(kit.env, capacity=10, prioritized_sampling=True)
    rb.add(kit.make([1.0, 2.0, 3.0]))
    s = rb.sample(10)
    assert len(s) == 10
    assert set(kit.rewards(s)) <= {1.0, 2.0, 3.0}


def test_device_property_raises_on_empty_buffer(kit):
    rb = ReplayBuffer(kit.env)
    with pytest.raises(AssertionError):
        _ = rb.device
    rb.add(kit.make([1.0]))
    assert rb.device == torch.device("cpu")


# -- diversity filter -----------------------------------------------------------------------------------
def test_diverse_buffer_rejects_duplicates(kit):
    rb = NormBasedDiversePrioritizedReplayBuffer(kit.env, capacity=10, cutoff_distance=1.0, p_norm_distance=2)
    states = [[i % 4 + 2, i // 4 + 2] for i in range(10)]  # avoids [0, 0] and [1, 1]
    rb.add(kit.make([0.0] * 10, states=states))
    assert len(rb) == 10
    rb.add(kit.make([5.0, 5.0], states=[[1, 1], [1, 1]]))  # a duplicate pair: only one survives
    assert kit.terminal(rb.training_container).count([1, 1]) == 1
    rb.add(kit.make([6.0], states=[[1, 1]]))  # a duplicate of the buffer: rejected
    assert kit.terminal(rb.training_container).count([1, 1]) == 1
    assert 6.0 not in kit.rewards(rb.training_container)
    rb.add(kit.make([6.0], states=[[0, 0]]))  # novel: accepted
    assert [0, 0] in kit.terminal(rb.training_container)
    assert len(rb) == 10


def test_diverse_buffer_conditional_same_state_different_conditions(kit):
    rb = NormBasedDiversePrioritizedReplayBuffer(kit.env, capacity=3, cutoff_distance=0.5, p_norm_distance=2)
    rb.add(kit.make_states([0.0, 0.0, 0.0], states=[[1, 1], [3, 3], [5, 5]], conditions=[[0.0], [0.0], [0.0]]))
    rb.add(kit.make_states([2.0], states=[[1, 1]], conditions=[[1.0]]))  # same state, other condition
    assert 2.0 in kit.rewards(rb.training_container)
    rb.add(kit.make_states([3.0], states=[[1, 1]], conditions=[[1.0]]))  # same state and condition
    assert 3.0 not in kit.rewards(rb.training_container)


def test_diversity_repr_shape(kit):
    rep = NormBasedDiversePrioritizedReplayBuffer._diversity_repr
    assert tuple(rep(kit.make_states([0.0, 1.0], states=[[0, 1], [2, 3]])).shape) == (2, 2)
    assert tuple(rep(kit.make_states([0.0, 1.0], states=[[0, 1], [2, 3]], conditions=[[1.0], [0.0]])).shape) == (2, 3)


def test_diverse_within_batch_filter_is_greedy(kit):
    """A, B, C by decreasing reward with d(A,B) = d(B,C) = 1 <= cutoff < d(A,C) = 2: keep A and C.

    torchgfn compares C with B although B was dropped, and loses C."""
    rb = NormBasedDiversePrioritizedReplayBuffer(kit.env, capacity=4, cutoff_distance=1.0, p_norm_distance=1)
    rb.add(kit.make([0.0] * 4, states=[[7, 7], [7, 6], [6, 7], [6, 6]]))
    rb.add(kit.make([3.0, 2.0, 1.0], states=[[0, 0], [1, 0], [2, 0]]))
    kept = kit.rewards(rb.training_container)
    assert 3.0 in kept and 1.0 in kept and 2.0 not in kept


def test_diverse_not_full_adds_whole_batch(kit):
    rb = NormBasedDiversePrioritizedReplayBuffer(kit.env, capacity=10, cutoff_distance=5.0)
    rb.add(kit.make([1.0, 1.0], states=[[0, 0], [0, 0]]))
    assert len(rb) == 2  # no filter until full, as in torchgfn


def test_diverse_rejects_below_buffer_minimum(kit):
    rb = NormBasedDiversePrioritizedReplayBuffer(kit.env, capacity=2, cutoff_distance=0.0)
    rb.add(kit.make([5.0, 6.0], states=[[0, 0], [1, 1]]))
    rb.add(kit.make([4.0], states=[[5, 5]]))
    assert kit.rewards(rb.training_container) == [5, 6]


# -- baseline filtering ---------------------------------------------------------------------------------
def _remote_rb(kit, **kw):
    # a manager name that is never contacted: these tests call the private filters directly
    return ReplayBuffer(kit.env, capacity=10, remote_manager="unused", baseline_filtering=True, **kw)


def test_baseline_filtering_requires_remote_rank(kit):
    with pytest.raises(ValueError):
        ReplayBuffer(kit.env, baseline_filtering=True)


def test_filter_by_baseline_no_baseline_yet(kit):
    rb = _remote_rb(kit)
    c = kit.make(range(5))
    assert rb._filter_by_baseline(c) is c


def test_filter_by_baseline_all_above(kit):
    rb = _remote_rb(kit)
    rb._baseline_log_reward = -1.0
    c = kit.make(range(5))
    assert rb._filter_by_baseline(c) is c


def test_filter_by_baseline_all_below(kit):
    rb = _remote_rb(kit)
    rb._baseline_log_reward = 10.0
    assert rb._filter_by_baseline(kit.make(range(5))) is None
    assert rb._baseline_skipped_sends == 1


def test_filter_by_baseline_partial(kit):
    rb = _remote_rb(kit)
    rb._baseline_log_reward = 2.0
    out = rb._filter_by_baseline(kit.make(range(5)))
    assert kit.rewards(out) == [2, 3, 4]


def test_filter_by_baseline_force_refresh(kit):
    rb = _remote_rb(kit, baseline_refresh_after=2)
    rb._baseline_log_reward = 10.0
    c = kit.make(range(5))
    assert rb._filter_by_baseline(c) is None
    assert rb._filter_by_baseline(c) is c  # second fully filtered batch: sent whole
    assert rb._filter_by_baseline(c) is None
    assert "filtered" in rb.timing_log()


@needs_gfn
def test_filter_by_baseline_rejects_transitions(gkit):
    rb = _remote_rb(gkit)
    with pytest.raises(AssertionError, match="Trajectories or StatesContainer only"):
        rb._filter_by_baseline(gkit.transitions(range(3)))


@needs_gfn
def test_prepare_for_remote_trajectories(gkit):
    rb = ReplayBuffer(gkit.env, remote_manager="unused", scoring_only=True)
    tr = gkit.make([1.0, 2.0], states=[[1, 2], [3, 4]])
    out = rb._prepare_for_remote(tr)
    assert type(out).__name__ == "StatesContainer"
    assert out.terminating_states.tensor.tolist() == [[1, 2], [3, 4]]
    assert out.log_rewards.tolist() == [1.0, 2.0]
    assert bool(out.is_terminating.all())
    assert ReplayBuffer(gkit.env, remote_manager="unused")._prepare_for_remote(tr) is tr


@needs_gfn
def test_prepare_for_remote_states_container_noop(gkit):
    rb = ReplayBuffer(gkit.env, remote_manager="unused", scoring_only=True)
    sc = gkit.make_states([1.0])
    assert rb._prepare_for_remote(sc) is sc


@needs_gfn
def test_prepare_for_remote_rejects_transitions(gkit):
    rb = ReplayBuffer(gkit.env, remote_manager="unused", scoring_only=True)
    with pytest.raises(AssertionError):
        rb._prepare_for_remote(gkit.transitions([1.0]))


# -- manager baseline (no communication) -------------------------------------------------------------------
def test_manager_baseline_strategy_validation(kit):
    with pytest.raises(ValueError):
        ReplayBufferManager(kit.env, rank=0, num_training_ranks=1, baseline_strategy="max")


def test_manager_baseline_min_when_buffer_full(kit):
    m = ReplayBufferManager(kit.env, rank=0, num_training_ranks=1, capacity=5)
    score = m.handle_data(kit.make(range(5)), sender=0)
    assert score["score"] == math.inf
    assert score["baseline_log_reward"] == 0.0


def test_manager_baseline_percentile(kit):
    m = ReplayBufferManager(
        kit.env, rank=0, num_training_ranks=1, capacity=5, baseline_strategy="percentile", baseline_percentile=0.5
    )
    assert m.handle_data(kit.make(range(5)), sender=0)["baseline_log_reward"] == 2.0


def test_manager_baseline_ema_fallback_when_not_storing(kit):
    m = ReplayBufferManager(kit.env, rank=0, num_training_ranks=1, capacity=5, store_locally=False)
    assert m.handle_data(kit.make(range(5)), sender=0)["baseline_log_reward"] == 0.0
    assert len(m.replay_buffer) == 0
    # EMA of batch minima: 0.1 * 10 + 0.9 * 0
    assert m.handle_data(kit.make([10.0, 11.0]), sender=0)["baseline_log_reward"] == pytest.approx(1.0)


def test_manager_baseline_sync_overrides_local(kit):
    m = ReplayBufferManager(kit.env, rank=0, num_training_ranks=1, capacity=5)
    assert m._handle_baseline_sync({"global_baseline_log_reward": -7.5})
    assert m.handle_data(kit.make(range(5)), sender=0)["baseline_log_reward"] == -7.5


def test_manager_baseline_sync_ignores_missing_payload(kit):
    m = ReplayBufferManager(kit.env, rank=0, num_training_ranks=1, capacity=5)
    assert not m._handle_baseline_sync({})
    assert not m._handle_baseline_sync(None)
    assert not m._handle_baseline_sync({"global_baseline_log_reward": float("nan")})
    assert m.handle_data(kit.make(range(5)), sender=0)["baseline_log_reward"] == 0.0


def test_manager_multi_manager_baseline_warning(kit):
    with pytest.warns(UserWarning, match="diverge"):
        ReplayBufferManager(kit.env, rank=0, num_training_ranks=1, num_buffer_managers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ReplayBufferManager(kit.env, rank=0, num_training_ranks=1, num_buffer_managers=2, baseline_strategy="ema")


def test_manager_baseline_ema_skips_non_finite(kit):
    m = ReplayBufferManager(kit.env, rank=0, num_training_ranks=1, capacity=50)
    s = m.handle_data(kit.make([float("-inf"), 1.0, 2.0]), sender=0)
    assert s["baseline_log_reward"] == 1.0


def test_manager_scoring_function_gets_sender(kit):
    seen = []

    def score(container, sender_rank=None):
        seen.append((len(container), sender_rank))
        return {"score": float(len(container))}

    m = ReplayBufferManager(kit.env, rank=0, num_training_ranks=1, scoring_function=score)
    assert m.handle_data(kit.make(range(4)), sender=3)["score"] == 4.0
    assert seen == [(4, 3)]


# -- test_containers_extended.py: the buffer tests -----------------------------------------------------------
def test_replay_buffer_initialize(kit):
    rb = ReplayBuffer(kit.env, capacity=5)
    empty = rb.initialize(kit.make([1.0]))
    assert len(empty) == 0 and type(empty).__name__ == kit.main_type


def test_replay_buffer_add_and_sample(kit):
    rb = ReplayBuffer(kit.env, capacity=20, prioritized_capacity=True, prioritized_sampling=True)
    for i in range(4):
        rb.add(kit.make([float(i)] * 3))
    assert len(rb) == 12
    s = rb.sample(5)
    assert len(s) == 5 and type(s).__name__ == kit.main_type


@pytest.mark.parametrize("prioritized", [False, True])
def test_replay_buffer_save_load(kit, tmp_path, prioritized):
    if kit.name == "generic":
        pytest.skip("a contract-only container has no tensor layout to save")
    rb = ReplayBuffer(kit.env, capacity=10, prioritized_capacity=prioritized)
    rb.add(kit.make([3.0, 1.0, 2.0]))
    rb.add(kit.make([5.0, 4.0]))
    path = tmp_path / "rb.pt"
    rb.save(path)
    raw = torch.load(path, weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in raw.values())
    fresh = ReplayBuffer(kit.env, capacity=10, prioritized_capacity=prioritized)
    fresh.load(path)  # a fresh instance: torchgfn silently loads nothing here
    assert len(fresh) == 5
    assert kit.rewards(fresh.training_container) == kit.rewards(rb.training_container)
    assert kit.terminal(fresh.training_container) == kit.terminal(rb.training_container)
    small = ReplayBuffer(kit.env, capacity=2, prioritized_capacity=True)
    small.load(path)
    assert kit.rewards(small.training_container) == [4, 5]


def test_save_on_empty_buffer_writes_nothing(kit, tmp_path):
    ReplayBuffer(kit.env).save(tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()


def test_terminating_state_buffer_init_and_add(kit):
    tsb = TerminatingStateBuffer(kit.env, capacity=4)
    assert tsb.training_container is not None and len(tsb.training_container) == 0
    tsb.add(kit.make([1.0, 2.0, 3.0], states=[[1, 1], [2, 2], [3, 3]]))
    assert len(tsb) == 3
    tc = tsb.training_container
    assert kit.terminal(tc) == [[1, 1], [2, 2], [3, 3]]
    assert kit.rewards(tc) == [1, 2, 3]
    tsb.add(kit.make([4.0, 5.0]))
    assert len(tsb) == 4
    assert len(tsb.sample(2)) == 2


@needs_gfn
def test_terminating_state_buffer_types(gkit, tmp_path):
    tsb = TerminatingStateBuffer(gkit.env, capacity=100)
    tsb.add(gkit.sampled(8))
    tsb.add(gkit.make_states([1.0, 2.0]))
    assert type(tsb.training_container).__name__ == "StatesContainer"
    assert len(tsb) == 10
    path = tmp_path / "tsb.pt"
    tsb.save(path)
    fresh = TerminatingStateBuffer(gkit.env, capacity=100)
    fresh.load(path)
    assert len(fresh) == 10


# -- test_samplers_and_containers.py::test_replay_buffer -------------------------------------------------------
@needs_gfn
@pytest.mark.parametrize("env_name", ["HyperGrid", "DiscreteEBM", "BitSequence"])
@pytest.mark.parametrize("objects", ["trajectories", "transitions"])
def test_replay_buffer_real_envs(env_name, objects):
    import gfn.gym as gym
    from gfn.estimators import DiscretePolicyEstimator
    from gfn.preprocessors import IdentityPreprocessor
    from gfn.samplers import Sampler
    from gfn.utils.modules import DiscreteUniform

    if env_name == "HyperGrid":
        env = gym.HyperGrid(ndim=2, height=4, validate_modes=False)
    elif env_name == "DiscreteEBM":
        env = gym.DiscreteEBM(ndim=4)
    else:
        env = gym.BitSequence(word_size=2, seq_size=8, n_modes=2, temperature=1.0)
    pre = IdentityPreprocessor(output_dim=env.state_shape[-1])
    pf = DiscretePolicyEstimator(DiscreteUniform(env.n_actions), env.n_actions, preprocessor=pre)
    sampler = Sampler(pf)
    torch.manual_seed(0)
    rb = ReplayBuffer(env, capacity=10)
    for _ in range(4):
        tr = sampler.sample_trajectories(env, n=5)
        rb.add(tr if objects == "trajectories" else tr.to_transitions())
    s = rb.sample(5)
    assert len(s) == 5 and len(rb) == 10


# -- beyond the original suite -----------------------------------------------------------------------------
@needs_gfn
def test_matches_torchgfn_on_sampled_trajectories(gkit):
    """Same adds, same contents (order and tensors) as torchgfn's own ReplayBuffer."""
    import gfn.containers as gc

    batches = [gkit.sampled(16, seed=s) for s in range(8)]
    for prio in (False, True):
        mine = ReplayBuffer(gkit.env, capacity=40, prioritized_capacity=prio)
        ref = gc.ReplayBuffer(gkit.env, capacity=40, prioritized_capacity=prio)
        for b in batches:
            mine.add(b)
            ref.add(b)
        a, r = mine.training_container, ref.training_container
        assert torch.equal(a.log_rewards, r.log_rewards)
        if not prio:  # with ties, torchgfn's argsort order is unspecified
            assert torch.equal(a.states.tensor, r.states.tensor)
            assert torch.equal(a.actions.tensor, r.actions.tensor)
            assert torch.equal(a.terminating_idx, r.terminating_idx)


@needs_gfn
def test_file_interoperates_with_torchgfn(gkit, tmp_path):
    import gfn.containers as gc

    mine = ReplayBuffer(gkit.env, capacity=30)
    mine.add(gkit.sampled(20))
    mine.save(tmp_path / "mine.pt")
    assert len(gc.Trajectories.load(gkit.env, str(tmp_path / "mine.pt"))) == 20
    ref = gc.ReplayBuffer(gkit.env, capacity=30)
    ref.add(gkit.sampled(12, seed=3))
    ref.save(str(tmp_path / "ref.pt"))
    fresh = ReplayBuffer(gkit.env, capacity=30)
    fresh.load(tmp_path / "ref.pt")
    assert len(fresh) == 12 and type(fresh.training_container).__name__ == "Trajectories"


def test_lazy_sort_commits_at_twice_capacity_and_on_read(kit):
    rb = ReplayBuffer(kit.env, capacity=4, prioritized_capacity=True, lazy_sort=True)
    rb.add(kit.make([1.0, 2.0, 3.0]))
    rb.add(kit.make([0.0, 9.0]))
    assert len(rb) == 5  # pending batches count, as in torchgfn
    assert len(rb._table) == 0
    rb.add(kit.make([7.0, 8.0, 6.0]))  # 8 >= 2 * capacity: commit
    assert len(rb) == 4
    assert kit.rewards(rb.training_container) == [6, 7, 8, 9]
    rb.add(kit.make([10.0]))
    assert len(rb) == 5
    assert len(rb.sample(2)) == 2  # a read commits (torchgfn would sample the committed part only)
    assert kit.rewards(rb.training_container) == [7, 8, 9, 10]


def test_timing(kit):
    rb = ReplayBuffer(kit.env, capacity=4, prioritized_capacity=True, timing=True)
    rb.add(kit.make([1.0, 2.0]))
    assert "local_add/extend" in rb.timing_data and "local_add/sort" in rb.timing_data
    assert "local_add/extend" in rb.timing_log()


def test_prioritized_capacity_with_minus_inf_rows(kit):
    rb = ReplayBuffer(kit.env, capacity=3, prioritized_capacity=True)
    rb.add(kit.make([float("-inf"), 1.0, float("-inf"), 2.0]))
    assert kit.rewards(rb.training_container) == [float("-inf"), 1.0, 2.0]
    with pytest.raises(ValueError, match="NaN"):
        rb.add(kit.make([float("nan")]))
    assert len(rb) == 3


def test_prioritized_requires_log_rewards():
    rb = ReplayBuffer(None, capacity=3, prioritized_capacity=True)
    with pytest.raises(ValueError, match="log_rewards must be defined"):
        rb.add(TensorContainer(torch.zeros(2, 2)))
    rb = ReplayBuffer(None, capacity=3, prioritized_sampling=True)
    rb.add(ContractContainer(torch.zeros(2, 2), None))
    with pytest.raises(ValueError, match="prioritized sampling"):
        rb.sample(1)


def test_store_grows_with_longer_trajectories():
    pytest.importorskip("gfn")
    kit = make_kit("gfn")
    short = kit.make([1.0, 2.0])
    long = kit.sampled(8, seed=5)
    rb = ReplayBuffer(kit.env, capacity=20)
    rb.add(short)
    rb.add(long)
    tc = rb.training_container
    assert tc.states.tensor.shape[0] == long.states.tensor.shape[0]
    assert torch.equal(tc[torch.arange(2, 10)].states.tensor, long.states.tensor)
    assert torch.equal(tc[torch.arange(2)].states.tensor, short.states.tensor)


# -- the top-k bookkeeping against a model -----------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 8),
    batches=st.lists(st.lists(st.integers(-3, 3), min_size=0, max_size=10), min_size=1, max_size=8),
)
def test_prioritized_capacity_matches_a_stable_sort_model(capacity, batches):
    """Contents = the top `capacity` of everything added; among equal rewards the newest win."""
    rb = ReplayBuffer(None, capacity=capacity, prioritized_capacity=True)
    model: list[tuple[float, int]] = []  # (reward, arrival)
    arrival = 0
    for b in batches:
        ids = list(range(arrival, arrival + len(b)))
        arrival += len(b)
        if b:
            rb.add(TensorContainer(torch.tensor(ids)[:, None], torch.tensor(b, dtype=torch.float32)))
        model = sorted(model + list(zip(map(float, b), ids)))[-capacity:]
        got = rb.training_container
        got_pairs = (
            [] if got is None or len(got) == 0 else list(zip(got.log_rewards.tolist(), got.states[:, 0].tolist()))
        )
        assert got_pairs == model


@pytest.mark.parametrize("diverse", [False, True])
def test_full_buffer_add_touches_only_the_batch(diverse):
    """B items into a full buffer of N: at most B heap victims looked at, B rows written."""
    n, b = 2000, 16
    cls = NormBasedDiversePrioritizedReplayBuffer if diverse else ReplayBuffer
    kw = {"cutoff_distance": -1.0} if diverse else {"prioritized_capacity": True}
    rb = cls(None, capacity=n, **kw)
    rb.add(TensorContainer(torch.arange(n)[:, None], torch.rand(n)))
    asked, written = [], []
    victims, write = rb._table.remover.victims, rb._store.write
    rb._table.remover.victims = lambda k: (asked.append(k), victims(k))[1]
    rb._store.write = lambda slots, fields: (written.append(len(slots)), write(slots, fields))[1]
    for _ in range(5):
        rb.add(TensorContainer(torch.arange(b)[:, None], torch.rand(b) + 0.5))
    assert len(rb) == n
    assert asked and max(asked) <= b and written and max(written) <= b


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 4)), min_size=1, max_size=8),
        min_size=1,
        max_size=6,
    )
)
def test_diverse_exact_duplicate_path_matches_the_distance_path(batches):
    """cutoff 0 uses a hash of the stored vectors; a tiny positive cutoff computes distances: same result."""
    exact = NormBasedDiversePrioritizedReplayBuffer(None, capacity=5, cutoff_distance=0.0)
    dist = NormBasedDiversePrioritizedReplayBuffer(None, capacity=5, cutoff_distance=1e-9)
    assert exact._exact and not dist._exact
    for b in batches:
        c = TensorContainer(torch.tensor([[x, y] for x, y, _ in b]), torch.tensor([float(r) for *_, r in b]))
        exact.add(c)
        dist.add(c)
        a, d = exact.training_container, dist.training_container
        assert a.states.tolist() == d.states.tolist() and a.log_rewards.tolist() == d.log_rewards.tolist()
