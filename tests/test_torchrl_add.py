"""replaystore's TorchRL buffers: ``add`` of one step by the compiled write (``writes.fast_add``) is TorchRL's."""

import os

import pytest

os.environ.setdefault("RL_WARNINGS", "0")
torch = pytest.importorskip("torch")
pytest.importorskip("torchrl")
import numpy as np  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import LazyMemmapStorage, LazyTensorStorage  # noqa: E402
from torchrl.data import ReplayBuffer as RLReplayBuffer  # noqa: E402
from torchrl.data import TensorDictPrioritizedReplayBuffer as RLTensorDictPrioritizedReplayBuffer  # noqa: E402
from torchrl.data import TensorDictReplayBuffer as RLTensorDictReplayBuffer  # noqa: E402

from replaystore.integrations.torchrl import (  # noqa: E402
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    fastpath,
    rows,
)

pytestmark = pytest.mark.skipif(rows._native is None, reason="the compiled module was not built")


def _steps(n: int, start: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(start)
    return TensorDict(
        {
            "obs": torch.randn(n, 4, generator=g),
            "action": torch.arange(start, start + n),
            "reward": torch.randn(n, generator=g),
            "next": {
                "obs": torch.randn(n, 4, generator=g),
                "done": torch.arange(start, start + n).remainder(7).eq(6).unsqueeze(-1),
                "agents": TensorDict({"r": torch.randn(n, 2, 1, generator=g)}, batch_size=[n, 2]),
            },
        },
        batch_size=[n],
    )


def _spy_add(monkeypatch):
    """Record whether each add took the compiled write (True) or TorchRL's (False)."""
    taken = []
    original = fastpath.fast_add

    def spy(*args):
        index = original(*args)
        taken.append(index is not None)
        return index

    monkeypatch.setattr(fastpath, "fast_add", spy)
    return taken


def _same_state(a, b):
    n = len(a.storage)
    assert n == len(b.storage)
    assert a._writer._cursor == b._writer._cursor and a._writer._write_count == b._writer._write_count
    assert str(a.storage._last_cursor) == str(b.storage._last_cursor)
    assert a.storage._mutation_revision == b.storage._mutation_revision
    x, y = a.storage._storage, b.storage._storage
    assert set(x.keys(True, True)) == set(y.keys(True, True))
    for key in x.keys(True, True):
        assert x.get(key).dtype == y.get(key).dtype and torch.equal(x.get(key)[:n], y.get(key)[:n]), key


def _pair(kind: str, cap: int, tmp_path):
    def storage(tag):
        return LazyMemmapStorage(cap, scratch_dir=tmp_path / tag) if kind == "memmap" else LazyTensorStorage(cap)

    if kind == "per":
        kw = dict(alpha=0.7, beta=0.5, batch_size=5)
        return (
            RLTensorDictPrioritizedReplayBuffer(storage=storage("a"), **kw),
            TensorDictPrioritizedReplayBuffer(storage=storage("b"), **kw),
        )
    if kind == "generic":
        return RLReplayBuffer(storage=storage("a"), batch_size=5), ReplayBuffer(storage=storage("b"), batch_size=5)
    return RLTensorDictReplayBuffer(storage=storage("a"), batch_size=5), TensorDictReplayBuffer(
        storage=storage("b"), batch_size=5
    )


@pytest.mark.parametrize("kind", ["td", "memmap", "generic", "per"])
def test_add_writes_what_torchrl_writes(kind, tmp_path, monkeypatch):
    if kind == "per":
        try:  # TorchRL's own prioritized buffer needs its C++ extension, built for this torch
            import torchrl._torchrl  # noqa: F401

            RLTensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(4))
        except (ImportError, RuntimeError) as e:  # (missing, or the wheel's built for another torch)
            pytest.skip(f"TorchRL's prioritized sampler is not usable here: {e}"[:200])
    taken = _spy_add(monkeypatch)
    cap = 7
    ref, ours = _pair(kind, cap, tmp_path)
    for buffer in (ref, ours):  # (the first write initializes the storage: TorchRL's path for both)
        buffer.extend(_steps(3))
    for step in range(20):  # (wraps around the 7 rows twice)
        if step % 6 == 5:
            batch = _steps(2, 100 + step)
            assert torch.equal(ref.extend(batch.clone()), ours.extend(batch.clone()))
            continue
        one = _steps(1, step)[0]
        a, b = one.clone(), one.clone()
        i, j = ref.add(a), ours.add(b)
        assert type(i) is type(j) and int(i) == int(j)
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        if "index" in a.keys():
            assert torch.equal(a["index"], b["index"])
        _same_state(ref, ours)
        if kind == "per":  # (the add's priority update: TorchRL's trees and max priority)
            leaves = torch.arange(len(ref))  # (unset leaves: FLT_MAX in TorchRL's float32 min tree, inf in ours)
            assert torch.equal(ref._sampler._sum_tree[leaves], ours._sampler._sum_tree[leaves])
            assert torch.equal(ref._sampler._min_tree[leaves], ours._sampler._min_tree[leaves])
            assert str(ref._sampler._max_priority) == str(ours._sampler._max_priority)
    assert taken and all(taken)
    torch.manual_seed(0)
    np.random.seed(0)  # (the prioritized samplers draw from NumPy's global stream)
    x = ref.sample()
    torch.manual_seed(0)
    np.random.seed(0)
    y = ours.sample()
    if kind == "generic":
        assert torch.equal(x["obs"], y["obs"])
    else:
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_add_of_a_step_that_does_not_match_takes_torchrl_path(monkeypatch):
    taken = _spy_add(monkeypatch)
    ref, ours = (
        RLTensorDictReplayBuffer(storage=LazyTensorStorage(10)),
        TensorDictReplayBuffer(storage=LazyTensorStorage(10)),
    )
    for buffer in (ref, ours):
        buffer.extend(_steps(2))
    good = _steps(1, 5)[0]
    cast = good.clone()
    cast["action"] = cast["action"].to(torch.int32)  # (TorchRL casts on assignment)
    extra = good.clone()
    extra["other"] = torch.ones(3)  # (a key the storage lacks: TorchRL's error or its rules)
    batched = _steps(1, 6)  # (a batch dimension: TorchRL's error, after moving its cursor)
    grad = good.clone()
    grad["reward"] = grad["reward"].clone().requires_grad_()
    for data in (cast, grad, good):
        a, b = data.clone(), data.clone()
        assert int(ref.add(a)) == int(ours.add(b))
        _same_state(ref, ours)
    for odd in (extra, batched):  # (the same outcome: TorchRL's result or its error, the same state after)
        outcome = []
        for buffer in (ref, ours):
            try:
                outcome.append(int(buffer.add(odd.clone())))
            except Exception as e:  # noqa: BLE001 - compared below
                outcome.append(type(e))
        assert outcome[0] == outcome[1]
        if odd is batched:  # (TorchRL's failed write counts a row it never wrote: uninitialized memory)
            assert ref._writer._cursor == ours._writer._cursor and len(ref) == len(ours)
        else:
            _same_state(ref, ours)
    assert taken == [False, False, True, False, False]


def test_add_with_a_transform_or_before_init_takes_torchrl_path(monkeypatch):
    from torchrl.envs.transforms import Compose, RewardScaling

    taken = _spy_add(monkeypatch)
    ours = TensorDictReplayBuffer(storage=LazyTensorStorage(5), transform=Compose(RewardScaling(0.0, 2.0)))
    ref = RLTensorDictReplayBuffer(storage=LazyTensorStorage(5), transform=Compose(RewardScaling(0.0, 2.0)))
    for buffer in (ref, ours):
        buffer.add(_steps(1)[0])
        buffer.add(_steps(1, 1)[0])
    _same_state(ref, ours)
    assert taken == []
