"""A shared prioritized table with float32 trees (``Prioritized(tree_dtype=np.float32)``): its regions
are float32 (16 B a slot for both trees), another process attaches it, writes and samples from it,
and the sampled distribution follows ``priority ** alpha`` in both processes."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np

import replaystore as rs
from conftest import transitions
from replaystore.shared import SharedTable

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}
# the 0.9999 quantile of chi-square with 15 degrees of freedom (fixed seeds: deterministic)
CHI2_15 = 44.26


def _writer_then_sampler(directory, draws, queue):
    t = SharedTable.attach("f32", directory=directory, seed=1)
    try:
        assert t.sampler.tree_dtype == np.float32
        t.extend(transitions(8, 8), priorities=np.arange(9.0, 17.0) ** 2)  # p ** alpha = 9 .. 16
        counts = np.zeros(16, dtype=np.int64)
        for _ in range(draws // 500):
            s = t.sample(500)
            counts += np.bincount(s.data["id"], minlength=16)
        queue.put(("ok", counts, float(s.probabilities.min())))
    except BaseException as e:  # (reported to the parent, which fails with it)
        queue.put(("error", repr(e), 0.0))
    finally:
        t.close()


def test_float32_prioritized_shared_table_across_processes(tmp_path):
    t = SharedTable.create(
        "f32", 16, SPEC, sampler=rs.Prioritized(alpha=0.5, tree_dtype=np.float32), directory=tmp_path, seed=2
    )
    try:
        regions = t._segment.regions
        assert t.sampler._sum.dtype == np.float32 and t.sampler._min.dtype == np.float32
        for name in ("sampler.prioritized.sum", "sampler.prioritized.min"):
            assert regions[name][1] == (32,) and regions[name][2] == np.float32  # 2 x 16 leaves x 4 B
        t.extend(transitions(8), priorities=np.arange(1.0, 9.0) ** 2)  # p ** alpha = 1 .. 8
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=_writer_then_sampler, args=(str(tmp_path), 20000, q))
        p.start()
        try:
            status, counts, pmin = q.get(timeout=120)
        finally:
            p.join(30)
        assert status == "ok", counts
        expected = 20000 * np.arange(1.0, 17.0) / 136.0
        assert ((counts - expected) ** 2 / expected).sum() < CHI2_15
        # and the parent sees the child's items in its own float32 trees
        counts = np.zeros(16, dtype=np.int64)
        for _ in range(40):
            counts += np.bincount(t.sample(500).data["id"], minlength=16)
        assert ((counts - expected) ** 2 / expected).sum() < CHI2_15
        assert t.sampler.mass()[0] == 136.0 and t.sampler.mass()[1] == 1.0
    finally:
        t.close()
