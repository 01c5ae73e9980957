"""replaystore's TorchRL components (replaystore.integrations.torchrl) against TorchRL 0.14.1 itself."""

import os

import numpy as np
import pytest

os.environ.setdefault("RL_WARNINGS", "0")
torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyMemmapStorage,
    LazyTensorStorage,
    TensorDictReplayBuffer,
    find_start_stop_traj,  # noqa: E402
)
from torchrl.data import ReplayBuffer as RLReplayBuffer  # noqa: E402
from torchrl.data.replay_buffers.samplers import SliceSampler as RLSliceSampler  # noqa: E402

from replaystore.errors import InvalidArgument  # noqa: E402
from replaystore.integrations.torchrl import LazyTensorStorage as RSLazyTensorStorage  # noqa: E402
from replaystore.integrations.torchrl import (  # noqa: E402
    MinTree,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    SliceSampler,
    SumTree,
    TensorDictPrioritizedReplayBuffer,
)

# -- trees against a plain model ----------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    size=st.integers(1, 70),
    ops=st.lists(
        st.tuples(st.lists(st.integers(0, 69), min_size=1, max_size=8), st.floats(0.0, 50.0)),
        min_size=1,
        max_size=12,
    ),
    masses=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6),
)
def test_trees_match_a_plain_array(size, ops, masses):
    s, m = SumTree(size, torch.float64), MinTree(size, torch.float64)
    model = np.zeros(s.capacity)
    for idx, value in ops:
        idx = np.asarray([i % s.capacity for i in idx])
        vals = value + np.arange(len(idx))
        s[idx] = vals
        m[idx] = vals
        for i, v in zip(idx, vals):  # sequential writes: the last one wins, as TorchRL's C++ loop
            model[i] = v
    assert np.allclose(s[np.arange(s.capacity)], model)
    hi = int(np.flatnonzero(model).max()) + 1 if model.any() else 0
    assert s.query(0, s.capacity) == pytest.approx(model.sum())
    assert s.query(1, max(hi, 1)) == pytest.approx(model[1 : max(hi, 1)].sum())
    written = np.zeros(s.capacity, bool)
    for idx, _ in ops:
        written[[i % s.capacity for i in idx]] = True
    assert m.query(0, s.capacity) == pytest.approx(model[written].min())
    total = model.sum()
    if total > 0:
        found = s.scan_lower_bound(np.asarray(masses) * total * 0.999999)
        cum = np.cumsum(model)
        for mass, leaf in zip(np.asarray(masses) * total * 0.999999, found):
            assert model[leaf] > 0  # never a zero leaf
            assert cum[leaf] >= mass - 1e-9 and (leaf == 0 or cum[leaf - 1] <= mass + 1e-9)
    assert s.scan_lower_bound(total + 1.0) == s.size


def test_tree_reads_keep_the_index_kind_and_dtype():
    t = SumTree(8)  # float32 reads, as TorchRL's Fp32 tree
    t[torch.tensor([1, 2])] = torch.tensor([0.5, 2.0])
    out = t[torch.tensor([[1], [2]])]
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (2, 1)
    assert isinstance(t[np.array([1])], np.ndarray) and t[2] == 2.0
    with pytest.raises(IndexError):
        t[8] = 1.0
    with pytest.raises(InvalidArgument):
        t[np.array([1, 2])] = [1.0, 2.0, 3.0]


# -- the prioritized sampler --------------------------------------------------------------------


def _data(n, start=0, episode_len=10):
    steps = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": steps.float().unsqueeze(-1),
            "episode": steps // episode_len,
            "next": {"done": ((steps + 1) % episode_len == 0).unsqueeze(-1)},
        },
        [n],
    )


def test_prioritized_sampler_draws_in_proportion_with_torchrl_weights():
    torch.manual_seed(0)
    np.random.seed(0)
    n = 8
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(n), sampler=PrioritizedSampler(n, alpha=0.7, beta=0.5), batch_size=4000
    )
    rb.extend(_data(n))
    prios = torch.arange(1, n + 1, dtype=torch.float)
    rb.update_priority(torch.arange(n), prios)
    s = rb.sample()
    p = (prios + 1e-8) ** 0.7
    p = p / p.sum()
    freq = torch.bincount(s["index"], minlength=n) / 4000
    # binomial standard error sqrt(p(1-p)/4000) < 0.008: 5 sigma
    assert torch.allclose(freq, p, atol=0.04)
    expected_w = (p[s["index"]] / p.min()) ** -0.5
    assert torch.allclose(s["priority_weight"], expected_w.float(), rtol=1e-5)


def test_prioritized_buffers_need_no_torchrl_extension():
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(100), batch_size=16)
    rb.extend(_data(50))
    s = rb.sample()
    s["td_error"] = torch.full((16,), 5.0)
    rb.update_tensordict_priority(s)
    assert rb.sampler.default_priority == pytest.approx(5.0)
    rb2 = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(10), batch_size=4)
    rb2.extend(_data(10))
    data, info = rb2.sample(return_info=True)
    assert data.shape == (4,) and info["priority_weight"].shape == (4,)


def test_stale_priority_updates_are_skipped_by_key():
    rb = TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=0.4, storage=LazyTensorStorage(4), batch_size=4, track_keys=True
    )
    rb.extend(_data(4))
    s = rb.sample()
    assert torch.equal(s["key"], s["index"])  # keys 0..3 went to slots 0..3
    rb.extend(_data(2, start=4))  # slots 0 and 1 now hold new items
    s["td_error"] = torch.full((4,), 100.0)
    rb.update_tensordict_priority(s)
    tree = rb.sampler._sum_tree
    for i in s["index"].tolist():
        expected = 1.0 if i in (0, 1) else 100.0  # the new items kept the default priority
        assert tree[i] == pytest.approx(expected, rel=1e-5)
    with pytest.raises(InvalidArgument):
        PrioritizedSampler(4, 1.0, 1.0).update_priority(torch.tensor([0]), 1.0, keys=torch.tensor([0]))


def test_prioritized_sampler_dumps_loads_and_state_dict(tmp_path):
    def make(name):
        return TensorDictPrioritizedReplayBuffer(
            alpha=0.6, beta=0.4, storage=LazyMemmapStorage(64, scratch_dir=tmp_path / name), batch_size=8
        )

    rb = make("a")
    rb.extend(_data(40))
    rb.update_priority(torch.arange(40), torch.linspace(0.1, 9.0, 40))
    rb.dumps(tmp_path / "ckpt")
    rb2 = make("b")
    rb2.loads(tmp_path / "ckpt")
    idx = np.arange(64)
    assert np.allclose(rb2.sampler._sum_tree[idx], rb.sampler._sum_tree[idx])
    assert np.allclose(rb2.sampler._min_tree[idx], rb.sampler._min_tree[idx])
    assert float(rb2.sampler.default_priority) == pytest.approx(float(rb.sampler.default_priority))
    state = rb.sampler.state_dict()
    fresh = PrioritizedSampler(64, 0.6, 0.4)
    fresh.load_state_dict(state)
    rb.update_priority(torch.tensor([0]), torch.tensor([50.0]))  # the copy is decoupled
    assert fresh._sum_tree[0] != pytest.approx(rb.sampler._sum_tree[0])


# -- slices -------------------------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(
    cap=st.integers(2, 30),
    mode=st.sampled_from(["traj", "end"]),
    writes=st.lists(
        st.tuples(st.integers(1, 45), st.floats(0.0, 1.0), st.booleans(), st.booleans()), min_size=1, max_size=6
    ),
)
def test_slice_boundaries_equal_torchrl_after_every_write(cap, mode, writes):
    kw = {"traj_key": "episode"} if mode == "traj" else {"end_key": ("next", "done")}
    ours = SliceSampler(slice_len=2, **kw)
    storage = LazyTensorStorage(cap)
    rb = TensorDictReplayBuffer(storage=storage, sampler=ours, batch_size=2)
    rng = np.random.default_rng(cap)
    episode = 0
    for n, p_new, last_done, one_by_one in writes:
        eps = episode + np.cumsum(rng.random(n) < p_new)
        episode = int(eps[-1]) + 1
        done = np.r_[eps[1:] != eps[:-1], last_done]
        td = TensorDict({"episode": torch.as_tensor(eps), "next": {"done": torch.as_tensor(done).unsqueeze(-1)}}, [n])
        if one_by_one:
            for i in range(n):
                rb.add(td[i])
        else:
            rb.extend(td)
        if len(storage) < 2:
            continue  # (TorchRL's end-flag path cannot squeeze a single row)
        got = ours._get_stop_and_length(storage)
        col = storage[:]["episode"] if mode == "traj" else storage[:][("next", "done")].squeeze()
        want = find_start_stop_traj(
            **({"trajectory": col} if mode == "traj" else {"end": col}),
            at_capacity=storage._is_full,
            cursor=storage._last_cursor_index,
        )
        for a, b in zip(got, want):
            assert torch.equal(a, b.to(a.dtype))


def test_slice_sampler_draws_what_torchrl_draws_for_the_same_generator():
    out = []
    for cls in (RLSliceSampler, SliceSampler):
        gen = torch.Generator().manual_seed(3)
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(500),
            sampler=cls(num_slices=4, traj_key="episode", strict_length=False),
            batch_size=32,
            generator=gen,
        )
        draws = []
        for k in range(6):  # writes interleaved with samples, past the capacity
            rb.extend(_data(130, start=130 * k, episode_len=7 + k))
            draws.append(rb.sample()["obs"].clone())
        out.append(torch.cat(draws))
    assert torch.equal(out[0], out[1])


def test_slice_sampler_stays_correct_when_the_storage_is_written_behind_its_back():
    storage = LazyTensorStorage(40)
    ours = SliceSampler(slice_len=4, traj_key="episode")
    rb = TensorDictReplayBuffer(storage=storage, sampler=ours, batch_size=8)
    rb.extend(_data(40))
    rb.sample()
    rb[torch.arange(0, 10)] = _data(10, start=1000)  # a direct write: not an extend the sampler saw
    got = ours._get_stop_and_length(storage)
    want = find_start_stop_traj(trajectory=storage[:]["episode"], at_capacity=True, cursor=storage._last_cursor_index)
    for a, b in zip(got, want):
        assert torch.equal(a, b.to(a.dtype))


def test_prioritized_slice_sampler_runs_on_replaystore_trees():
    sampler = PrioritizedSliceSampler(max_capacity=100, alpha=0.7, beta=0.5, num_slices=2, traj_key="episode")
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=sampler, batch_size=10)
    rb.extend(_data(100))
    s = rb.sample()
    assert s.shape == (10,) and "priority_weight" in s.keys()
    rb.update_priority(s["index"].reshape(-1), torch.full((10,), 3.0))
    assert isinstance(sampler._sum_tree, SumTree)


def test_generic_replay_buffer_takes_the_sampler_by_constructor_argument():
    rb = RLReplayBuffer(storage=LazyTensorStorage(16), sampler=PrioritizedSampler(16, 0.5, 0.5), batch_size=4)
    rb.extend(torch.arange(16))
    data, info = rb.sample(return_info=True)
    assert data.shape == (4,) and torch.all(data == info["index"])


# -- the flat fast paths equal TorchRL's own code on the same trees -------------------------------


def _filled_sampler(n, size, seed):
    storage = LazyTensorStorage(size)
    storage.set(torch.arange(n), TensorDict({"x": torch.arange(n, dtype=torch.float32)}, batch_size=[n]))
    sampler = PrioritizedSampler(size, alpha=0.7, beta=0.5)
    sampler.extend(torch.arange(n))
    g = torch.Generator().manual_seed(seed)
    sampler.update_priority(torch.arange(n), torch.rand(n, generator=g) * 3)
    return storage, sampler


@pytest.mark.parametrize("seeded", [False, True])
def test_flat_sample_draws_what_torchrl_code_draws(seeded):
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler as RLPrioritizedSampler

    storage, sampler = _filled_sampler(40, 64, 0)
    for batch in (1, 7, 256):
        if seeded:
            sampler._rng = torch.Generator().manual_seed(batch)
        np.random.seed(batch)
        ours_index, ours_info = sampler.sample(storage, batch)
        if seeded:
            sampler._rng = torch.Generator().manual_seed(batch)
        np.random.seed(batch)
        rl_index, rl_info = RLPrioritizedSampler.sample(sampler, storage, batch)  # TorchRL's code, our trees
        assert torch.equal(ours_index, rl_index) and ours_index.dtype == rl_index.dtype
        torch.testing.assert_close(ours_info["priority_weight"], rl_info["priority_weight"], rtol=0, atol=0)


def test_flat_update_sets_what_torchrl_code_sets():
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler as RLPrioritizedSampler

    _, ours = _filled_sampler(40, 64, 1)
    _, ref = _filled_sampler(40, 64, 1)
    g = torch.Generator().manual_seed(2)
    for _ in range(5):
        index = torch.randint(0, 40, (30,), generator=g)  # with repeats: the last one wins in both
        prio = torch.rand(30, generator=g) * 10
        ours.update_priority(index, prio)
        RLPrioritizedSampler.update_priority(ref, index, prio)
        np.testing.assert_array_equal(ours._sum_tree.leaves(), ref._sum_tree.leaves())
        np.testing.assert_array_equal(ours._min_tree.leaves(), ref._min_tree.leaves())
        assert float(ours._max_priority[0]) == float(ref._max_priority[0])
        assert int(ours._max_priority[1]) == int(ref._max_priority[1])
    with pytest.raises(IndexError):  # out of range: TorchRL's path raises, nothing written
        before = ours._sum_tree.leaves()
        ours.update_priority(torch.tensor([3, 64]), torch.tensor([1.0, 2.0]))
    np.testing.assert_array_equal(ours._sum_tree.leaves(), before)


# -- the storage: its reads equal TorchRL's ------------------------------------------------------


def _td(start, n):
    x = torch.arange(start, start + n)
    return TensorDict(
        {"obs": torch.stack([x, -x], -1).float(), "a": x, "next": {"done": (x % 3 == 0).unsqueeze(-1)}}, batch_size=[n]
    )


def _same_read(ours, theirs, index):
    try:
        want = theirs.get(index)
    except Exception as e:  # noqa: BLE001 - the same exception type is the contract
        with pytest.raises(type(e)):
            ours.get(index)
        return
    got = ours.get(index)
    assert got.batch_size == want.batch_size and set(got.keys(True, True)) == set(want.keys(True, True))
    for k in want.keys(True, True):
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k])


@settings(max_examples=12, deadline=None)
@given(
    cap=st.integers(1, 12),
    writes=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    reads=st.lists(st.lists(st.integers(-14, 14), min_size=1, max_size=9), min_size=1, max_size=3),
)
def test_storage_reads_equal_torchrl_storage_reads(cap, writes, reads):
    ours = RLReplayBuffer(storage=RSLazyTensorStorage(cap), batch_size=2)
    theirs = RLReplayBuffer(storage=LazyTensorStorage(cap), batch_size=2)
    start = 0
    for n in writes:
        ours.extend(_td(start, n))
        theirs.extend(_td(start, n))
        start += n
        for r in reads:
            idx = torch.tensor(r)
            _same_read(ours._storage, theirs._storage, idx)  # in range, negative, too large
            _same_read(ours._storage, theirs._storage, idx.int())  # (other dtypes: TorchRL's code)
        _same_read(ours._storage, theirs._storage, slice(0, 2))
    torch.manual_seed(0)
    a = ours.sample()
    torch.manual_seed(0)
    b = theirs.sample()
    assert torch.equal(a["a"], b["a"]) and torch.equal(a["next", "done"], b["next", "done"])


def test_storage_with_non_tensor_data_takes_torchrl_path():
    ours, theirs = RSLazyTensorStorage(4), LazyTensorStorage(4)
    for s in (ours, theirs):
        s.set(torch.arange(3), TensorDict({"x": torch.arange(3.0), "tag": "abc"}, batch_size=[3]))
    _same_read(ours, theirs, torch.tensor([2, 0]))
    assert ours.get(torch.tensor([2, 0]))["tag"] == theirs.get(torch.tensor([2, 0]))["tag"]
