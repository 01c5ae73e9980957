"""replaystore's TorchRL buffers (fast ``sample``, ``update_tensordict_priority``) against TorchRL 0.14.1's path."""

import os

import pytest

os.environ.setdefault("RL_WARNINGS", "0")
torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tensordict import NonTensorData, TensorDict  # noqa: E402
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ListStorage  # noqa: E402
from torchrl.data import ReplayBuffer as RLReplayBuffer  # noqa: E402
from torchrl.data import TensorDictReplayBuffer as RLTensorDictReplayBuffer  # noqa: E402

from replaystore.integrations.torchrl import (  # noqa: E402
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from replaystore.integrations.torchrl.fastpath import gather_rows  # noqa: E402


def _steps(n: int, start: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(start)
    steps = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": torch.randn(n, 4, generator=g),
            "pixels": torch.randint(0, 255, (n, 2, 3, 3), dtype=torch.uint8, generator=g),
            "action": steps % 3,
            "next": {
                "obs": torch.randn(n, 4, generator=g),
                "done": (steps % 7 == 6).unsqueeze(-1),
                "agents": TensorDict({"r": torch.randn(n, 2, 1, generator=g)}, batch_size=[n, 2]),
            },
        },
        batch_size=[n],
    )


def _assert_same(x, y):
    """Same type, keys, batch sizes (nested too), dtypes, shapes and values."""
    assert type(x) is type(y)
    if isinstance(x, tuple):
        assert len(x) == len(y) and all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(x, y))
        return
    assert set(x.keys(True)) == set(y.keys(True))
    for key in x.keys(True):
        a, b = x.get(key), y.get(key)
        if isinstance(a, TensorDict):
            assert a.batch_size == b.batch_size, key
        else:
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), key
    assert x.batch_size == y.batch_size and x.device == y.device


def _count_gets(rb):
    """Count the storage's ``get`` calls (TorchRL's path reads through it; the fast path does not)."""
    calls = []
    original = rb.storage.get

    def get(index):
        calls.append(index)
        return original(index)

    rb.storage.get = get
    return calls


@settings(max_examples=20, deadline=None)
@given(
    cap=st.integers(5, 60),
    writes=st.lists(st.integers(1, 25), min_size=1, max_size=6),
    batches=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    memmap=st.booleans(),
    td_buffer=st.booleans(),
)
def test_fast_sample_equals_torchrl_sample(cap, writes, batches, memmap, td_buffer, tmp_path_factory):
    storages = []
    for _ in range(2):
        if memmap:
            storages.append(LazyMemmapStorage(cap, scratch_dir=tmp_path_factory.mktemp("mm")))
        else:
            storages.append(LazyTensorStorage(cap))
    rl_cls, rs_cls = (RLTensorDictReplayBuffer, TensorDictReplayBuffer) if td_buffer else (RLReplayBuffer, ReplayBuffer)
    rl = rl_cls(storage=storages[0], generator=torch.Generator().manual_seed(3))
    rs = rs_cls(storage=storages[1], generator=torch.Generator().manual_seed(3))
    gets = _count_gets(rs)
    start = 0
    for n in writes:
        rl.extend(_steps(n, start))
        rs.extend(_steps(n, start))
        start += n
        for b in batches:
            x, xi = rl.sample(b, return_info=True)
            y, yi = rs.sample(b, return_info=True)
            _assert_same(x, y)
            assert set(xi) == set(yi) and torch.equal(xi["index"], yi["index"])
            if td_buffer:
                assert torch.equal(y["index"], x["index"])
    assert gets == []  # every sample took the fast path


def test_fast_sample_of_a_tuple_storage_equals_torchrl():
    data = (torch.randn(50, 3), torch.arange(50), torch.zeros(50, 2, dtype=torch.bool))
    rl = RLReplayBuffer(storage=LazyTensorStorage(40), batch_size=16, generator=torch.Generator().manual_seed(0))
    rs = ReplayBuffer(storage=LazyTensorStorage(40), batch_size=16, generator=torch.Generator().manual_seed(0))
    rl.extend(data)
    rs.extend(data)
    gets = _count_gets(rs)
    for _ in range(3):
        _assert_same(rl.sample(), rs.sample())
    assert gets == []


class _FirstRowsStorage(LazyTensorStorage):
    """A storage whose ``len`` counts only its first 10 rows (the fast path must ask it, not read ``_len``)."""

    def __len__(self):
        return min(super().__len__(), 10)


def test_fast_sample_asks_a_storage_that_overrides_len():
    rl = RLTensorDictReplayBuffer(storage=_FirstRowsStorage(100), batch_size=64)
    rs = TensorDictReplayBuffer(storage=_FirstRowsStorage(100), batch_size=64)
    rl._storage._rng = torch.Generator().manual_seed(1)
    rs._storage._rng = torch.Generator().manual_seed(1)
    data = _steps(50)
    rl.extend(data)
    rs.extend(data)
    gets = _count_gets(rs)
    for _ in range(3):
        want, got = rl.sample(), rs.sample()
        _assert_same(want, got)
        assert int(got["index"].max()) < 10
    assert gets == []


@pytest.mark.parametrize("track_keys", [False, True])
def test_fast_prioritized_steps_equal_torchrl_path(track_keys):
    """Our buffer's fast sample + update vs TorchRL's buffer class around the same sampler: same draws, same trees."""
    kw = dict(alpha=0.7, beta=0.5)
    rl = RLTensorDictReplayBuffer(
        storage=LazyTensorStorage(300),
        sampler=PrioritizedSampler(300, track_keys=track_keys, **kw),
        batch_size=32,
        generator=torch.Generator().manual_seed(5),
    )
    rs = TensorDictPrioritizedReplayBuffer(
        storage=LazyTensorStorage(300),
        batch_size=32,
        generator=torch.Generator().manual_seed(5),
        track_keys=track_keys,
        **kw,
    )
    gets = _count_gets(rs)
    g = torch.Generator().manual_seed(1)
    for i in range(6):
        data = _steps(70, 70 * i)
        rl.extend(data.clone())
        rs.extend(data.clone())
        x, y = rl.sample(), rs.sample()
        _assert_same(x, y)
        assert "priority_weight" in y.keys()
        err = torch.rand(32, generator=g)
        x["td_error"], y["td_error"] = err, err.clone()
        rl.update_tensordict_priority(x)
        rs.update_tensordict_priority(y)
        assert rl.sampler._sum_tree.leaves().tolist() == rs.sampler._sum_tree.leaves().tolist()
        assert rl.sampler._min_tree.leaves().tolist() == rs.sampler._min_tree.leaves().tolist()
    assert gets == []


def test_fast_update_reduces_multi_column_priorities_as_torchrl():
    """A (B, k) priority takes TorchRL's path (reduced by max): the trees equal TorchRL's buffer class's."""
    kw = dict(alpha=0.6, beta=0.4)
    rl = RLTensorDictReplayBuffer(storage=LazyTensorStorage(100), sampler=PrioritizedSampler(100, **kw), batch_size=8)
    rs = TensorDictPrioritizedReplayBuffer(storage=LazyTensorStorage(100), batch_size=8, **kw)
    data = _steps(100)
    rl.extend(data.clone())
    rs.extend(data.clone())
    sample = rs.sample()
    sample["td_error"] = torch.rand(8, 3)
    rs.update_tensordict_priority(sample)
    rl.update_tensordict_priority(sample.clone())
    assert rl.sampler._sum_tree.leaves().tolist() == rs.sampler._sum_tree.leaves().tolist()
    last = dict(zip(sample["index"].tolist(), sample["td_error"].max(-1).values.tolist()))  # duplicates: last wins
    leaves = rs.sampler._sum_tree.leaves()
    assert [leaves[i] for i in last] == pytest.approx([(p + 1e-8) ** 0.6 for p in last.values()], rel=1e-6)


def test_non_tensor_leaves_prefetch_and_transforms_take_torchrl_path():
    data = _steps(30)
    data["note"] = NonTensorData("x", batch_size=[30])
    rs = TensorDictReplayBuffer(storage=LazyTensorStorage(30), batch_size=4)
    rs.extend(data)
    gets = _count_gets(rs)
    sample = rs.sample()
    assert list(sample["note"]) == ["x"] * 4 and sample.batch_size == (4,) and len(gets) == 1

    def double_obs(td):
        td["obs"] = td["obs"] * 2
        return td

    for kwargs in ({"transform": double_obs}, {"prefetch": 2}):
        rl = RLTensorDictReplayBuffer(
            storage=LazyTensorStorage(30), batch_size=4, generator=torch.Generator().manual_seed(2), **kwargs
        )
        rs = TensorDictReplayBuffer(
            storage=LazyTensorStorage(30), batch_size=4, generator=torch.Generator().manual_seed(2), **kwargs
        )
        rl.extend(_steps(30))
        rs.extend(_steps(30))
        gets = _count_gets(rs)
        _assert_same(rl.sample(), rs.sample())
        assert gets  # TorchRL's path read the storage
    assert gather_rows({"a": torch.zeros(3)}, torch.tensor([0]), torch.Size([1])) is None


def test_list_storage_empty_buffer_and_batch_size_conflicts_behave_as_torchrl():
    rs = TensorDictReplayBuffer(storage=ListStorage(10), batch_size=2)
    rs.extend(_steps(5))
    assert rs.sample().batch_size == (2,)  # TorchRL's path (a list storage)
    empty = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    with pytest.raises(RuntimeError):
        empty.sample()
    no_size = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    no_size.extend(_steps(5))
    with pytest.raises(RuntimeError, match="batch_size not specified"):
        no_size.sample()
    sized = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    sized.extend(_steps(5))
    with pytest.warns(UserWarning, match="conflicting batch_sizes"):
        assert sized.sample(3).batch_size == (3,)


def test_prioritized_replay_buffer_fast_sample_returns_info():
    rs = PrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(50), batch_size=8)
    rs.extend(_steps(50))
    gets = _count_gets(rs)
    data, info = rs.sample(return_info=True)
    assert gets == [] and data.batch_size == (8,) and "index" not in data.keys()
    assert info["index"].shape == (8,) and info["priority_weight"].dtype == torch.float32
    rs.update_priority(info["index"], torch.full((8,), 5.0))
    assert rs.sampler._sum_tree.values_at(info["index"].numpy()) == pytest.approx((5.0 + 1e-8) ** 0.6)


@pytest.mark.parametrize("kind", ["td_buffer", "td_items", "tuples"])
def test_list_storage_fast_stack_equals_torchrl_collate(kind):
    """A ListStorage of single steps: one stack per leaf, equal to TorchRL's collate (dense TensorDict or tuple)."""
    data = _steps(40)
    if kind == "tuples":
        items = [(data["obs"][i], data["action"][i], data["next", "done"][i]) for i in range(40)]
    else:
        items = list(data.unbind(0))
    rl_cls, rs_cls = (
        (RLTensorDictReplayBuffer, TensorDictReplayBuffer) if kind == "td_buffer" else (RLReplayBuffer, ReplayBuffer)
    )
    rl = rl_cls(storage=ListStorage(30), batch_size=8, generator=torch.Generator().manual_seed(4))
    rs = rs_cls(storage=ListStorage(30), batch_size=8, generator=torch.Generator().manual_seed(4))
    for buffer in (rl, rs):
        buffer.extend(data.clone() if kind == "td_buffer" else items)  # (40 steps in 30 slots: overwrites)
    gets = _count_gets(rs)
    for _ in range(3):
        _assert_same(rl.sample(), rs.sample())
    assert gets == []


def test_list_storage_items_that_differ_take_torchrl_collate():
    rl = RLReplayBuffer(storage=ListStorage(10), batch_size=6, generator=torch.Generator().manual_seed(0))
    rs = ReplayBuffer(storage=ListStorage(10), batch_size=6, generator=torch.Generator().manual_seed(0))
    mixed = [TensorDict({"a": torch.ones(2)}, []), TensorDict({"a": torch.ones(2), "b": torch.zeros(1)}, [])] * 5
    for buffer in (rl, rs):
        buffer.extend(mixed)
    x, y = rl.sample(), rs.sample()
    assert type(x) is type(y) and torch.equal(x["a"], y["a"])  # (TorchRL's lazy stack, both)


def test_list_storage_items_of_different_lengths_get_torchrl_lazy_stack():
    """Trajectories of different lengths: TorchRL stacks them lazily; so does ours (its collate, same rows)."""
    trajs = [TensorDict({"obs": torch.full((n, 2), float(n))}, [n]) for n in (2, 3, 2, 4)]
    rl = RLReplayBuffer(storage=ListStorage(4), batch_size=5, generator=torch.Generator().manual_seed(7))
    rs = ReplayBuffer(storage=ListStorage(4), batch_size=5, generator=torch.Generator().manual_seed(7))
    for buffer in (rl, rs):
        buffer.extend(trajs)
    x, y = rl.sample(), rs.sample()
    assert type(x) is type(y)
    assert [t["obs"].tolist() for t in x.unbind(0)] == [t["obs"].tolist() for t in y.unbind(0)]
