"""The TorchRL sampler's sum and min trees in one interleaved buffer (``trees.paired``).

A paired tree behaves as a plain float64 array of leaves (hypothesis model test: writes by
TorchRL's ``tree[index] = values`` and by the C update, reads, ``query``, ``scan_lower_bound``,
the C draw), its nodes are those of an unpaired tree (the layout before the interleaving) bit for
bit, and copies, pickles, ``state_dict``/``load_state_dict`` and ``dumps``/``loads`` of a sampler
hold trees of their own that draw and update exactly as the original.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

pytest.importorskip("torchrl")

import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import LazyTensorStorage  # noqa: E402

from replaystore.errors import InvalidArgument  # noqa: E402
from replaystore.integrations.torchrl import kernels  # noqa: E402
from replaystore.integrations.torchrl.prioritized import PrioritizedSampler  # noqa: E402
from replaystore.integrations.torchrl.trees import MinTree, SumTree, new_pair, paired  # noqa: E402

needs_kernels = pytest.mark.skipif(not kernels.AVAILABLE, reason="numba (the [fast] extra) is not available")

# values k / 8 up to 64: every sum of up to 1024 of them is exact in float64, so the model's sums
# and prefix searches are the trees' exactly, whatever the order of the additions
_value = st.integers(0, 512).map(lambda k: k / 8)
_write = st.tuples(st.sampled_from(["setitem", "native"]), st.lists(st.tuples(st.integers(0, 99), _value), max_size=30))


@needs_kernels
@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 100), writes=st.lists(_write, max_size=8), masses=st.lists(st.floats(0, 1.1), max_size=20))
def test_paired_trees_behave_as_a_plain_array(size, writes, masses):
    s, m = SumTree(size, torch.float64), MinTree(size, torch.float64)
    pair = paired(s, m)
    assert paired(s, m) is pair and pair.ctypes.data % 64 == 0
    assert np.shares_memory(s.nodes, pair) and np.shares_memory(m.nodes, pair) and s.nodes.strides == (16,)
    plain_s, plain_m = SumTree(size, torch.float64), MinTree(size, torch.float64)  # (unpaired: separate arrays)
    model, model_min = np.zeros(s.capacity), np.full(s.capacity, np.inf)  # (unset: 0 and +inf)
    for how, batch in writes:
        if not batch:
            continue
        leaves = np.array([leaf % size for leaf, _ in batch], dtype=np.int64)
        values = np.array([v for _, v in batch], dtype=np.float64)
        if how == "setitem":  # (TorchRL's calls on its trees)
            s[leaves], m[leaves] = values, values
        else:  # (the fused update of the sampler)
            values_t = torch.from_numpy(values)
            done, high, _, _ = kernels.update_trees(pair, torch.from_numpy(leaves), values_t, values_t)
            assert done and high == leaves.max() + 1
            s.written(high)
            m.written(high)
        plain_s[leaves], plain_m[leaves] = values, values
        model[leaves] = model_min[leaves] = values  # (NumPy's fancy assignment: the last duplicate wins, as the trees')
    assert np.array_equal(s.nodes, plain_s.nodes) and np.array_equal(m.nodes, plain_m.nodes)
    assert np.array_equal(s[np.arange(s.capacity)], model) and np.array_equal(m[np.arange(size)], model_min[:size])
    total = model.sum()
    assert s.query(0, size) == total and float(pair[2]) == total
    for left, right in ((0, size), (size // 3, size), (1, max(1, size // 2))):
        assert s.query(left, right) == model[left:right].sum()
        assert m.query(left, right) == model_min[left:right].min(initial=np.inf)
    if total <= 0 or not masses:
        return
    mass = np.array(masses) * total
    cum = np.cumsum(model[:size])
    want = np.where(mass > total, size, np.searchsorted(cum, np.minimum(mass, np.nextafter(total, 0)), side="right"))
    assert np.array_equal(s.scan_lower_bound(mass), want)
    inside = mass[mass <= total]
    if inside.size:
        drawn = kernels.draw_leaves(pair, np.ascontiguousarray(inside), size, size, True)
        assert drawn is not None
        index, weight = drawn
        assert np.array_equal(index.numpy(), want[mass <= total])
        assert np.array_equal(weight.numpy(), model[index.numpy()].astype(np.float32))


def _filled_sampler(cap: int = 3000) -> tuple[PrioritizedSampler, LazyTensorStorage]:
    sampler = PrioritizedSampler(cap, alpha=0.6, beta=0.4)
    storage = LazyTensorStorage(cap)
    storage.set(torch.arange(cap), TensorDict({"x": torch.zeros(cap)}, [cap]))
    sampler.extend(torch.arange(cap))
    g = torch.Generator().manual_seed(7)
    sampler.update_priority(torch.arange(cap), torch.rand(cap, generator=g) * 3)
    return sampler, storage


def _run(sampler: PrioritizedSampler, storage: LazyTensorStorage) -> tuple:
    np.random.seed(35)
    g = torch.Generator().manual_seed(11)
    out = []
    for _ in range(12):
        index, info = sampler.sample(storage, 256)
        out.append((index.tolist(), info["priority_weight"].tolist()))
        sampler.update_priority(index, torch.rand(256, generator=g) * 2)
    max_p = [float(v) for v in sampler._max_priority]  # (dumps/loads: floats, as TorchRL's JSON)
    return out, sampler._sum_tree.nodes.tolist(), sampler._min_tree.nodes.tolist(), max_p


def test_copies_and_checkpoints_hold_their_own_trees_and_draw_as_the_original(tmp_path):
    original, storage = _filled_sampler()
    pair = paired(original._sum_tree, original._min_tree)
    deep = copy.deepcopy(original)
    pickled = pickle.loads(pickle.dumps(original))
    loaded, _ = _filled_sampler()
    loaded.load_state_dict(original.state_dict())  # (TorchRL's: deep copies of each tree)
    restored, _ = _filled_sampler()
    original.dumps(tmp_path / "sampler")
    restored.loads(tmp_path / "sampler")
    copies = (deep, pickled, loaded, restored)
    for other in copies[:3]:  # (each tree an array of its own until its sampler pairs them again)
        assert other._sum_tree.nodes.flags.c_contiguous and other._sum_tree._pair is None
        assert not np.shares_memory(other._sum_tree.nodes, pair)
    want = _run(original, storage)
    for other in copies:
        assert _run(other, storage) == want
        assert paired(other._sum_tree, other._min_tree) is not pair
    before = pair.copy()
    deep._sum_tree[np.arange(10)] = np.zeros(10)  # (a copy's writes stay in the copy)
    assert np.array_equal(before, pair) and paired(original._sum_tree, original._min_tree) is pair


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_new_pair_equals_trees_paired_after_the_fact(size):
    s, m = new_pair(size, torch.float64)
    pair = paired(s, m)
    assert s._pair is pair and m._pair is pair and pair.ctypes.data % 64 == 0 and pair.size == 4 * s.capacity
    assert (s.nodes == 0).all() and (m.nodes == np.inf).all() and (s.size, m.size) == (size, size)
    s2, m2 = SumTree(size, torch.float64), MinTree(size, torch.float64)
    leaves = np.arange(size)[::2]
    for tree in (s, m, s2, m2):
        tree[leaves] = leaves + 0.5
    paired(s2, m2)
    assert np.array_equal(pair, s2._pair) and np.array_equal(s.nodes, s2.nodes) and np.array_equal(m.nodes, m2.nodes)
    with pytest.raises(InvalidArgument):
        new_pair(0)


def test_trees_of_different_capacities_are_not_paired():
    s, m = SumTree(100), MinTree(1000)
    assert paired(s, m) is None and s._pair is None and m._pair is None
