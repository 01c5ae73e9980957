"""Where DI-engine corrupts data, crashes or is unsafe, the compat layer does the correct thing.

Each test names the original behaviour it guards against (see docs/compat/ding.md).
"""

import os
import pickle
import threading

import numpy as np
import pytest

from replaystore.compat.ding import (
    AdvancedReplayBuffer,
    CompatError,
    NaiveReplayBuffer,
    remove_file,
)


@pytest.fixture(autouse=True)
def _seed():
    np.random.seed(2)


@pytest.fixture
def make():
    made = []

    def factory(cls=AdvancedReplayBuffer, **cfg):
        buf = cls(cfg, instance_name="fix")
        made.append(buf)
        return buf

    yield factory
    for b in made:
        b.close()


def items(n, start=0, **extra):
    return [{"i": i, **extra} for i in range(start, start + n)]


# -- sample_range ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sample_range", "allowed"),
    [
        (slice(None, 10), range(0, 10)),  # DI-engine: start None inverts the interval
        (slice(0, 10), range(0, 10)),  # DI-engine: reduce(0, 0) fails its assertion
        (slice(-10, None), range(54, 64)),
        (slice(-20, -2), range(44, 62)),
        (slice(60, 1000), range(60, 64)),
    ],
)
def test_advanced_sample_range_bounds(make, sample_range, allowed):
    buf = make(replay_buffer_size=64)
    buf.push(items(64), 0)
    for _ in range(10):
        got = {b["replay_buffer_idx"] for b in buf.sample(16, 0, sample_range=sample_range)}
        assert got <= set(allowed)


def test_advanced_sample_range_without_data_returns_none(make):
    buf = make(replay_buffer_size=64)
    buf.push(items(20), 0)
    assert buf.sample(4, 0, sample_range=slice(30, 40)) is None  # only empty slots
    assert buf.sample(4, 0, sample_range=slice(5, 5)) is None
    with pytest.raises(CompatError):
        buf.sample(4, 0, sample_range=slice(0, 10, 2))


def test_naive_sample_range_smaller_than_batch_returns_none(make):
    buf = make(NaiveReplayBuffer, replay_buffer_size=64)
    buf.push(items(64), 0)
    assert buf.sample(5, 0, sample_range=slice(-3, None)) is None  # DI-engine: ValueError from choice
    assert buf.sample(5, 0, sample_range=slice(3, 3)) is None
    assert len(buf.sample(5, 0, sample_range=slice(-3, None), replace=True)) == 5


# -- data contract --------------------------------------------------------------------------------
def test_non_dict_items_raise_and_nothing_is_stored(make):
    buf = make(replay_buffer_size=8)
    good = {"i": 0}
    with pytest.raises(TypeError):
        buf.push([good, [1, 2], {"i": 1}], 0)  # DI-engine silently drops [1, 2]
    assert buf.count() == 0 and buf.push_count == 0
    assert "replay_unique_id" not in good
    with pytest.raises(TypeError):
        make(NaiveReplayBuffer, replay_buffer_size=8).push(None, 0)


def test_invalid_priorities_are_rejected_atomically(make):
    buf = make(replay_buffer_size=8)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(CompatError):
            buf.push([{"i": 0}, {"i": 1, "priority": bad}], 0)
        with pytest.raises(ValueError):  # CompatError is a ValueError too
            buf.push({"priority": bad}, 0)
    assert buf.count() == 0
    buf.push(items(4), 0)
    batch = buf.sample(4, 0)
    with pytest.raises(CompatError):
        buf.update(
            {
                "replay_unique_id": [b["replay_unique_id"] for b in batch],
                "replay_buffer_idx": [b["replay_buffer_idx"] for b in batch],
                "priority": [1.0, 2.0, -1.0, 3.0],
            }
        )
    assert all(d["priority"] == 1.0 for d in buf.state_dict()["data"] if d is not None)  # nothing applied


def test_zero_priority_items_are_never_sampled_and_is_stays_finite(make):
    buf = make(replay_buffer_size=8)
    buf.push(items(4, priority=0.0) + items(4, start=4, priority=2.0), 0)  # DI-engine: ZeroDivisionError
    for _ in range(20):
        batch = buf.sample(4, 0)
        assert all(b["i"] >= 4 for b in batch)
        assert all(np.isfinite(b["IS"]) and b["IS"] == 1.0 for b in batch)
    buf.clear()
    buf.push(items(4, priority=0.0), 0)
    assert buf.sample(2, 0) is None  # nothing sampleable: None, not a crash


def test_push_larger_than_capacity_counts_right(make):
    buf = make(replay_buffer_size=8)
    data = items(20)
    buf.push(data, 0)  # DI-engine counts 20 valid items in a buffer of 8
    assert buf.count() == 8 and buf.push_count == 20
    assert [d["i"] for d in buf.state_dict()["data"]] == [16, 17, 18, 19, 12, 13, 14, 15]
    assert data[0]["replay_unique_id"] == "fix_0" and data[-1]["replay_unique_id"] == "fix_19"


# -- staleness -----------------------------------------------------------------------------------
def test_staleness_removes_every_stale_item_even_out_of_order(make):
    buf = make(replay_buffer_size=8, max_staleness=10)
    buf.push([{"i": 0, "collect_iter": 5}, {"i": 1, "collect_iter": 0}, {"i": 2, "collect_iter": [5, 7]}, {"i": 3}], 0)
    assert {b["staleness"] for b in buf.sample(4, 9, sample_range=slice(1, 2))} == {9}
    assert buf.count() == 4
    batch = buf.sample(3, 10)  # item 1 reached staleness 10; DI-engine's sweep stops at item 0
    assert buf.count() == 3
    assert all(b["i"] != 1 for b in batch)
    assert {(b["i"], b["staleness"]) for b in buf.sample(3, 10, sample_range=slice(0, 4))} <= {(0, 5), (2, 5), (3, -1)}


# -- used data ----------------------------------------------------------------------------------
def test_used_up_items_are_not_revived_by_a_late_update(make, tmp_path):
    buf = make(replay_buffer_size=4, max_use=1, enable_track_used_data=True)
    buf.start()
    files = []
    for i in range(4):
        p = tmp_path / f"d{i}"
        p.write_text("x")
        files.append({"data_id": str(p), "i": i})
    buf.push(files, 0)
    batch = buf.sample(2, 0)
    used = {b["i"] for b in batch}
    assert buf.count() == 4 - len(used)
    buf.update(
        {
            "replay_unique_id": [b["replay_unique_id"] for b in batch],
            "replay_buffer_idx": [b["replay_buffer_idx"] for b in batch],
            "priority": [100.0] * len(batch),
        }
    )  # DI-engine revives them
    assert buf.count() == 4 - len(used)
    for _ in range(10):
        got = buf.sample(1, 0)
        assert got is None or got[0]["i"] not in used
    # a used-up item keeps its file until its slot is overwritten
    assert all(os.path.exists(f["data_id"]) for f in files if f["i"] in used)
    buf.push([{"data_id": str(tmp_path / "new0")}], 0)  # overwrites slot 0 (file d0)
    buf.close()
    assert not os.path.exists(files[0]["data_id"])


def test_remove_file_takes_paths_literally(tmp_path):
    odd = ["a b", "x;touch pwned", "*", "$(touch pwned2)"]
    for name in odd + ["keep"]:
        (tmp_path / name).write_text("x")
    for name in odd:
        assert remove_file(tmp_path / name)
    assert sorted(os.listdir(tmp_path)) == ["keep"]  # no glob, no command ran
    assert not remove_file(tmp_path / "missing")
    d = tmp_path / "tree" / "sub"
    d.mkdir(parents=True)
    (d / "f").write_text("x")
    assert remove_file(tmp_path / "tree") and not (tmp_path / "tree").exists()
    for bad in ("", ".", "..", "/", "a/.."):
        with pytest.raises(CompatError):
            remove_file(bad)


# -- files ----------------------------------------------------------------------------------------
def test_save_of_a_partly_filled_buffer_reloads_only_data(make, tmp_path):
    buf = make(NaiveReplayBuffer, replay_buffer_size=64)
    buf.push(items(10), 0)
    path = tmp_path / "n.pkl"
    buf.save_data(str(path))  # DI-engine dumps 54 empty slots that reload as data
    other = make(NaiveReplayBuffer, replay_buffer_size=64)
    other.load_data(str(path))
    assert other.count() == 10
    assert all(d is not None for d in other.sample(10, 0))
    with open(path, "rb") as f:
        assert [d["i"] for d in pickle.load(f)] == list(range(10))  # oldest first


def test_save_data_is_atomic(make, tmp_path, monkeypatch):
    buf = make(NaiveReplayBuffer, replay_buffer_size=4)
    buf.push(items(2), 0)
    path = tmp_path / "b.pkl"
    buf.save_data(str(path))
    buf.push({"unpicklable": threading.Lock()}, 0)
    with pytest.raises(TypeError):
        buf.save_data(str(path))
    with open(path, "rb") as f:
        assert len(pickle.load(f)) == 2  # the old file is intact
    assert os.listdir(tmp_path) == ["b.pkl"]  # no temporary file left


# -- threads ----------------------------------------------------------------------------------
def test_close_stops_every_thread_and_is_idempotent(make):
    before = set(threading.enumerate())
    buf = make(
        replay_buffer_size=8,
        enable_track_used_data=True,
        thruput_controller=dict(push_sample_rate_limit=dict(max=10, min=0.1)),
    )
    buf.start()
    assert len(set(threading.enumerate()) - before) == 2  # thruput monitor + used-data remover
    buf.close()
    buf.close()
    assert set(threading.enumerate()) - before == set()
    assert buf.closed


def test_tb_logger_is_flushed_not_closed(make):
    class Writer:
        def __init__(self):
            self.flushed = self.closed = 0

        def add_scalar(self, *a):
            pass

        def flush(self):
            self.flushed += 1

        def close(self):
            self.closed += 1

    w = Writer()
    buf = AdvancedReplayBuffer({}, tb_logger=w)
    buf.close()
    assert w.flushed == 1 and w.closed == 0
