"""Samples of a shared table copy their rows outside the lock; the slots' keys catch rows written meanwhile."""

import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest
from test_shared_processes import run_python

import replaystore as rs
from conftest import transitions
from replaystore.shared import SharedTable, set_spin
from replaystore.shared import reads as shared_reads
from replaystore.shared.header import W_ACQUIRED, W_BUSY, W_UNORDERED, W_WRITTEN_HI

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}
WIDE = {"id": ((), np.int64), "frame": ((2048,), np.int64)}  # 16 KB rows: a copy long enough to tear

pytestmark = pytest.mark.skipif(shared_reads.keys_settled is None, reason="replaystore.shared._sync not built")


def whole(sample) -> bool:
    """Every row carries its own key in every field (rows were written with id == key)."""
    ids = sample.data["id"]
    return bool(
        (ids == sample.keys).all()
        and (sample.data["obs"] == ids[:, None]).all()
        and (sample.data["reward"] == ids * 0.5).all()
    )


def test_which_tables_copy_outside_the_lock(tmp_path):
    plain = SharedTable.create("plain", 16, SPEC, directory=tmp_path)
    flock = SharedTable.create("flock", 16, SPEC, directory=tmp_path, lock="flock")
    retiring = SharedTable.create("retiring", 16, SPEC, directory=tmp_path, max_times_sampled=2)
    frames = SharedTable.create(
        "frames",
        16,
        {"obs": ((4, 8, 8), np.uint8), "next_obs": ((4, 8, 8), np.uint8), "done": ((), np.bool_)},
        directory=tmp_path,
        storage=rs.FrameStackStorage(16),
    )
    assert plain.read_outside_lock()
    assert not flock.read_outside_lock()  # (a process without the compiled module may write to it)
    assert not retiring.read_outside_lock()  # a retired item's slot may be taken during the copy
    assert not frames.read_outside_lock()  # frames are shared between slots
    for t in (plain, flock, retiring, frames):
        t.close()


@pytest.mark.parametrize("sampler", [rs.Uniform(), rs.Prioritized(0.6, 0.4)], ids=["uniform", "prioritized"])
def test_rows_written_during_the_copy_are_drawn_again_and_counted_once(tmp_path, sampler):
    """A writer (another handle, as another process would) overwrites every slot during the copy."""
    t = SharedTable.create("torn", 8, SPEC, sampler=sampler, directory=tmp_path, seed=1)
    other = SharedTable.attach("torn", tmp_path)
    t.extend(transitions(8))
    read = t.storage.read
    calls = []

    def read_while_a_writer_evicts(slots):
        if not calls:  # the first read is the copy outside the lock: evict everything first
            other.extend(transitions(8, 8))
        calls.append(len(slots))
        return read(slots)

    t.storage.read = read_while_a_writer_evicts
    s = t.sample(256)
    del t.storage.read
    assert len(calls) == 2  # the copy, then the sample finished under the lock
    assert whole(s) and (s.keys >= 8).all()  # only the items alive after the eviction
    assert (s.probabilities > 0).all() and np.isfinite(s.weights).all()
    st = t.stats()
    assert st["samples"] == 256 and st["sample_calls"] == 1
    assert t.info(np.unique(s.keys))["times_sampled"].sum() == 256  # the redraws counted, the evicted items gone
    other.close()
    t.close()


def test_a_copy_no_writer_touched_is_not_redone(tmp_path):
    t = SharedTable.create("quiet", 64, SPEC, directory=tmp_path, seed=2)
    other = SharedTable.attach("quiet", tmp_path)
    t.extend(transitions(32))
    read = t.storage.read
    calls = []

    def read_while_a_writer_fills_free_slots(slots):
        if not calls:
            other.extend(transitions(8, 32))  # free slots only: no drawn row is touched
        calls.append(1)
        return read(slots)

    t.storage.read = read_while_a_writer_fills_free_slots
    s = t.sample(128)
    del t.storage.read
    assert len(calls) == 1 and whole(s) and (s.keys < 32).all()
    other.close()
    t.close()


def test_an_item_deleted_during_the_copy_is_drawn_again(tmp_path):
    """A delete frees the slot and leaves its payload: the key moved, so the position is redrawn."""
    t = SharedTable.create("deleted", 16, SPEC, directory=tmp_path, seed=4)
    other = SharedTable.attach("deleted", tmp_path)
    t.extend(transitions(16))
    read = t.storage.read
    calls = []

    def read_while_half_is_deleted(slots):
        if not calls:
            other.delete(np.arange(8))
        calls.append(len(slots))
        return read(slots)

    t.storage.read = read_while_half_is_deleted
    s = t.sample(200)
    del t.storage.read
    assert len(calls) == 2 and 0 < calls[1] < 200  # only the deleted items' positions again
    assert whole(s) and (s.keys >= 8).all()
    assert t.stats()["samples"] == 200 and t.info(np.unique(s.keys))["times_sampled"].sum() == 200
    other.close()
    t.close()


def test_a_writer_killed_holding_the_lock_after_the_copy_is_recovered_then_the_sample_finishes(tmp_path):
    """The copy ends while another process holds the lock (busy word set) mid-insert; it dies there.

    The sample cannot vouch for its copy while a section is open: it finishes under the lock, which
    it gets once the kernel has released the dead writer's mutex; the table is repaired first (the
    dead writer's rows dropped) and the positions it overwrote are drawn again.
    """
    t = SharedTable.create("dying", 32, SPEC, directory=tmp_path, seed=5, lock_timeout=30)
    t.extend(transitions(32))
    marker = tmp_path / "paused"
    read = t.storage.read
    calls, procs = [], []

    def read_while_a_writer_dies_in_the_lock(slots):
        if not calls:
            proc = run_python(
                f"""
import numpy as np
from replaystore.shared import SharedTable
t = SharedTable.attach("dying", directory={str(tmp_path)!r})
t.extend({{"obs": np.full((8, 4), -7, np.float32), "action": np.zeros(8, np.int64),
          "reward": np.ones(8, np.float32), "id": np.full(8, -1)}})
""",
                env={"REPLAYSTORE_SHM_TEST_HOOK": f"pause-before-publish:{marker}"},
                wait=False,
            )
            procs.append(proc)
            deadline = time.monotonic() + 60
            while not marker.exists():  # it has overwritten the 8 oldest rows and holds the lock
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert t._segment.words[W_BUSY] == proc.pid
            threading.Timer(0.3, os.kill, (proc.pid, signal.SIGKILL)).start()
        calls.append(len(slots))
        return read(slots)

    t.storage.read = read_while_a_writer_dies_in_the_lock
    s = t.sample(64, timeout=30)
    del t.storage.read
    procs[0].wait(10)
    assert calls[0] == 64 and len(calls) == 2  # the copy, then the positions of the dropped items
    assert whole(s) and (s.keys >= 8).all() and t.recoveries() == 1 and len(t) == 24
    assert t.stats()["samples"] == 64 and t.stats()["sample_calls"] == 1
    t.close()


def test_keys_settled_refuses_buffers_that_do_not_fit():
    words = np.zeros(W_WRITTEN_HI + 1, np.int64)
    column = np.full(8, -1, np.int64)  # (the key column: read only out of ring mode)
    rows = np.zeros((2, 4), np.int64)
    rows[:, 0] = [9, 10]  # the drawn keys, in slots 1 and 2 of a ring of 8
    slots = np.array([1, 2])
    w = (W_BUSY, W_ACQUIRED, W_UNORDERED, W_WRITTEN_HI)

    def settled(*args):
        return shared_reads.keys_settled(*args[:1], *w, *args[1:])

    words[W_WRITTEN_HI] = 17  # ring mode: keys 9.. are whole (key 17 would take key 9's slot)
    assert settled(words, column, slots, rows)
    words[W_BUSY] = 7  # a critical section is open: it raised written_hi first, nothing to wait for
    assert settled(words, column, slots, rows)
    words[W_UNORDERED] = 1  # ... it writes rows before their keys, and stays open past the spin
    assert not settled(words, column, slots, rows)
    words[W_BUSY] = words[W_UNORDERED] = 0
    words[W_WRITTEN_HI] = 18  # a write began key 17: key 9's slot may be torn
    assert not settled(words, column, slots, rows)
    words[W_WRITTEN_HI] = -1  # out of ring mode: the key column tells
    assert not settled(words, column, slots, rows)
    column[[1, 2]] = [9, 10]
    assert settled(words, column, slots, rows)
    column[2] = 5  # a key moved
    assert not settled(words, column, slots, rows)
    for bad in (
        (words, column, np.array([1, 8]), rows),  # a slot out of range
        (words, column, slots, np.zeros((3, 4), np.int64)),  # rows of another length
        (words, np.zeros((8, 2), np.int64), slots, rows),  # not a key column
    ):
        with pytest.raises(ValueError, match="keys_settled"):
            settled(*bad)
    with pytest.raises(ValueError, match="keys_settled"):  # no such word
        shared_reads.keys_settled(words, W_WRITTEN_HI + 1, W_ACQUIRED, W_UNORDERED, W_WRITTEN_HI, column, slots, rows)


def test_a_copy_that_ends_inside_a_short_section_waits_for_it_instead_of_the_lock(tmp_path):
    """Another process holds the lock for a moment when the copy ends: the check spins it out."""
    t = SharedTable.create("short", 64, SPEC, directory=tmp_path, seed=6)
    t.extend(transitions(64))
    words = t._segment.words
    read = t.storage.read
    calls = []

    def read_ending_in_a_section(slots):
        if not calls:  # (as a general insert's section would: busy and unordered set, cleared 2 ms later)
            words[W_BUSY] = 12345
            words[W_UNORDERED] = 1
            threading.Timer(0.002, lambda: (words.__setitem__(W_UNORDERED, 0), words.__setitem__(W_BUSY, 0))).start()
        calls.append(len(slots))
        return read(slots)

    previous = set_spin(5_000_000)  # 5 s: far longer than the section, even on a loaded machine
    try:
        t.storage.read = read_ending_in_a_section
        s = t.sample(32)
    finally:
        set_spin(previous)
        del t.storage.read
    assert calls == [32] and whole(s)  # kept: no second read
    t.close()


def test_a_table_cleared_during_the_copy_waits_for_items_then_times_out(tmp_path):
    t = SharedTable.create("cleared", 8, SPEC, directory=tmp_path)
    other = SharedTable.attach("cleared", tmp_path)
    t.extend(transitions(8))
    read = t.storage.read

    def read_while_cleared(slots):
        other.clear()
        other.delete(other.extend(transitions(8, 100)))  # every slot rewritten, then deleted
        return read(slots)

    t.storage.read = read_while_cleared
    with pytest.raises(rs.Timeout):
        t.sample(4, timeout=0.2)
    del t.storage.read
    other.close()
    t.close()


def _write_wide(name, directory, writer, seconds, q, path):
    t = SharedTable.attach(name, directory)
    priorities = np.ones(4) if path == "keys-after" else None  # (given priorities take the general insert path)
    # a batch of 64 KB: copied without the lock into reserved slots, or (keys-first) under it
    t.COPY_OUTSIDE_BYTES = 0 if path == "reserved" else 1 << 30
    stop, counter = time.time() + seconds, 0
    keys, ids = [], []
    row = np.empty((4, 2048), np.int64)
    while time.time() < stop:
        batch = (writer + 1) * 10**9 + np.arange(counter, counter + 4)
        row[:] = batch[:, None]
        keys.append(t.extend({"id": batch, "frame": row}, priorities=priorities))
        ids.append(batch)
        counter += 4
    q.put((np.concatenate(keys), np.concatenate(ids)))
    t.close()


@pytest.mark.parametrize("path", ["keys-first", "keys-after", "reserved"])
def test_no_torn_or_foreign_row_while_writers_evict_under_the_copy(tmp_path, path):
    """Two writers keep evicting from a tiny table of 16 KB rows while this process samples.

    ``keys-first``: the ring's fast path (new keys, then the rows); ``keys-after``: the general
    insert (rows, then keys: its section is marked, and the sample waits for its end);
    ``reserved``: the ring's fast path with the rows copied outside the lock (the evicted keys
    leave first, the new ones come after the copy).
    """
    t = SharedTable.create("wide", 64, WIDE, directory=tmp_path, seed=3)
    first = np.arange(64)
    t.extend({"id": first, "frame": np.repeat(first[:, None], 2048, axis=1)})
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_write_wide, args=("wide", tmp_path, w, 1.5, q, path), daemon=True) for w in range(2)]
    for p in procs:
        p.start()
    seen_keys, seen_ids = [], []
    deadline = time.time() + 1.5
    while time.time() < deadline:
        s = t.sample(32, timeout=5)
        frame = s.data["frame"]
        assert (frame == s.data["id"][:, None]).all(), "a torn row"
        seen_keys.append(s.keys)
        seen_ids.append(s.data["id"])
    written = [q.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    id_of = dict(zip(first.tolist(), first.tolist()))
    for keys, ids in written:
        assert len(keys) > 50
        id_of.update(zip(keys.tolist(), ids.tolist()))
    keys, ids = np.concatenate(seen_keys), np.concatenate(seen_ids)
    assert len(seen_keys) > 50
    assert [id_of[k] for k in keys.tolist()] == ids.tolist(), "a row of another item"
    assert t.stats()["samples"] == 32 * len(seen_keys)
    t.close()


@pytest.mark.skipif(shared_reads.keys_settled is None, reason="_sync not built")
def test_set_spin_refuses_a_negative_budget_and_returns_the_previous_one():
    from replaystore.shared import _sync, set_spin

    old = set_spin(0)
    try:
        assert old == 50.0  # the default
        assert set_spin(12.5) == 0
        with pytest.raises(rs.InvalidArgument, match="spin budget"):
            set_spin(-1)
        with pytest.raises(ValueError, match="nanoseconds"):
            _sync.set_spin(-1)
        assert set_spin(old) == 12.5
    finally:
        set_spin(old)


@pytest.mark.skipif(shared_reads.keys_settled is None, reason="_sync not built")
def test_without_spinning_a_waiter_sleeps_and_still_gets_the_lock(tmp_path):
    from replaystore.shared import set_spin

    old = set_spin(0)
    try:
        t = SharedTable.create("nospin", 64, SPEC, directory=tmp_path)
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        procs = [ctx.Process(target=_write_small, args=(t, w, q), daemon=True) for w in range(2)]
        for p in procs:
            p.start()
        for _ in range(200):
            s = t.sample(8, timeout=10)
            assert (s.data["obs"] == s.data["id"][:, None]).all() and (s.data["reward"] == s.data["id"] * 0.5).all()
        assert sorted(q.get(timeout=60) for _ in procs) == [200, 200]
        for p in procs:
            p.join(30)
        assert t.stats()["inserts"] == 400
        t.close()
    finally:
        set_spin(old)


def _write_small(table, w, q):
    for j in range(200):
        table.extend(transitions(1, 1_000_000 * (w + 1) + j))
    q.put(200)


def _sample_forever(name, directory, ready):
    t = SharedTable.attach(name, directory)
    t.sample(32)
    ready.set()
    while True:
        t.sample(32)


def test_a_learner_killed_while_it_copies_leaves_nothing_held(tmp_path):
    """Most of a sample runs outside the lock now: SIGKILL it there, repeatedly; the table goes on."""
    t = SharedTable.create("killed", 256, WIDE, directory=tmp_path, lock_timeout=5)
    ids = np.arange(256)
    t.extend({"id": ids, "frame": np.repeat(ids[:, None], 2048, axis=1)})
    ctx = mp.get_context("fork")
    for round_ in range(3):
        ready = ctx.Event()
        p = ctx.Process(target=_sample_forever, args=("killed", tmp_path, ready))
        p.start()
        assert ready.wait(30)
        time.sleep(0.05 + 0.03 * round_)
        p.kill()
        p.join(10)
        keys = t.extend({"id": ids[:4], "frame": np.repeat(ids[:4, None], 2048, axis=1)}, timeout=5)
        assert len(keys) == 4
        s = t.sample(16, timeout=5)
        assert (s.data["frame"] == s.data["id"][:, None]).all()
    assert t.stats()["samples"] % 16 == 0  # whole samples only (32 and 16 rows each)
    t.close()


def test_section_calls_refuse_bad_words_and_leave_the_mutex_free(tmp_path):
    from replaystore.shared._sync import enter_section, leave_section

    t = SharedTable.create("section", 8, SPEC, directory=tmp_path)
    guard, words = t._guard, t._segment.words
    mutex, copies = guard._mutex, guard.copies
    with pytest.raises(ValueError, match="busy word"):
        enter_section(mutex, 1.0, 10**9, copies, 0, 0)
    gen = copies.generation()
    assert enter_section(mutex, 1.0, W_BUSY, copies, gen, 3) == 0  # held, busy set, intent noted
    assert words[W_BUSY] == os.getpid() and copies.read()[1] == 3
    with pytest.raises(ValueError, match="busy or unordered word"):
        leave_section(mutex, 10**9, W_UNORDERED, copies, t._segment.view("shared.scalars"), gen, 3, None)
    assert mutex.acquire(0.5)  # released all the same
    mutex.release()
    assert words[W_BUSY] == os.getpid()  # (it could not clear a word it was not shown)
    words[W_BUSY] = 0
    assert enter_section(mutex, 1.0, W_BUSY, copies, gen - 1, 0) == 2  # another generation: catch up
    assert leave_section(mutex, W_BUSY, W_UNORDERED, copies, t._segment.view("shared.scalars"), gen, 0, None) == gen
    assert words[W_BUSY] == 0  # (nothing changed: nothing committed)
    t.close()
