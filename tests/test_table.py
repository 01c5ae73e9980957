import threading
import time

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions


def make(capacity=10, **kw):
    kw.setdefault("seed", 0)
    return rs.Table(capacity, **kw)


def test_extend_returns_increasing_unique_keys_and_len():
    t = make(100)
    k1 = t.extend(transitions(5))
    k2 = t.extend(transitions(3, 5))
    assert k1.dtype == np.int64 and k1.tolist() == [0, 1, 2, 3, 4]
    assert k2.tolist() == [5, 6, 7]
    assert len(t) == 8
    assert t.keys().tolist() == list(range(8))


def test_add_single_item_and_get_by_key():
    t = make(10)
    key = t.add({"obs": np.ones(4, np.float32), "action": 2, "reward": 1.5, "id": 7})
    data, found = t.get([key, 999])
    assert found.tolist() == [True, False]
    assert data["id"].tolist() == [7]
    assert data["reward"].dtype == np.float64  # inferred from a Python float
    assert key in t and 999 not in t


def test_sample_returns_complete_metadata():
    t = make(50)
    t.extend(transitions(20), version=4)
    s = t.sample(16, timeout=1)
    assert len(s) == 16
    assert s.data["obs"].shape == (16, 4)
    # each row's payload belongs to its key (keys were assigned in id order)
    assert np.array_equal(s.data["id"], s.keys)
    assert np.all(s.versions == 4)
    assert np.all(s.weights == 1.0)
    np.testing.assert_allclose(s.probabilities, 1 / 20)
    assert np.all(s.times_sampled >= 1)
    assert np.all(s.priorities == 1.0)


def test_fifo_eviction_when_full():
    t = make(10)
    t.extend(transitions(8))
    t.extend(transitions(5, 8))
    assert len(t) == 10
    assert t.keys().tolist() == list(range(3, 13))
    assert t.stats()["evictions"] == 3
    data, found = t.get(t.keys())
    assert np.array_equal(data["id"], np.arange(3, 13))


@pytest.mark.parametrize("remover", [rs.Lifo, rs.MinHeap, rs.MaxHeap, rs.Uniform])
def test_batch_larger_than_capacity_raises_and_changes_nothing(remover):
    t = make(4, remover=remover())
    t.extend(transitions(2))
    before = t.stats()
    with pytest.raises(rs.CapacityError, match="capacity") as e:
        t.extend(transitions(5))
    assert isinstance(e.value, ValueError) and isinstance(e.value, rs.ReplayError)
    assert t.keys().tolist() == [0, 1]
    assert t.stats() == before


def test_fifo_batch_larger_than_capacity_keeps_the_newest_items():
    t = make(4, rate_limiter=rs.MinSize(1))
    t.extend(transitions(2))
    keys = t.extend(transitions(7, 2))
    assert keys.tolist() == list(range(2, 9))  # every item gets a key; keys stay consecutive
    assert t.keys().tolist() == [5, 6, 7, 8]
    data, found = t.get(keys)
    assert found.tolist() == [False] * 3 + [True] * 4
    assert data["id"].tolist() == [5, 6, 7, 8]
    st = t.stats()
    assert (st["inserts"], st["evictions"], st["deletes"], st["size"]) == (9, 5, 5, 4)
    assert t.rate_limiter.inserts - t.rate_limiter.deletes == 4
    assert t.extend(transitions(1, 9)).tolist() == [9]
    assert t.keys().tolist() == [6, 7, 8, 9]


def test_update_priorities_skips_evicted_keys_and_never_touches_reused_slot():
    t = make(4, sampler=rs.Prioritized(alpha=1.0, beta=0.0))
    old = t.extend(transitions(4), priorities=[1.0, 1.0, 1.0, 1.0])
    new = t.extend(transitions(2, 4), priorities=[3.0, 3.0])  # reuses the slots of keys 0 and 1
    applied = t.update_priorities(old[:2], [100.0, 100.0])
    assert applied == 0
    assert t.stats()["skipped_updates"] == 2
    assert t.info(new)["priorities"].tolist() == [3.0, 3.0]
    assert t.update_priorities([old[2], new[0]], [5.0, 7.0]) == 2
    assert t.info([old[2], new[0]])["priorities"].tolist() == [5.0, 7.0]


def test_update_priorities_duplicate_keys_last_wins():
    t = make(10, sampler=rs.Prioritized())
    keys = t.extend(transitions(3))
    n = t.update_priorities([keys[0], keys[1], keys[0], keys[0]], [1.0, 2.0, 3.0, 4.0])
    assert n == 2
    assert t.info(keys[:2])["priorities"].tolist() == [4.0, 2.0]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, -1.0])
def test_invalid_priorities_raise_before_any_change(bad):
    t = make(10, sampler=rs.Prioritized())
    keys = t.extend(transitions(3), priorities=[1.0, 2.0, 3.0])
    before = t.stats()
    with pytest.raises(rs.InvalidPriority):
        t.update_priorities(keys, [5.0, bad, 5.0])
    with pytest.raises(rs.InvalidPriority):
        t.extend(transitions(2, 3), priorities=[1.0, bad])
    assert t.info(keys)["priorities"].tolist() == [1.0, 2.0, 3.0]
    assert t.stats() == before


def test_negative_priorities_allowed_for_heaps_only():
    t = make(10, sampler=rs.MaxHeap(), remover=rs.MinHeap())
    t.extend(transitions(3), priorities=[-3.0, -1.0, -2.0])
    assert t.sample(1).keys.tolist() == [1]


def test_new_items_get_max_priority_seen_so_far():
    t = make(10, sampler=rs.Prioritized())
    keys = t.extend(transitions(2))
    assert t.info(keys)["priorities"].tolist() == [1.0, 1.0]
    t.update_priorities(keys[:1], [7.5])
    t.update_priorities(keys[:1], [0.5])
    k = t.extend(transitions(1, 2))
    assert t.info(k)["priorities"].tolist() == [7.5]
    k = t.extend(transitions(1, 3), priorities=[9.0])
    assert t.extend(transitions(1, 4)).tolist() == [4]
    assert t.info([4])["priorities"].tolist() == [9.0]


def test_delete_counts_and_skips_unknown():
    t = make(10)
    keys = t.extend(transitions(5))
    assert t.delete([keys[0], keys[0], keys[3], 999]) == 2
    assert t.keys().tolist() == [1, 2, 4]
    assert t.delete([keys[0]]) == 0
    assert t.stats()["skipped_deletes"] == 2
    # freed slots are reused and the new keys keep increasing
    assert t.extend(transitions(2, 5)).tolist() == [5, 6]


def test_max_times_sampled_retires_items():
    t = make(10, sampler=rs.Fifo(), max_times_sampled=2)
    t.extend(transitions(3))
    assert t.sample(1).keys.tolist() == [0]
    s = t.sample(1)
    assert s.keys.tolist() == [0] and s.times_sampled.tolist() == [2]
    assert 0 not in t and len(t) == 2
    assert t.stats()["retired"] == 1


def test_staleness_drops_old_items_and_refuses_stale_inserts():
    t = make(20, max_staleness=2)
    t.extend(transitions(3), version=0)
    t.extend(transitions(3, 3), version=1)
    t.extend(transitions(3, 6), version=3)
    assert t.set_version(3) == 3  # version 0 < 3 - 2
    assert len(t) == 6
    keys = t.extend(transitions(2, 9), version=[0, 3])
    assert keys[0] == -1 and keys[1] >= 0
    assert t.stats()["dropped_stale"] == 4
    for _ in range(20):
        assert np.all(t.sample(8).versions >= 1)
    t.set_version(10)
    assert len(t) == 0


def test_staleness_histogram_and_stats_fields():
    t = make(20, sampler=rs.Prioritized())
    t.extend(transitions(4), version=0, priorities=[1, 2, 3, 4])
    t.extend(transitions(2, 4), version=2, priorities=[5, 6])
    t.set_version(2)
    t.sample(5)
    st = t.stats()
    assert st["staleness_histogram"] == {"0": 2, "2": 4}
    assert st["size"] == 6 and st["inserts"] == 6 and st["samples"] == 5 and st["sample_calls"] == 1
    assert st["priority_min"] == 1 and st["priority_max"] == 6 and st["priority_mean"] == 3.5
    assert st["times_sampled_max"] >= 1 and st["times_sampled_mean"] == pytest.approx(5 / 6)
    for key in ("deletes", "evictions", "insert_blocked_s", "sample_blocked_s", "sample_to_insert_ratio"):
        assert key in st


def test_spec_errors_name_field_expected_and_got():
    t = make(10)
    t.extend(transitions(2))
    bad = transitions(2)
    bad["obs"] = bad["obs"].astype(np.float64)
    with pytest.raises(rs.SpecError, match=r"'obs'.*float32.*float64"):
        t.extend(bad)
    bad = transitions(2)
    bad["obs"] = np.zeros((2, 5), np.float32)
    with pytest.raises(rs.SpecError, match=r"'obs'.*\(4,\).*\(5,\)"):
        t.extend(bad)
    bad = transitions(2)
    del bad["reward"]
    with pytest.raises(rs.SpecError, match="missing.*reward"):
        t.extend(bad)
    bad = transitions(2)
    bad["id"] = np.arange(3)
    with pytest.raises(rs.SpecError, match="batch size"):
        t.extend(bad)
    with pytest.raises(rs.SpecError, match="dict"):
        t.extend([1, 2])
    assert len(t) == 2 and t.stats()["inserts"] == 2


def test_python_scalars_cast_into_spec():
    t = make(10, spec={"obs": ((2,), np.float32), "reward": np.float32, "done": bool})
    t.add({"obs": [1.0, 2.0], "reward": 1.0, "done": True})
    data, _ = t.get([0])
    assert data["obs"].dtype == np.float32 and data["reward"].dtype == np.float32
    with pytest.raises(rs.SpecError):
        t.add({"obs": np.zeros(2), "reward": 1.0, "done": True})  # float64 array: strict


def test_nested_dicts_round_trip():
    t = make(10)
    t.extend({"obs": {"image": np.zeros((3, 2, 2), np.uint8), "state": np.ones((3, 5))}, "r": np.ones(3)})
    s = t.sample(4)
    assert s.data["obs"]["image"].shape == (4, 2, 2) and s.data["obs"]["state"].shape == (4, 5)


def test_object_storage_holds_arbitrary_items():
    t = make(3, storage="objects")
    t.extend([{"a": 1}, "two", (3,)])
    t.add([4, 4])
    assert len(t) == 3
    data, _ = t.get(t.keys())
    assert data == ["two", (3,), [4, 4]]
    assert isinstance(t.sample(2).data, list)


def test_sample_batch_size_validation_and_timeout_on_empty():
    t = make(10)
    with pytest.raises(ValueError):
        t.sample(0)
    start = time.monotonic()
    with pytest.raises(rs.Timeout, match="sample"):
        t.sample(1, timeout=0.2)
    assert time.monotonic() - start >= 0.2
    assert t.stats()["sample_blocked_s"] >= 0.2


def test_close_wakes_blocked_sampler_and_is_idempotent():
    t = make(10)
    errors = []

    def sampler():
        try:
            t.sample(1, timeout=10)
        except rs.Closed as e:
            errors.append(e)

    th = threading.Thread(target=sampler)
    th.start()
    time.sleep(0.1)
    t.close()
    t.close()
    th.join(5)
    assert not th.is_alive() and len(errors) == 1
    with pytest.raises(rs.Closed):
        t.extend(transitions(1))


def test_queue_refuses_batches_that_could_never_proceed():
    t = rs.Table.queue(4)
    t.extend(transitions(4))
    with pytest.raises(ValueError, match="never"):
        t.sample(5)
    big = rs.Table(10, rate_limiter=rs.Queue(4))
    with pytest.raises(ValueError, match="never"):
        big.extend(transitions(5))
    assert len(big) == 0


def test_clear_empties_and_keys_continue():
    t = make(10)
    t.extend(transitions(4))
    t.clear()
    assert len(t) == 0 and t.keys().tolist() == []
    assert t.extend(transitions(1)).tolist() == [4]


def test_remover_must_support_eviction():
    with pytest.raises(ValueError, match="remover"):
        rs.Table(10, remover=rs.Prioritized())


def test_minheap_remover_keeps_top_priorities():
    t = make(3, sampler=rs.Uniform(), remover=rs.MinHeap())
    t.extend(transitions(3), priorities=[5.0, 1.0, 3.0])
    t.extend(transitions(2, 3), priorities=[4.0, 0.5])
    # evicted the two lowest at the time of insert: 1.0, then 3.0 (0.5 entered after eviction)
    assert sorted(t.info(t.keys())["priorities"].tolist()) == [0.5, 4.0, 5.0]


# -- single-item adds are staged and flushed in batches: invisible except in speed ---------------
def one(i):
    return {"obs": np.full(4, i, np.float32), "action": np.int64(i % 3), "reward": np.float32(i), "id": np.int64(i)}


def test_staged_adds_are_visible_to_every_operation():
    t = make(1000, sampler=rs.Fifo())
    t.add(one(0))  # first add goes the general way and creates the spec
    keys = [t.add(one(i)) for i in range(1, 10)]
    assert keys == list(range(1, 10))
    assert len(t) == 10 and 5 in t
    assert t.keys().tolist() == list(range(10))
    data, found = t.get([3, 7])
    assert found.all() and data["id"].tolist() == [3, 7]
    assert t.sample(3).keys.tolist() == [0, 1, 2]
    # interleaving with extend keeps key order and payloads consistent
    k = t.add(one(10))
    ek = t.extend(transitions(2, 11))
    assert k == 10 and ek.tolist() == [11, 12]
    data, _ = t.get(t.keys())
    assert np.array_equal(data["id"], t.keys())


def test_staged_add_respects_eviction_priorities_and_versions():
    t = make(5, sampler=rs.Prioritized(), remover=rs.Fifo())
    t.add(one(0), priority=1.0)
    t.add(one(1), priority=8.0)
    t.add(one(2))  # default: the largest priority seen so far, including staged ones
    t.add(one(3), version=7)
    for i in range(4, 9):
        t.add(one(i))
    assert t.keys().tolist() == [4, 5, 6, 7, 8]
    info = t.info([2, 4])
    assert info["found"].tolist() == [False, True] and info["priorities"].tolist() == [8.0]
    assert t.stats()["evictions"] == 4
    t2 = make(10)
    t2.add(one(0))
    t2.add(one(1), version=7)
    assert t2.info([1])["versions"].tolist() == [7]


def test_staged_add_rejects_bad_items_atomically():
    t = make(10)
    t.add(one(0))
    t.add(one(1))
    bad = one(2)
    bad["obs"] = np.zeros(4, np.float64)
    with pytest.raises(rs.SpecError, match="obs"):
        t.add(bad)
    with pytest.raises(rs.InvalidPriority):
        t.add(one(2), priority=float("nan"))
    with pytest.raises(rs.SpecError, match="unexpected"):
        t.add({**one(2), "extra": 1})
    assert t.keys().tolist() == [0, 1] and t.stats()["inserts"] == 2
    assert t.add(one(2)) == 2


def test_staged_add_blocks_on_rate_limiter_like_the_general_path():
    t = rs.Table(10, sampler=rs.Fifo(), rate_limiter=rs.Queue(3), max_times_sampled=1)
    for i in range(3):
        t.add(one(i))
    with pytest.raises(rs.Timeout):
        t.add(one(3), timeout=0.1)
    assert t.sample(1).keys.tolist() == [0]
    assert t.add(one(3), timeout=1) == 3
    assert len(t) == 3


def test_staged_adds_survive_checkpoint_and_close(tmp_path):
    t = make(100)
    for i in range(5):
        t.add(one(i))
    t.save(tmp_path / "ck")
    assert len(rs.Table.load(tmp_path / "ck")) == 5
    t.add(one(5))
    t.close()
    assert len(t) == 6 and t.stats()["inserts"] == 6


@pytest.mark.parametrize("sampler", ["Uniform", "Prioritized", "Fifo"])
def test_full_table_replaces_in_place_across_key_ring_wraps(sampler):
    """Batches into a full FIFO table reuse the victims' slots in place (no remove + insert);
    keys must stay resolvable long after the key ring (2 x capacity, rounded up) has wrapped,
    also when deletes leave holes that later batches fill only partly."""
    cap = 8
    t = rs.Table(cap, sampler=getattr(rs, sampler)(), seed=0)
    live: dict[int, float] = {}
    rng = np.random.default_rng(1)
    for step in range(200):
        n = int(rng.integers(1, cap + 1))
        values = rng.random(n).astype(np.float32)
        keys = t.extend({"x": values}, priorities=rng.random(n) + 0.1)
        live.update(zip(keys.tolist(), values.tolist()))
        oldest = sorted(live)[: max(0, len(live) - cap)]  # Fifo evicts the oldest
        for k in oldest:
            del live[k]
        if step % 7 == 0 and live:
            gone = int(rng.choice(sorted(live)))
            assert t.delete([gone]) == 1
            del live[gone]
        assert len(t) == len(live)
        assert t.keys().tolist() == sorted(live)
        data, found = t.get(np.array(sorted(live) + [min(live, default=0) - 1]))
        assert found.tolist() == [True] * len(live) + [False]
        np.testing.assert_array_equal(data["x"], np.array([live[k] for k in sorted(live)], np.float32))
    s = t.sample(64)
    assert set(s.keys.tolist()) <= set(live)
    assert t.stats()["inserts"] - t.stats()["deletes"] == len(live)


def test_in_place_replacement_keeps_old_survivors_findable():
    """An old item that outlives many inserted-and-deleted keys shares a key-ring position with
    a later key; replacing the oldest items in place must not lose it."""
    t = rs.Table(4, seed=0)  # key ring of 8 positions
    t.extend({"x": np.array([0.0, 1.0, 2.0])})  # keys 0, 1, 2
    for _ in range(93):  # keys 3..95 come and go
        t.delete(t.extend({"x": np.array([9.0])}))
    t.extend({"x": np.array([96.0])})  # full: keys 0, 1, 2, 96
    keys = t.extend({"x": np.array([97.0, 98.0])})  # evicts 0 and 1; key 98 = 2 (mod 8)
    assert keys.tolist() == [97, 98]
    data, found = t.get(np.array([2, 96, 97, 98, 0, 1]))
    assert found.tolist() == [True] * 4 + [False] * 2
    assert data["x"].tolist() == [2.0, 96.0, 97.0, 98.0]
