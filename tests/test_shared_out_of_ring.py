"""Shared tables out of ring mode: deletes of any key, retirement and stale drops out of order,
clear, every sampler and remover but the heaps, each against an in-process Table (``make``:
conftest.py), and the switch out of ring mode seen from another handle. Processes, distributions
and crashes: test_shared_processes.py; two processes against a model: test_shared_model.py."""

import numpy as np
import pytest

import replaystore as rs
from conftest import SHARED_SPEC, transitions
from replaystore.shared import SharedTable

COMBOS = [
    ("Uniform", "Fifo"),
    ("Prioritized", "Fifo"),
    ("Fifo", "Fifo"),
    ("Lifo", "Fifo"),
    ("WithoutReplacement", "Fifo"),
    ("Uniform", "Lifo"),
    ("Prioritized", "Uniform"),
    ("Fifo", "Lifo"),
    ("MinHeap", "Fifo"),
    ("Uniform", "MinHeap"),
    ("MaxHeap", "MaxHeap"),
    ("Prioritized", "MinHeap"),
]


def _script(t) -> list:
    """One sequence of calls through ring mode and out of it; every result, for comparison."""
    out = []

    def sample(n):
        s = t.sample(n, timeout=1)
        assert np.array_equal(s.data["id"], s.keys)  # payload and metadata agree
        out.append((s.keys.tolist(), np.round(s.probabilities, 12).tolist(), s.times_sampled.tolist()))

    out.append(t.extend(transitions(10), priorities=np.arange(1.0, 11.0), version=0).tolist())
    sample(4)
    out.append(t.delete([3, 7, 3, 99]))  # out of insertion order: the table leaves ring mode
    sample(6)
    out.append(t.extend(transitions(9, 10), version=1).tolist())  # full: the remover evicts
    out.append(t.update_priorities([1, 12, 15, 99], [0.5, 7.0, 0.0, 1.0]))
    sample(8)
    out.append(t.set_version(2))  # max_staleness=1: version 0 goes stale
    out.append(t.extend(transitions(3, 19), version=2).tolist())
    sample(5)
    out.append(t.keys().tolist())
    data, found = t.get(t.keys())
    assert found.all() and np.array_equal(data["id"], t.keys())
    info = t.info(t.keys())
    out.append((info["priorities"].tolist(), info["times_sampled"].tolist(), info["versions"].tolist()))
    stats = t.stats()
    out.append({k: stats[k] for k in ("size", "inserts", "deletes", "evictions", "retired", "dropped_stale")})
    t.clear()
    out.append((len(t), t.extend(transitions(4, 22)).tolist()))
    sample(3)
    out.append(t.keys().tolist())
    return out


@pytest.mark.parametrize(("sampler", "remover"), COMBOS)
def test_same_results_as_an_in_process_table(tmp_path, sampler, remover):
    def build(shared: bool):
        kw = dict(
            sampler=getattr(rs, sampler)(),
            remover=getattr(rs, remover)(),
            max_times_sampled=3,
            max_staleness=1,
            seed=5,
        )
        if shared:
            return SharedTable.create(f"same-{sampler}-{remover}", 16, SHARED_SPEC, directory=tmp_path, **kw)
        return rs.Table(16, spec=SHARED_SPEC, **kw)

    local = _script(build(False))
    t = build(True)
    try:
        assert _script(t) == local  # same calls, same seed: the same items, probabilities and counters
        assert t._ring is None and t._index is t._placed_index  # out of ring mode, on the placed structures
    finally:
        t.close()


def test_delete_any_key_and_sample_only_live_items(make):
    t = make(20, sampler=rs.Prioritized(alpha=1.0))
    t.extend(transitions(12), priorities=np.arange(1.0, 13.0))
    assert t.delete([5, 0, 11, 6, 6, 40]) == 4
    assert t.keys().tolist() == [1, 2, 3, 4, 7, 8, 9, 10] and t.stats()["skipped_deletes"] == 1
    s = t.sample(200)
    assert set(s.keys.tolist()) <= set(t.keys().tolist())
    p = t.info([10])["priorities"][0] / sum(t.info(t.keys())["priorities"])
    np.testing.assert_allclose(s.probabilities[s.keys == 10], p)
    assert t.extend(transitions(3, 12)).tolist() == [12, 13, 14]
    data, _ = t.get(t.keys())
    assert np.array_equal(data["id"], t.keys())


@pytest.mark.parametrize("sampler", ["Uniform", "Prioritized", "Lifo"])
def test_max_times_sampled_retires_out_of_order(make, sampler):
    t = make(10, sampler=getattr(rs, sampler)(), max_times_sampled=1)
    t.extend(transitions(6))
    seen = []
    while len(t):
        seen += t.sample(1).keys.tolist()
    assert sorted(seen) == list(range(6)) and t.stats()["retired"] == 6  # each item exactly once
    if sampler == "Lifo":
        assert seen == [5, 4, 3, 2, 1, 0]
    assert t.extend(transitions(2, 6)).tolist() == [6, 7]


def test_stale_items_out_of_order_are_dropped(make):
    t = make(10, max_staleness=0)
    t.extend(transitions(4), version=[2, 1, 2, 1])
    assert t.set_version(2) == 2 and t.keys().tolist() == [0, 2]
    assert t.stats()["dropped_stale"] == 2
    assert t.extend(transitions(2, 4), version=[1, 2]).tolist() == [-1, 4]


def test_lifo_and_uniform_removers(make):
    t = make(5, remover=rs.Lifo())
    t.extend(transitions(5))
    assert t.extend(transitions(2, 5)).tolist() == [5, 6]
    assert t.keys().tolist() == [0, 1, 2, 5, 6]  # the newest two were evicted
    with pytest.raises(rs.CapacityError):
        t.extend(transitions(6, 7))
    u = make(5, remover=rs.Uniform(), seed=1)
    u.extend(transitions(5))
    u.extend(transitions(3, 5))
    assert len(u) == 5 and u.stats()["evictions"] == 3 and {5, 6, 7} <= set(u.keys().tolist())


def test_the_switch_out_of_ring_mode_is_seen_by_other_handles(tmp_path):
    a = SharedTable.create("switch", 8, SHARED_SPEC, sampler=rs.Prioritized(), directory=tmp_path)
    b = SharedTable.attach("switch", directory=tmp_path)
    try:
        a.extend(transitions(6))
        assert a._ring is not None and b._ring is not None
        b.delete([2])  # b leaves ring mode and fills the placed structures
        assert b._ring is None and a._ring is not None  # a learns of it when it next enters the lock
        assert a.keys().tolist() == [0, 1, 3, 4, 5] and a._ring is None and a._index is a._placed_index
        a.extend(transitions(5, 6))  # full: evicts the oldest (the Fifo remover's log)
        assert b.keys().tolist() == [3, 4, 5, 6, 7, 8, 9, 10] and b.stats()["evictions"] == 2
        c = SharedTable.attach("switch", directory=tmp_path)  # attaches out of ring mode
        assert c.keys().tolist() == b.keys().tolist() and c._ring is None
        s = c.sample(50)
        assert np.array_equal(s.data["id"], s.keys) and set(s.keys.tolist()) <= set(c.keys().tolist())
        c.close()
    finally:
        b.close()
        a.close()


def test_key_index_overflow_across_handles(tmp_path):
    """A Lifo remover keeps the oldest items while newer keys reuse their ring positions."""
    a = SharedTable.create("overflow", 4, SHARED_SPEC, remover=rs.Lifo(), directory=tmp_path)
    b = SharedTable.attach("overflow", directory=tmp_path)
    try:
        a.extend(transitions(4))
        for k in range(4, 40):  # the newest item is replaced, over and over
            (a if k % 2 else b).extend(transitions(1, k))
        assert a.keys().tolist() == [0, 1, 2, 39] and b.keys().tolist() == [0, 1, 2, 39]
        data, found = b.get([0, 1, 2, 39, 38])
        assert found.tolist() == [True] * 4 + [False] and data["id"].tolist() == [0, 1, 2, 39]
        assert a._index.overflow_n >= 1  # keys 0..2 were pushed out of the ring into the overflow
        assert b.delete([1]) == 1 and a.get([1])[1].tolist() == [False]
    finally:
        b.close()
        a.close()


def test_heap_order_across_handles(tmp_path):
    """MinHeap sampler, MaxHeap remover: the order lives in the segment (a tournament tree)."""
    kw = dict(sampler=rs.MinHeap(), remover=rs.MaxHeap(), max_times_sampled=1, directory=tmp_path)
    a = SharedTable.create("heaps", 6, SHARED_SPEC, **kw)
    b = SharedTable.attach("heaps", directory=tmp_path)
    try:
        a.extend(transitions(6), priorities=[5.0, 1.0, 3.0, 1.0, 9.0, 2.0])
        b.extend(transitions(2, 6), priorities=[4.0, 0.5])  # full: evicts the two highest (keys 4, 0)
        assert a.keys().tolist() == [1, 2, 3, 5, 6, 7]
        a.update_priorities([2], [0.1])
        assert b.sample(3).keys.tolist() == [2, 7, 1]  # lowest first, ties oldest first; retired
        assert a.sample(3).keys.tolist() == [3, 5, 6] and len(b) == 0
    finally:
        b.close()
        a.close()
