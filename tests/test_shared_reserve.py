"""Large batches copy their rows without a shared table's lock, into ring slots they reserved.

``SharedTable.extend`` of a batch of at least ``COPY_OUTSIDE_BYTES``: under the lock it evicts the
oldest items whose slots it needs and notes the reservation; it copies without the lock; under the
lock again its items go in at once. Samples, lookups and updates go on meanwhile; other inserts
wait; a copier killed mid-copy costs its batch only; a table that moved on meanwhile (left ring
mode) takes the batch by the general path. The copier pauses in its copy through the test hook
(``replaystore.shared.reserve._HOOK_COPY``: it creates the marker file and waits until it is gone).
"""

import logging
import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest

import replaystore as rs
import replaystore.shared.reserve as shared_reserve
from replaystore.shared import SharedTable
from replaystore.shared.directory import alive
from replaystore.shared.header import W_RESERVED

WIDE = {"id": ((), np.int64), "frame": ((2048,), np.int64)}  # 16 KB rows: 8 of them are a large batch


def rows(first: int, n: int) -> dict:
    ids = np.arange(first, first + n, dtype=np.int64)
    return {"id": ids, "frame": np.repeat(ids[:, None], 2048, axis=1)}


def whole(data) -> bool:
    return bool((data["frame"] == data["id"][:, None]).all())


def _copier(name, directory, first, n, marker, q):
    shared_reserve._HOOK_COPY = marker
    t = SharedTable.attach(name, directory)
    q.put(t.extend(rows(first, n)).tolist())
    t.close()


def start_copier(tmp_path, first=100, n=8):
    marker = str(tmp_path / "copying")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_copier, args=("res", tmp_path, first, n, marker, q), daemon=True)
    p.start()
    deadline = time.monotonic() + 20
    while not os.path.exists(marker):
        assert time.monotonic() < deadline and p.is_alive(), "the copier never reached its copy"
        time.sleep(0.005)
    return p, q, marker


@pytest.fixture(params=["mutex", "flock"])
def full(tmp_path, monkeypatch, request):
    monkeypatch.setattr(SharedTable, "COPY_OUTSIDE_BYTES", 1 << 16)  # (8 rows of 16 KB: 128 KB; forks inherit it)
    t = SharedTable.create("res", 16, WIDE, sampler=rs.Prioritized(1.0), directory=tmp_path, seed=5, lock=request.param)
    assert rows(0, 8)["frame"].nbytes >= t.COPY_OUTSIDE_BYTES
    t.extend(rows(0, 16))
    yield t
    t.close()


def test_samples_go_on_while_a_batch_is_copied_and_other_inserts_wait(tmp_path, full):
    t = full
    p, q, marker = start_copier(tmp_path)
    # the reservation made room: the 8 oldest left before any of their rows was overwritten
    assert t.keys().tolist() == list(range(8, 16)) and len(t) == 8
    assert t.stats()["evictions"] == 8 and t.stats()["inserts"] == 16
    assert t._segment.words[W_RESERVED] == p.pid
    s = t.sample(64, timeout=1)  # no lock held by the copier: samples and updates go on
    assert whole(s.data) and set(s.keys.tolist()) <= set(range(8, 16))
    assert t.update_priorities([9, 3], [2.0, 2.0]) == 1
    done = []
    waiter = threading.Thread(target=lambda: done.append(t.extend(rows(200, 2)).tolist()))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not done  # another insert waits for the reservation
    os.remove(marker)
    assert q.get(timeout=20) == list(range(16, 24))
    waiter.join(20)
    assert done == [[24, 25]]  # after the reserved batch: its keys and slots came first
    p.join(20)
    keys = t.keys()
    assert keys.tolist() == list(range(10, 26))
    data, _ = t.get(keys)
    assert whole(data) and data["id"].tolist() == [*range(10, 16), *range(100, 108), 200, 201]
    st = t.stats()
    assert (st["inserts"], st["evictions"], st["size"], t._segment.words[W_RESERVED]) == (26, 10, 16, 0)
    s = t.sample(200, timeout=1)
    assert whole(s.data) and np.isfinite(s.weights).all()


def test_a_copier_killed_mid_copy_costs_its_batch_only(tmp_path, full, caplog):
    t = full
    p, q, marker = start_copier(tmp_path)
    os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(p.pid):  # (not reaped yet: a zombie counts as dead)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with caplog.at_level(logging.WARNING, logger="replaystore.shared"):
        assert t.extend(rows(300, 2)).tolist() == [16, 17]  # the dead batch's keys were never handed out
    assert "died while it copied" in caplog.text
    p.join(10)
    os.remove(marker)
    keys = t.keys()
    assert keys.tolist() == [*range(8, 18)]
    data, _ = t.get(keys)
    assert whole(data) and data["id"].tolist() == [*range(8, 16), 300, 301]
    s = t.sample(300, timeout=1)
    assert whole(s.data)
    assert set(s.data["id"].tolist()) <= {*range(8, 16), 300, 301}  # nothing of the dead batch
    st = t.stats()
    assert (st["inserts"], st["evictions"], st["size"]) == (18, 8, 10)
    assert t.extend(rows(400, 8)).tolist() == list(range(18, 26))  # the ring goes on
    assert t.keys().tolist() == list(range(10, 26))


@pytest.mark.parametrize("move", ["delete", "clear"])
def test_a_table_that_moved_on_during_the_copy_still_gets_the_batch(tmp_path, full, move):
    t = full
    p, q, marker = start_copier(tmp_path)
    if move == "delete":
        assert t.delete([12]) == 1  # not the oldest: the table leaves ring mode (the general path commits)
        kept = [8, 9, 10, 11, 13, 14, 15]
    else:
        t.clear()
        kept = []
    os.remove(marker)
    assert q.get(timeout=20) == list(range(16, 24))
    p.join(20)
    keys = t.keys()
    assert keys.tolist() == [*kept, *range(16, 24)]
    data, _ = t.get(keys)
    assert whole(data) and data["id"].tolist() == [*kept, *range(100, 108)]
    assert whole(t.sample(100, timeout=1).data)
    assert t.stats()["size"] == len(kept) + 8


def test_a_thread_of_the_same_process_waits_for_the_reservation_too(tmp_path, full, monkeypatch):
    t = full
    marker = str(tmp_path / "copying")
    monkeypatch.setattr(shared_reserve, "_HOOK_COPY", marker)
    out = []
    copier = threading.Thread(target=lambda: out.append(t.extend(rows(100, 8)).tolist()))
    copier.start()
    while not os.path.exists(marker):
        time.sleep(0.005)
    monkeypatch.setattr(shared_reserve, "_HOOK_COPY", "")
    waiter = threading.Thread(target=lambda: out.append(t.extend(rows(200, 1)).tolist()))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # (the reservation is this process's own: it still waits)
    os.remove(marker)
    copier.join(20)
    waiter.join(20)
    assert out == [list(range(16, 24)), [24]]


def test_a_bad_large_batch_changes_nothing(full):
    t = full
    before = (t.keys().tolist(), t.stats())
    bad = rows(100, 8)
    bad["frame"] = bad["frame"].astype(np.int32)
    with pytest.raises(rs.SpecError):
        t.extend(bad)
    short = rows(100, 8)
    short["id"] = short["id"][:7]
    with pytest.raises(rs.SpecError):
        t.extend(short)
    assert (t.keys().tolist(), t.stats()) == before
    assert t._segment.words[W_RESERVED] == 0


def test_a_copier_killed_holding_the_lock_as_it_reserves_is_recovered(tmp_path, full):
    """Killed in the first step (inside the lock, evictions made, not yet published): the next process
    repairs the table (the evicted items stay gone), the next insert drops the dead reservation."""
    from test_shared_processes import _killed_while_paused

    t = full
    _killed_while_paused(
        tmp_path,
        f"""
import numpy as np
from replaystore.shared import SharedTable
SharedTable.COPY_OUTSIDE_BYTES = 1 << 16
t = SharedTable.attach("res", directory={str(tmp_path)!r})
ids = np.arange(100, 108)
t.extend({{"id": ids, "frame": np.repeat(ids[:, None], 2048, axis=1)}})
""",
    )
    t._segment.lock_timeout = 5.0
    keys = t.keys()  # (repaired on entering the lock)
    assert keys.tolist() == list(range(8, 16)) and t.recoveries() == 1
    assert t._segment.words[W_RESERVED] not in (0, os.getpid())  # the dead copier's note, still there
    assert t.extend(rows(300, 2)).tolist() == [16, 17]  # found dead, dropped: the ring goes on
    assert t._segment.words[W_RESERVED] == 0
    keys = t.keys()
    data, _ = t.get(keys)
    assert whole(data) and data["id"].tolist() == [*range(8, 16), 300, 301]
    assert whole(t.sample(100, timeout=1).data)
