"""replaystore's TorchRL buffers: the compiled extend, gather and prioritized steps against TorchRL's code paths."""

import os

import pytest

os.environ.setdefault("RL_WARNINGS", "0")
torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import LazyMemmapStorage, LazyTensorStorage  # noqa: E402
from torchrl.data import ReplayBuffer as RLReplayBuffer  # noqa: E402
from torchrl.data import TensorDictReplayBuffer as RLTensorDictReplayBuffer  # noqa: E402

from replaystore.integrations.torchrl import (  # noqa: E402
    PrioritizedSampler,
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    fastpath,
    prioritized,
    rows,
)

native = pytest.mark.skipif(rows._native is None, reason="the compiled module was not built")


def _steps(n: int, start: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(start)
    return TensorDict(
        {
            "obs": torch.randn(n, 4, generator=g),
            "action": torch.arange(start, start + n),
            "next": {
                "obs": torch.randn(n, 4, generator=g),
                "done": torch.arange(start, start + n).remainder(7).eq(6).unsqueeze(-1),
                "agents": TensorDict({"r": torch.randn(n, 2, 1, generator=g)}, batch_size=[n, 2]),
            },
        },
        batch_size=[n],
    )


def _spy_extend(monkeypatch):
    """Record whether each extend took the compiled write (True) or TorchRL's (False)."""
    taken = []
    original = fastpath.fast_extend

    def spy(*args):
        index = original(*args)
        taken.append(index is not None)
        return index

    monkeypatch.setattr(fastpath, "fast_extend", spy)
    return taken


def _torchrl_extend(buffer):
    """Make ``buffer`` (one of ours) extend through TorchRL's own ``_extend`` (the reference)."""
    buffer._extend = lambda data, update_priority=True: RLReplayBuffer._extend(
        buffer, data, update_priority=update_priority
    )


def _assert_same_state(a, b, skip=()):
    n = len(a.storage)
    assert n == len(b.storage)
    assert a._writer._cursor == b._writer._cursor and a._writer._write_count == b._writer._write_count
    assert str(a.storage._last_cursor) == str(b.storage._last_cursor)
    assert a.storage._mutation_revision == b.storage._mutation_revision
    x, y = a.storage._storage, b.storage._storage
    assert set(x.keys(True, True)) == set(y.keys(True, True))
    for key in set(x.keys(True, True)) - set(skip):
        assert x.get(key).dtype == y.get(key).dtype and torch.equal(x.get(key)[:n], y.get(key)[:n]), key


@native
@settings(max_examples=15, deadline=None)
@given(
    cap=st.integers(3, 40),
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    kind=st.sampled_from(["td", "generic", "per"]),
    memmap=st.booleans(),
)
def test_fast_extend_writes_what_torchrl_writes(cap, sizes, kind, memmap, tmp_path_factory, monkeypatch_module):
    def storage():
        return LazyMemmapStorage(cap, scratch_dir=tmp_path_factory.mktemp("mm")) if memmap else LazyTensorStorage(cap)

    if kind == "per":
        ref = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage())
        _torchrl_extend(ref)
        ours = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage())
    elif kind == "td":
        ref, ours = RLTensorDictReplayBuffer(storage=storage()), TensorDictReplayBuffer(storage=storage())
    else:
        ref, ours = RLReplayBuffer(storage=storage()), ReplayBuffer(storage=storage())
    taken = _spy_extend(monkeypatch_module)
    start = 0
    for i, n in enumerate(sizes):
        x, y = _steps(n, start), _steps(n, start)
        if kind == "per" and i % 2:
            x["td_error"] = y["td_error"] = torch.rand(n, generator=torch.Generator().manual_seed(i))
        start += n
        assert torch.equal(ref.extend(x), ours.extend(y))
        assert set(x.keys(True)) == set(y.keys(True))  # ("index" written into the batch, or not, alike)
        if "index" in x.keys():
            assert torch.equal(x["index"], y["index"])
        if kind == "per" and i % 2:  # (the td_error key is not stored: TorchRL's write takes over)
            continue
        _assert_same_state(ref, ours)
        if kind == "per":
            assert ref.sampler._sum_tree.leaves().tolist() == ours.sampler._sum_tree.leaves().tolist()
            assert ref.sampler._min_tree.leaves().tolist() == ours.sampler._min_tree.leaves().tolist()
            assert str(ref.sampler._max_priority) == str(ours.sampler._max_priority)
    fitting = [n <= cap for n in sizes[1:]]
    if kind != "per":  # (every extend after the first that fits the storage took the compiled write)
        assert taken[1:] == fitting


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@native
def test_extend_of_batches_that_do_not_match_takes_torchrl_path(monkeypatch):
    ref, ours = (
        RLTensorDictReplayBuffer(storage=LazyTensorStorage(20)),
        TensorDictReplayBuffer(storage=LazyTensorStorage(20)),
    )
    for buffer in (ref, ours):
        buffer.extend(_steps(5))
    taken = _spy_extend(monkeypatch)
    wider = _steps(3, 5)
    wider["obs"] = wider["obs"].double()  # (TorchRL casts on write)
    extra = _steps(3, 8)
    extra["other"] = torch.zeros(3)  # (a key the storage lacks)
    fewer = _steps(3, 11).exclude("action")  # (TorchRL writes the keys given)
    locked = _steps(3, 14)  # (a locked batch: TorchRL's extend writes "index" into its copy)
    for batch in (extra, fewer, wider):
        results = []
        for buffer in (ref, ours):
            try:
                results.append(buffer.extend(batch.clone()))
            except Exception as e:  # noqa: BLE001 - the same error type from both
                results.append(type(e))
        assert type(results[0]) is type(results[1])
        if isinstance(results[0], torch.Tensor):
            assert torch.equal(results[0], results[1])
            _assert_same_state(ref, ours, skip=["action"])  # (rows of "fewer" without it: never written)
    assert results == [RuntimeError, RuntimeError]  # (TorchRL's index_put_ refuses the float64 rows, both)
    assert not any(taken)
    assert torch.equal(ref.extend(locked.clone().lock_()), ours.extend(locked.clone().lock_()))  # (copied first)
    plain = _steps(4, 50)
    plain["other"] = torch.ones(4)  # (TorchRL's write of `extra` added "other" to the storage)
    assert torch.equal(ref.extend(plain.clone()), ours.extend(plain.clone())) and taken[-1]
    for key in ref.storage._storage.keys(True, True):  # (the rows of the last write)
        assert torch.equal(ref.storage._storage.get(key)[-6:-2], ours.storage._storage.get(key)[-6:-2])


@native
@pytest.mark.parametrize("generic", [False, True])
def test_compiled_gather_equals_torchrl_indexing_and_follows_replaced_leaves(generic):
    cls_rl, cls_rs = (RLReplayBuffer, ReplayBuffer) if generic else (RLTensorDictReplayBuffer, TensorDictReplayBuffer)
    ref = cls_rl(storage=LazyTensorStorage(50), batch_size=9, generator=torch.Generator().manual_seed(3))
    ours = cls_rs(storage=LazyTensorStorage(50), batch_size=9, generator=torch.Generator().manual_seed(3))
    ref.extend(_steps(50))
    ours.extend(_steps(50))
    storage = ours.storage
    for step in range(3):
        x, y = ref.sample(), ours.sample()
        assert ours._rs_plan is not None and ours._rs_plan.root is storage._storage
        assert set(x.keys(True)) == set(y.keys(True)) and x.batch_size == y.batch_size
        assert list(x.keys(True)) == list(y.keys(True))  # (same order too)
        for key in x.keys(True, True):
            a, b = x.get(key), y.get(key)
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), key
            assert b.is_contiguous() and b.untyped_storage().nbytes() == b.nbytes  # (a tensor of its own)
        assert y["next", "agents"].batch_size == (9, 2)
        if step == 0:  # a leaf replaced behind the buffer's back: the plan is remade
            obs = torch.randn(50, 4)
            ref.storage._storage["obs"], storage._storage["obs"] = obs, obs.clone()
    storage._storage = storage._storage.clone()  # (e.g. a checkpoint load): a new plan for the new container
    torch.testing.assert_close(ref.sample(), ours.sample(), rtol=0, atol=0)
    assert ours._rs_plan.root is storage._storage


def test_without_the_compiled_module_sample_and_extend_equal_torchrl(monkeypatch):
    monkeypatch.setattr(rows, "_native", None)
    kw = dict(batch_size=7)
    ref = RLTensorDictReplayBuffer(storage=LazyTensorStorage(30), generator=torch.Generator().manual_seed(1), **kw)
    ours = TensorDictReplayBuffer(storage=LazyTensorStorage(30), generator=torch.Generator().manual_seed(1), **kw)
    for start in (0, 20, 40):
        assert torch.equal(ref.extend(_steps(20, start)), ours.extend(_steps(20, start)))
        torch.testing.assert_close(ref.sample(), ours.sample(), rtol=0, atol=0)
    assert ours._rs_plan is None and ours._rs_wplan is None
    _assert_same_state(ref, ours)


def _filled_sampler(fused: bool, monkeypatch, dtype=torch.float32, cap=600, n=500):
    monkeypatch.setattr(prioritized, "_FUSED", fused)
    sampler = PrioritizedSampler(cap, alpha=0.7, beta=0.4, dtype=dtype)
    storage = LazyTensorStorage(cap)
    storage.set(torch.arange(n), TensorDict({"x": torch.zeros(n)}, [n]))
    sampler.extend(torch.arange(n))
    g = torch.Generator().manual_seed(0)
    sampler.update_priority(torch.arange(n), torch.rand(n, generator=g, dtype=dtype) * 3)
    sampler.update_priority(torch.arange(0, n, 7), torch.zeros(len(range(0, n, 7)), dtype=dtype))  # (zero leaves)
    return sampler, storage


@pytest.mark.skipif(not prioritized._FUSED, reason="numba (the [fast] extra) is not installed")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_prioritized_draw_and_update_equal_the_numpy_steps(dtype, monkeypatch):
    results = []
    for fused in (True, False):
        sampler, storage = _filled_sampler(fused, monkeypatch, dtype)
        np.random.seed(11)
        draws = []
        for step in range(5):
            index, info = sampler.sample(storage, 64)
            draws.append((index.tolist(), info["priority_weight"].tolist(), info["priority_weight"].dtype))
            prio = torch.rand(64, generator=torch.Generator().manual_seed(step), dtype=dtype) * (step + 1)
            if step == 4:  # (the last step: a NaN in the trees stops further draws, both ways)
                prio[5] = float("nan")  # (NaN: TorchRL's max rule keeps the old max)
            sampler.update_priority(index, prio)
            sampler.update_priority(index[:3], 9.5)  # (one priority for several indices: mark_update)
        results.append(
            (draws, sampler._sum_tree.leaves().tolist(), sampler._min_tree.leaves().tolist(), sampler._max_priority)
        )
    (d1, s1, m1, p1), (d2, s2, m2, p2) = results
    assert d1 == d2 and s1 == s2 and m1 == m2
    assert str(p1) == str(p2)
    assert all(w for draw in d1 for w in draw[1])  # (zero leaves never drawn)


@pytest.mark.skipif(not prioritized._FUSED, reason="numba (the [fast] extra) is not installed")
def test_compiled_update_refuses_indices_out_of_range_as_torchrl(monkeypatch):
    sampler, _ = _filled_sampler(True, monkeypatch, cap=100, n=50)
    before = sampler._sum_tree.leaves().tolist()
    with pytest.raises((IndexError, RuntimeError)):
        sampler.update_priority(torch.tensor([3, 1 << 20]), torch.tensor([1.0, 2.0]))
    assert sampler._sum_tree.leaves()[3] == before[3]  # (nothing written by the compiled step)
    sampler.update_priority(torch.tensor([-1, 4]), torch.tensor([5.0, 6.0]))  # (TorchRL skips -1)
    assert sampler._sum_tree.leaves()[4] == pytest.approx((6.0 + 1e-8) ** 0.7, rel=1e-6)


def test_a_key_added_to_the_storage_after_a_sample_is_gathered_too():
    """TorchRL's write of a batch with a new key adds it to the stored TensorDict: the plan is remade."""
    kw = dict(batch_size=4)
    ref = RLTensorDictReplayBuffer(storage=LazyTensorStorage(20), generator=torch.Generator().manual_seed(2), **kw)
    ours = TensorDictReplayBuffer(storage=LazyTensorStorage(20), generator=torch.Generator().manual_seed(2), **kw)
    for buffer in (ref, ours):
        buffer.extend(TensorDict({"a": torch.arange(5.0)}, [5]))
    torch.testing.assert_close(ref.sample(), ours.sample(), rtol=0, atol=0)
    for buffer in (ref, ours):
        buffer.extend(TensorDict({"a": torch.arange(3.0), "other": torch.ones(3)}, [3]))
        buffer.extend(TensorDict({"a": torch.arange(3.0), "other": torch.ones(3)}, [3]))
    x, y = ref.sample(), ours.sample()
    assert list(x.keys()) == list(y.keys()) and "other" in y.keys()
    assert torch.equal(x["a"], y["a"]) and torch.equal(x["index"], y["index"])


def test_extend_with_a_view_of_the_storage_raises_as_torchrl():
    """Rows of the storage itself as the batch: TorchRL's index_put_ refuses the overlap; so does ours (no copy)."""
    errors = []
    for cls in (RLTensorDictReplayBuffer, TensorDictReplayBuffer):
        buffer = cls(storage=LazyTensorStorage(10))
        buffer.extend(TensorDict({"a": torch.arange(10.0)}, [10]))
        buffer.extend(TensorDict({"a": torch.arange(3.0)}, [3]))
        with pytest.raises(RuntimeError, match="single memory location") as info:
            buffer.extend(buffer.storage._storage[0:5])
        errors.append(str(info.value))
    assert errors[0] == errors[1]
