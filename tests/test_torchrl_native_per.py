"""The C draw and update of the TorchRL ``PrioritizedSampler`` (``_native.per_draw``/``per_update``) are numba's.

Twins: the same trees, masses, leaves and priorities through the C module on the interleaved
layout (``trees.paired``: sum and min nodes side by side in one buffer) and through the numba
kernels (``kernels.draw``/``kernels.update``) on two separate contiguous trees (the layout before
the interleaving) and, through the sampler, the NumPy steps: identical indices, weights, tree nodes
and max priorities, bit for bit, on random sequences with fixed seeds (duplicate leaves, zero
leaves, masses above the total, float32 and float64, NaN priorities).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torchrl")

import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import LazyTensorStorage  # noqa: E402

from replaystore.integrations.torchrl import kernels, prioritized  # noqa: E402
from replaystore.integrations.torchrl.prioritized import PrioritizedSampler  # noqa: E402
from replaystore.integrations.torchrl.trees import MinTree, SumTree, paired  # noqa: E402

_native = pytest.importorskip("replaystore.integrations.torchrl._native")
pytestmark = pytest.mark.skipif(not kernels.NATIVE, reason="the C module or numba (the [fast] extra) is not available")


def _pair(size):
    """A paired sum and min tree (the C kernels' interleaved layout) and their buffer."""
    sum_tree, min_tree = SumTree(size), MinTree(size)
    return sum_tree, min_tree, paired(sum_tree, min_tree)


def _native_update(pair, leaves, values, raw):
    leaves_t = torch.from_numpy(np.ascontiguousarray(leaves, dtype=np.int64))
    values_t, raw_t = torch.from_numpy(values), torch.from_numpy(raw)
    args = (leaves_t.data_ptr(), values_t.data_ptr(), raw_t.data_ptr(), leaves_t.shape[0], values.dtype == np.float32)
    return _native.per_update(pair, *args)


def _native_draw(pair, masses, n, size, f32):
    index = torch.empty(masses.size, dtype=torch.long)
    weight = torch.empty(masses.size, dtype=torch.float32 if f32 else torch.float64)
    ok = _native.per_draw(pair, masses, n, size, index.data_ptr(), weight.data_ptr(), f32)
    return index.numpy(), weight.numpy(), ok


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_equal_the_numba_kernels_on_random_sequences(dtype):
    rng = np.random.default_rng(35)
    for _ in range(40):
        size = int(rng.integers(1, 3000))
        (c_sum, c_min, pair), j_sum, j_min = _pair(size), SumTree(size), MinTree(size)
        assert np.shares_memory(c_sum.nodes, pair) and j_sum.nodes.flags.c_contiguous and j_min.nodes.flags.c_contiguous
        for _ in range(4):
            m = int(rng.integers(1, 700))  # (above 256: the C update's heap scratch)
            leaves = rng.integers(0, size, m)  # (duplicates: the last value wins)
            raw = rng.random(m).astype(dtype) * 4
            raw[rng.integers(0, m, max(1, m // 10))] = 0  # (zero leaves: stepped past by the draw)
            values = ((raw + dtype(1e-8)) ** dtype(0.6)).astype(dtype)
            got = _native_update(pair, leaves, values, raw)
            assert got == kernels.update(j_sum.nodes, j_min.nodes, leaves, values, raw, j_sum.capacity)
            assert np.array_equal(c_sum.nodes, j_sum.nodes) and np.array_equal(c_min.nodes, j_min.nodes)
            total = c_sum.nodes[1]
            masses = rng.uniform(0, total * 1.02, int(rng.integers(1, 600)))  # (some above the total)
            masses[0] = total
            n = int(rng.integers(1, size + 1))
            f32 = dtype is np.float32
            c_index, c_weight, c_ok = _native_draw(pair, masses, n, size, f32)
            j_weight = np.empty(masses.size, dtype=dtype)
            j_index, j_ok = kernels.draw(j_sum.nodes, masses, n, size, j_weight)
            assert c_ok == j_ok
            if c_ok:
                assert np.array_equal(c_index, j_index) and np.array_equal(c_weight, j_weight)
                assert (c_weight != 0).all() and (c_index < n).all()


def test_update_with_a_nan_priority_reports_it_as_numba():
    (c_sum, c_min, pair), j_sum, j_min = _pair(64), SumTree(64), MinTree(64)
    raw = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    leaves = np.array([5, 6, 7])
    got = _native_update(pair, leaves, raw, raw)
    assert got == (True, 8, 3.0, True)
    assert got == kernels.update(j_sum.nodes, j_min.nodes, leaves, raw, raw, 64)
    assert np.array_equal(c_sum.nodes, j_sum.nodes, equal_nan=True)
    assert np.array_equal(c_min.nodes, j_min.nodes, equal_nan=True)


def test_update_outside_the_tree_writes_nothing():
    c_sum, c_min, pair = _pair(100)
    _native_update(pair, np.arange(10), np.ones(10), np.ones(10))
    before = c_sum.nodes.copy(), c_min.nodes.copy()
    for bad in (-1, 128, 1 << 40):
        got = _native_update(pair, np.array([3, bad]), np.array([7.0, 7.0]), np.array([7.0, 7.0]))
        assert got[0] is False
        assert np.array_equal(c_sum.nodes, before[0]) and np.array_equal(c_min.nodes, before[1])


def test_malformed_arguments_raise_and_write_nothing():
    tree, _, pair = _pair(16)
    index, weight = torch.empty(4, dtype=torch.long), torch.empty(4)
    masses = np.zeros(4)
    for bad in (np.zeros(24), np.zeros(48), tree.nodes):  # (not 4 * base doubles; a strided view)
        with pytest.raises((ValueError, BufferError), match="4 \\* base|contiguous"):
            _native.per_draw(bad, masses, 1, 1, index.data_ptr(), weight.data_ptr(), True)
    with pytest.raises(ValueError, match="per_draw"):  # (n above the leaves)
        _native.per_draw(pair, masses, 17, 16, index.data_ptr(), weight.data_ptr(), True)
    with pytest.raises(TypeError):
        _native.per_draw(pair, masses, 1, 1)
    with pytest.raises(ValueError, match="4 \\* base"):
        _native.per_update(np.zeros(96), 0, 0, 0, 0, True)
    with pytest.raises(TypeError):
        _native.per_update(pair, 0, 0, 0, 0, True, True)
    with pytest.raises((ValueError, TypeError)):  # (a read-only tree)
        ro = pair.copy()
        ro.flags.writeable = False
        _native.per_update(ro, 0, 0, 0, 0, True)
    assert not tree.nodes.any()


@settings(max_examples=60, deadline=None)
@given(
    cap=st.integers(1, 300),
    writes=st.lists(st.lists(st.tuples(st.integers(0, 299), st.floats(0, 50, width=32)), max_size=40), max_size=6),
)
def test_update_keeps_the_trees_a_plain_models_sums_and_minima(cap, writes):
    c_sum, c_min, pair = _pair(cap)
    model = {}
    for batch in writes:
        batch = [(leaf % cap, v) for leaf, v in batch]
        if not batch:
            continue
        leaves = np.array([leaf for leaf, _ in batch])
        values = np.array([v for _, v in batch], dtype=np.float64)
        assert _native_update(pair, leaves, values, values)[0]
        model.update(batch)  # (in order: the last value of a leaf wins)
        leaf_values = np.zeros(c_sum.capacity)
        leaf_values[list(model)] = list(model.values())
        assert np.array_equal(c_sum.leaves(), leaf_values[:cap])
        assert c_sum.nodes[1] == pytest.approx(sum(model.values()), rel=1e-12, abs=1e-12)
        assert c_min.nodes[1] == min(model.values())


def _sampler_run(mode: str, monkeypatch, dtype: torch.dtype) -> tuple:
    monkeypatch.setattr(prioritized, "_FUSED", mode != "numpy")
    monkeypatch.setattr(kernels, "NATIVE", mode == "native")
    cap, n = 3000, 2500
    sampler = PrioritizedSampler(cap, alpha=0.6, beta=0.4, dtype=dtype)
    storage = LazyTensorStorage(cap)
    storage.set(torch.arange(n), TensorDict({"x": torch.zeros(n)}, [n]))
    sampler.extend(torch.arange(n))
    g = torch.Generator().manual_seed(3)
    sampler.update_priority(torch.arange(n), torch.rand(n, generator=g, dtype=dtype) * 2)
    np.random.seed(35)
    out = []
    for step in range(30):
        index, info = sampler.sample(storage, 256)
        out.append((index.tolist(), info["priority_weight"].tolist(), str(info["priority_weight"].dtype)))
        prio = torch.rand(256, generator=g, dtype=dtype) * (1 + step % 3)
        prio[::17] = 0  # (zero priorities: (0 + eps) ** alpha leaves)
        sampler.update_priority(index, prio)
    return out, sampler._sum_tree.nodes.tolist(), sampler._min_tree.nodes.tolist(), str(sampler._max_priority)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sampler_draws_and_updates_equal_numba_and_numpy_steps(dtype, monkeypatch):
    native = _sampler_run("native", monkeypatch, dtype)
    assert native == _sampler_run("numba", monkeypatch, dtype)
    assert native == _sampler_run("numpy", monkeypatch, dtype)


@pytest.mark.parametrize("device", [None, "cpu"])
def test_gathered_tensordicts_are_what_new_unsafe_builds(device):
    """rows._direct (the fast path's TensorDict builder) gives TensorDict._new_unsafe's object, usable as one."""
    from replaystore.integrations.torchrl import rows

    assert rows._build_td is rows._direct  # (the pinned tensordict: the check at import passed)
    dev = None if device is None else torch.device(device)
    leaf, inner = torch.arange(6.0).reshape(3, 2), torch.ones(3, 1)
    nested = rows._direct({"y": inner}, torch.Size((3,)), dev)
    ours = rows._direct({"x": leaf, "next": nested}, torch.Size((3,)), dev)
    ref = TensorDict._new_unsafe(
        {"x": leaf, "next": TensorDict._new_unsafe({"y": inner}, batch_size=[3], device=dev, nested=False)},
        batch_size=torch.Size((3,)),
        device=dev,
        nested=False,
    )
    assert list(vars(ours)) == list(vars(ref)) and ours.device == ref.device
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    assert torch.equal(ours[1:]["next", "y"], inner[1:])
    ours.set("z", torch.zeros(3))  # (writable; checks as any TensorDict)
    with pytest.raises(RuntimeError):
        ours.set("bad", torch.zeros(4))
    assert ours.clone().lock_().is_locked and ours.to_dict().keys() == {"x", "next", "z"}
