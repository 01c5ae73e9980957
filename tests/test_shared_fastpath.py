"""A shared table takes the in-process Table's fast paths: a writer's batch is copied once, from
the caller's arrays straight into the shared columns (ring mode, the compiled row copy), and a
sample is gathered once, into arrays the caller owns (not views of the segment)."""

import numpy as np
import pytest

import replaystore as rs
import replaystore.storage.columns as columns_module
import replaystore.table.fast as fast_module
from replaystore.shared import SharedTable
from replaystore.storage import ColumnStorage

FRAMES = {"obs": ((4, 84, 84), np.uint8), "action": ((), np.int64), "next_obs": ((4, 84, 84), np.uint8)}
SMALL = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32)}


def batch(spec, n, first):
    return {
        k: np.ascontiguousarray(
            np.broadcast_to((np.arange(first, first + n) % 200).reshape(-1, *[1] * len(s)), (n, *s)).astype(d)
        )
        for k, (s, d) in spec.items()
    }


def spy(monkeypatch, module, name, calls):
    real = getattr(module, name)

    def wrapper(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(module, name, wrapper)


@pytest.mark.parametrize("spec", [SMALL, FRAMES], ids=["small", "atari"])
@pytest.mark.parametrize("sampler", [rs.Uniform, rs.Prioritized])
def test_one_copy_in_one_copy_out(tmp_path, monkeypatch, spec, sampler):
    t = SharedTable.create("fp", 64, spec, sampler=sampler(), directory=tmp_path)
    other = SharedTable.attach("fp", directory=tmp_path)
    copies, gathers = [], []
    spy(monkeypatch, fast_module, "copy_rows", copies)
    spy(monkeypatch, columns_module, "gather_rows", gathers)

    def no_general_path(*a, **k):
        raise AssertionError("the general insert path (a validated copy of the batch) was taken")

    monkeypatch.setattr(ColumnStorage, "prepare", no_general_path)
    b = batch(spec, 8, 0)
    assert t.extend(b).tolist() == list(range(8))
    [(cols, sources, start, n, batched, *keys_first)] = copies
    if sum(a.nbytes for a in b.values()) >= SharedTable.COPY_OUTSIDE_BYTES:
        assert keys_first == []  # (a large batch: copied without the lock into reserved slots)
    else:
        assert keys_first[0] is t._written_hi and keys_first[1] == 8  # (written_hi first: shared.reads)
    assert all(src is b[k] for k, src in zip(spec, sources))  # the caller's arrays, no copy before
    segment_bytes = np.frombuffer(t._segment.mm, np.uint8)
    assert all(np.shares_memory(c, segment_bytes) for c in cols)  # written straight into the segment
    s = other.sample(5)  # another handle sees the rows: they are in the shared columns
    if type(other._drawer).__name__ == "RingSampler":  # (gathered in the compiled sample: _sync.RingSampler)
        assert gathers == []
        outs = [s.data[k] for k in spec]
    else:
        [(_, _, outs, *_)] = gathers
    for k in spec:
        assert any(s.data[k] is o for o in outs)  # the gathered arrays are the sample's own
        assert not np.shares_memory(s.data[k], segment_bytes)
        assert (s.data[k].reshape(5, -1) == (s.keys % 200)[:, None]).all()
    t.close()
    other.close()


def test_prefault_maps_the_segment_and_changes_no_data(tmp_path):
    t = SharedTable.create("pf", 32, FRAMES, directory=tmp_path)
    b = batch(FRAMES, 5, 0)
    t.extend(b)
    before = t.get(t.keys())[0]
    assert t.prefault() in (True, False)  # False only on kernels before 5.14 (MADV_POPULATE_WRITE)
    after = t.get(t.keys())[0]
    assert all((before[k] == after[k]).all() for k in FRAMES) and (after["obs"][4] == 4).all()
    assert t.extend(batch(FRAMES, 2, 5)).tolist() == [5, 6]
    t.close()
