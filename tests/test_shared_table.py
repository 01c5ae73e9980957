"""SharedTable in one process: the Table's behaviour (parametrised in-process vs shared), bad input,
what shared mode refuses (the ``make`` fixture: conftest.py). Processes, crashes and full file
systems: test_shared_processes.py; out of ring mode: test_shared_out_of_ring.py."""

import pickle

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions
from replaystore.shared import (
    LayoutMismatch,
    SharedTable,
    SharedTableExists,
    SharedTableNotFound,
    list_segments,
    remove,
)
from replaystore.shared.header import LAYOUT_VERSION, W_MAGIC, W_VERSION

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}


def test_extend_keys_len_and_get(make):
    t = make(100)
    assert t.extend(transitions(5)).tolist() == [0, 1, 2, 3, 4]
    assert t.extend(transitions(3, 5)).tolist() == [5, 6, 7]
    assert len(t) == 8 and t.keys().tolist() == list(range(8))
    key = t.add({"obs": np.ones(4, np.float32), "action": 2, "reward": 1.5, "id": 8})
    data, found = t.get([key, 999])
    assert found.tolist() == [True, False] and data["id"].tolist() == [8]
    assert key in t and 999 not in t


def test_sample_metadata_and_payload_agree(make):
    t = make(50)
    t.extend(transitions(20), version=4)
    s = t.sample(16, timeout=1)
    assert np.array_equal(s.data["id"], s.keys)
    assert np.all(s.versions == 4) and np.all(s.times_sampled >= 1) and np.all(s.priorities == 1.0)
    np.testing.assert_allclose(s.probabilities, 1 / 20)
    assert t.stats()["samples"] == 16


def test_fifo_eviction_and_oversized_batch(make):
    t = make(10)
    t.extend(transitions(8))
    t.extend(transitions(5, 8))
    assert t.keys().tolist() == list(range(3, 13)) and t.stats()["evictions"] == 3
    keys = t.extend(transitions(13, 13))
    assert keys.tolist() == list(range(13, 26)) and t.keys().tolist() == list(range(16, 26))
    data, _ = t.get(t.keys())
    assert np.array_equal(data["id"], np.arange(16, 26))
    st = t.stats()
    assert (st["inserts"], st["evictions"], st["size"]) == (26, 16, 10)


@pytest.mark.parametrize("sampler", ["Uniform", "Prioritized", "Fifo"])
def test_full_table_replaces_in_place_across_wraps(make, sampler):
    t = make(7, sampler=getattr(rs, sampler)())
    for start in range(0, 60, 3):
        t.extend(transitions(3, start))
        data, found = t.get(t.keys())
        assert found.all() and np.array_equal(data["id"], t.keys())
    s = t.sample(32)
    assert np.array_equal(s.data["id"], s.keys)


def test_priorities_updates_skips_and_last_wins(make):
    t = make(4, sampler=rs.Prioritized(alpha=1.0, beta=0.0))
    old = t.extend(transitions(4), priorities=[1.0, 1.0, 1.0, 1.0])
    new = t.extend(transitions(2, 4), priorities=[3.0, 3.0])
    assert t.update_priorities(old[:2], [100.0, 100.0]) == 0
    assert t.stats()["skipped_updates"] == 2
    assert t.update_priorities([old[2], new[0], old[2]], [5.0, 7.0, 6.0]) == 2
    assert t.info([old[2], new[0]])["priorities"].tolist() == [6.0, 7.0]
    k = t.extend(transitions(1, 6))
    assert t.info(k)["priorities"].tolist() == [7.0]  # the largest priority set so far


@pytest.mark.parametrize("bad", [np.nan, np.inf, -1.0])
def test_invalid_priorities_change_nothing(make, bad):
    t = make(10, sampler=rs.Prioritized())
    keys = t.extend(transitions(3), priorities=[1.0, 2.0, 3.0])
    before = t.stats()
    with pytest.raises(rs.InvalidPriority):
        t.update_priorities(keys, [5.0, bad, 5.0])
    with pytest.raises(rs.InvalidPriority):
        t.extend(transitions(2, 3), priorities=[1.0, bad])
    assert t.info(keys)["priorities"].tolist() == [1.0, 2.0, 3.0] and t.stats() == before


def test_spec_errors_change_nothing(make):
    t = make(10)
    t.extend(transitions(3))
    before = t.stats()
    bad = transitions(2, 3)
    bad["obs"] = bad["obs"].astype(np.float64)
    with pytest.raises(rs.SpecError, match="obs"):
        t.extend(bad)
    with pytest.raises(rs.SpecError, match="missing"):
        t.add({"obs": np.ones(4, np.float32)})
    assert t.stats() == before and t.keys().tolist() == [0, 1, 2]


def test_delete_oldest_clear_and_keys_continue(make):
    t = make(10)
    keys = t.extend(transitions(5))
    assert t.delete([keys[0], keys[0], keys[1], 999]) == 2
    assert t.keys().tolist() == [2, 3, 4] and t.stats()["skipped_deletes"] == 1
    t.clear()
    assert len(t) == 0
    assert t.extend(transitions(2, 5)).tolist() == [5, 6]


def test_fifo_queue_retires_after_max_times_sampled(make):
    t = make(10, sampler=rs.Fifo(), max_times_sampled=2)
    t.extend(transitions(3))
    assert t.sample(1).keys.tolist() == [0]
    s = t.sample(1)
    assert s.keys.tolist() == [0] and s.times_sampled.tolist() == [2]
    assert 0 not in t and len(t) == 2 and t.stats()["retired"] == 1


def test_staleness_of_the_oldest_items(make):
    t = make(10, max_staleness=1)
    t.extend(transitions(2), version=0)
    t.extend(transitions(2, 2), version=1)
    assert t.set_version(2) == 2
    assert t.keys().tolist() == [2, 3]
    keys = t.extend(transitions(2, 4), version=[0, 2])
    assert keys.tolist() == [-1, 4] and t.stats()["dropped_stale"] == 3


def test_rate_limiter_times_out_and_counts(make):
    t = make(10, rate_limiter=rs.SampleToInsertRatio(1.0, 2, 2.0))
    with pytest.raises(rs.Timeout):
        t.sample(1, timeout=0.05)
    t.extend(transitions(2))
    t.sample(2, timeout=1)
    with pytest.raises(rs.Timeout):
        t.sample(3, timeout=0.05)
    st = t.stats()
    assert st["samples"] == 2 and st["sample_blocked_s"] > 0


def test_checkpoint_round_trip(make, tmp_path):
    t = make(8, sampler=rs.Prioritized())
    t.extend(transitions(11), priorities=np.arange(1.0, 12.0))
    t.sample(4)
    t.save(tmp_path / "ckpt")
    u = rs.Table.load(tmp_path / "ckpt")
    assert u.keys().tolist() == t.keys().tolist()
    assert u.info(u.keys())["priorities"].tolist() == t.info(t.keys())["priorities"].tolist()
    assert u.stats()["inserts"] == 11


# -- shared only ---------------------------------------------------------------------------------
def test_two_handles_in_one_process_see_each_other(tmp_path):
    a = SharedTable.create("two", 16, SPEC, sampler=rs.Prioritized(), directory=tmp_path)
    b = SharedTable.attach("two", directory=tmp_path)
    a.extend(transitions(5))
    assert len(b) == 5 and b.keys().tolist() == [0, 1, 2, 3, 4]
    assert b.extend(transitions(2, 5)).tolist() == [5, 6]
    b.update_priorities([6], [9.0])
    assert a.info([6])["priorities"].tolist() == [9.0] and a.stats()["max_priority_seen"] == 9.0
    assert isinstance(b, rs.Table) and "two" in repr(b)
    c = pickle.loads(pickle.dumps(b))  # attaches by name
    assert c.keys().tolist() == list(range(7))
    for t in (c, b):
        t.close()
    with pytest.raises(rs.Closed):
        b.extend(transitions(1))
    assert b.stats()["size"] == 7  # readable after close
    assert (tmp_path / "replaystore-two").exists()  # a is still open
    a.close()
    assert not (tmp_path / "replaystore-two").exists()  # the last one out removed it


def test_bad_names_unknown_tables_and_two_creators(tmp_path):
    with pytest.raises(rs.InvalidArgument, match="name"):
        SharedTable.create("../x", 4, SPEC, directory=tmp_path)
    with pytest.raises(SharedTableNotFound, match="nope"):
        SharedTable.attach("nope", directory=tmp_path)
    t = SharedTable.create("dup", 4, SPEC, directory=tmp_path)
    t.extend(transitions(2))
    with pytest.raises(SharedTableExists, match="dup"):
        SharedTable.create("dup", 4, SPEC, directory=tmp_path)
    assert t.keys().tolist() == [0, 1] and len(list(tmp_path.iterdir())) == 1  # no temporary left
    t.close()


def test_unsupported_options_are_named(tmp_path):
    class Custom(rs.Uniform):
        pass

    with pytest.raises(rs.InvalidArgument, match="Custom"):
        SharedTable.create("u", 4, SPEC, directory=tmp_path, sampler=Custom())
    with pytest.raises(rs.InvalidArgument, match="spec"):
        SharedTable.create("u", 4, None, directory=tmp_path)
    assert list(tmp_path.iterdir()) == []
    t = SharedTable.create("u", 8, SPEC, directory=tmp_path)
    with pytest.raises(rs.InvalidArgument, match="episodes"):
        t.sample_sequences(1, 2)
    t.close()


def test_tampered_header_is_a_layout_mismatch(tmp_path):
    t = SharedTable.create("v", 4, SPEC, directory=tmp_path)
    words = t._segment.words
    words[W_VERSION] = 99
    with pytest.raises(LayoutMismatch, match="version 99"):
        SharedTable.attach("v", directory=tmp_path)
    words[W_VERSION], magic = LAYOUT_VERSION, words[W_MAGIC]
    words[W_MAGIC] = 0
    with pytest.raises(LayoutMismatch, match="magic"):
        SharedTable.attach("v", directory=tmp_path)
    words[W_MAGIC] = magic
    assert SharedTable.attach("v", directory=tmp_path).keys().tolist() == []
    t.close()


def test_list_and_remove_leftovers(tmp_path):
    t = SharedTable.create("kept", 4, SPEC, directory=tmp_path)
    [info] = list_segments(tmp_path)
    assert info["name"] == "kept" and not info["orphaned"] and info["capacity"] == 4
    with pytest.raises(SharedTableExists):
        remove("kept", directory=tmp_path)
    t._segment.close(remove=False)  # as if this process died: nobody holds it
    [info] = list_segments(tmp_path)
    assert info["orphaned"]
    u = SharedTable.attach("kept", directory=tmp_path)  # a leftover can still be attached
    u._unlink_on_close = False
    u.close()
    assert remove("kept", directory=tmp_path) and list_segments(tmp_path) == []
    with pytest.raises(SharedTableNotFound):
        remove("kept", directory=tmp_path)


def test_as_tensor_views(tmp_path):
    torch = pytest.importorskip("torch")
    t = SharedTable.create("tensor", 16, SPEC, directory=tmp_path)
    t.extend(transitions(8))
    s = t.sample(4, as_tensor=True)
    assert isinstance(s.data["obs"], torch.Tensor) and s.data["obs"].shape == (4, 4)
    assert torch.equal(s.data["id"], torch.as_tensor(s.keys))
    t.close()


def test_close_wakes_a_blocked_sampler_with_closed(tmp_path):
    import threading

    t = SharedTable.create("wake", 8, SPEC, directory=tmp_path)
    errors = []

    def blocked():
        try:
            t.sample(1, timeout=30)
        except rs.ReplayError as e:
            errors.append(e)

    th = threading.Thread(target=blocked)
    th.start()
    import time

    time.sleep(0.2)
    t.close()
    th.join(10)
    assert not th.is_alive() and len(errors) == 1 and isinstance(errors[0], rs.Closed)
    assert list(tmp_path.iterdir()) == []


def test_single_adds_of_a_prioritized_table(make):
    t = make(4, sampler=rs.Prioritized(alpha=1.0))
    item = {"obs": np.full(4, 0, np.float32), "action": 0, "reward": 0.0, "id": 0}
    assert t.add(item) == 0
    assert t.add(dict(item, id=1, obs=np.full(4, 1, np.float32), action=1, reward=0.5), priority=3.0) == 1
    with pytest.raises(rs.SpecError):
        t.add(dict(item, action=1.5))  # a float into an int64 field: refused, as in-process
    for i in range(2, 6):
        assert (
            t.add(
                {
                    "obs": np.full(4, i, np.float32),
                    "action": np.int64(i % 3),
                    "reward": np.float32(i / 2),
                    "id": np.int64(i),
                }
            )
            == i
        )
    data, found = t.get(t.keys())
    assert t.keys().tolist() == [2, 3, 4, 5] and (data["obs"][:, 0] == data["id"]).all()
    assert t.info([2])["priorities"].tolist() == [3.0]  # the largest priority set so far


def test_the_scalars_live_in_the_segment_and_a_closed_handle_keeps_a_snapshot(tmp_path):
    """Mutex tables place every part's scalars in the segment (no per-process copy to load)."""
    t = SharedTable.create("live", 32, SPEC, sampler=rs.Prioritized(0.6), directory=tmp_path)
    other = SharedTable.attach("live", tmp_path)
    t.extend(transitions(8))
    # the other handle's objects read the same words: no load on entering the lock
    assert other._state.size == 8 and other._state.ring_hi == 8 and other.rate_limiter.inserts == 8
    assert type(other._state).__name__ == "TableState" and isinstance(other.remover, rs.Fifo)
    other.close()  # a snapshot of the state at the close, its own class back
    t.extend(transitions(4, 8))
    assert other.stats()["inserts"] == 8 and t.stats()["inserts"] == 12
    assert type(other._state) is type(rs.Table(4)._state)
    t.close()


def test_a_scalar_word_refuses_a_value_of_another_kind_and_keeps_its_own():
    from replaystore.shared._sync import Word

    words = np.zeros(4, np.int64)

    class Holder:
        __slots__ = ()
        count = Word(words, 8, "q")
        level = Word(words, 16, "d")

    h = Holder()
    h.count = np.int64(7)
    h.level = 2
    assert (h.count, h.level) == (7, 2.0) and words[1] == 7 and words.view(np.float64)[2] == 2.0
    with pytest.raises(TypeError):
        h.count = 1.5  # an integer scalar takes no float
    with pytest.raises(OverflowError):
        h.count = 2**64
    with pytest.raises(AttributeError):
        del h.count
    assert h.count == 7
    for bad in ((words, 32, "q"), (words, 4, "q"), (words, 0, "f")):
        with pytest.raises(ValueError):
            Word(*bad)
