"""A shared table's ring-mode uniform samples in one compiled call (``_sync.RingSampler``, ``KeyCheckedReads.sample``).

The compiled call must be the Python path's twin: the same draws (the same numbers from the
sampler's Generator), rows, counters, errors and table state for any sequence of calls (a table
whose compiled sample is switched off runs the same calls with the same seed), and a learner
killed anywhere in it must leave a table the next process recovers whole.
"""

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_shared_processes import consistent, run_python

import replaystore as rs
from conftest import transitions
from replaystore.shared import SharedTable
from replaystore.shared import guard as shared_guard

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}

pytestmark = pytest.mark.skipif(shared_guard.RingSampler is None, reason="_sync built without NumPy's headers")


def _state(t):
    keys = t.keys()
    data, _ = t.get(keys)
    stats = {k: v for k, v in t.stats().items() if not k.endswith("_s") and k != "name"}
    return keys.tolist(), {k: v.tolist() for k, v in data.items()}, t.info(keys)["times_sampled"].tolist(), stats


def _sample_view(s):
    return (
        s.keys.tolist(),
        s.indices.tolist(),
        {k: v.tolist() for k, v in s.data.items()},
        s.probabilities.tolist(),
        s.weights.tolist(),
        s.times_sampled.tolist(),
        s.versions.tolist(),
        s.priorities.tolist(),
    )


def test_the_compiled_sample_takes_ring_mode_samples_and_leaves_the_rest(tmp_path):
    t = SharedTable.create("taken", 64, SPEC, directory=tmp_path, seed=1)
    t.extend(transitions(40))
    calls = []
    draw = t._draw
    t._draw = lambda *a, **k: calls.append(1) or draw(*a, **k)
    for _ in range(10):
        s = t.sample(16)
        assert consistent(s.data) and (s.keys == s.data["id"]).all()
    assert type(t._drawer).__name__ == "RingSampler" and calls == []
    assert t.stats()["samples"] == 160 and t.stats()["sample_calls"] == 10
    t.sample(np.int64(4))  # (not an int: the Python path)
    assert len(calls) == 1
    s = t.sample(8, as_tensor=True)  # (tensors: compiled too)
    assert len(calls) == 1 and s.data["id"].tolist() == s.keys.tolist()
    t.delete(t.keys()[-1:])  # (ring mode ends: every later sample takes the Python path)
    assert t._drawer is None
    t.sample(4)
    assert len(calls) == 2
    t.close()


def test_tables_that_cannot_sample_compiled_keep_the_python_path(tmp_path):
    per = SharedTable.create("per", 64, SPEC, sampler=rs.Prioritized(), directory=tmp_path)
    flock = SharedTable.create("flock", 64, SPEC, directory=tmp_path, lock="flock")
    retire = SharedTable.create("retire", 64, SPEC, directory=tmp_path, max_times_sampled=2)
    for t in (per, flock, retire):
        t.extend(transitions(8))
        t.sample(4)
        assert t._drawer is None
        t.close()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(1, 40)),
        st.tuples(st.just("sample"), st.integers(1, 40)),
        st.tuples(st.just("sample_np"), st.integers(1, 8)),
        st.tuples(st.just("delete_oldest"), st.integers(1, 3)),
        st.tuples(st.just("delete_newest"), st.just(1)),
        st.tuples(st.just("clear"), st.just(0)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(ops=OPS, capacity=st.sampled_from([8, 37, 64]), limiter=st.sampled_from(["none", "ratio", "min_size"]))
def test_the_compiled_sample_agrees_with_the_python_path(tmp_path_factory, ops, capacity, limiter):
    directory = tmp_path_factory.mktemp("twin")
    make = {
        "none": lambda: None,
        "ratio": lambda: rs.SampleToInsertRatio(2.0, 1, 30.0),
        "min_size": lambda: rs.MinSize(5),
    }[limiter]
    tables = [
        SharedTable.create(name, capacity, SPEC, directory=directory, seed=7, rate_limiter=make())
        for name in ("compiled", "python")
    ]
    compiled, python = tables
    python._drawer = None  # (every sample of this one takes the Python path)
    nxt = 0
    for op, k in ops:
        results = []
        for t in tables:
            try:
                if op == "extend":
                    r = t.extend(transitions(k, nxt), timeout=0).tolist()
                elif op == "sample":
                    r = _sample_view(t.sample(k, timeout=0))
                elif op == "sample_np":
                    r = _sample_view(t.sample(np.int32(k), timeout=0))
                elif op == "delete_oldest":
                    r = t.delete(t.keys()[:k]) if len(t) else 0
                elif op == "delete_newest":
                    r = t.delete(t.keys()[-1:]) if len(t) else 0
                else:
                    r = t.clear()
            except Exception as e:  # (the same named error from both)
                r = type(e).__name__
            results.append(r)
        assert results[0] == results[1], (op, k)
        nxt += k if op == "extend" else 0
        assert _state(compiled) == _state(python)
        assert compiled.sampler.rng.random() == python.sampler.rng.random()  # (the same stream, still)
    for t in tables:
        t.close()


def test_threads_sampling_compiled_beside_writers_and_deletes(tmp_path):
    """Compiled samples skip the guard's thread lock: threads sampling beside inserts, deletes and Python samples."""
    import threading

    t = SharedTable.create("threads", 512, SPEC, directory=tmp_path, seed=3)
    t.extend(transitions(64))
    errors, n = [], 300
    drawn = [0, 0]

    def run(w):
        try:
            for i in range(n):
                if w == 0:
                    t.extend(transitions(4, 64 + 4 * i))  # (ids = keys)
                elif w == 1:
                    s = t.sample(32)  # compiled
                    assert consistent(s.data) and (s.keys == s.data["id"]).all()
                    drawn[0] += 32
                else:
                    s = t.sample(np.int64(16))  # the Python path
                    assert consistent(s.data)
                    drawn[1] += 16
        except Exception as e:  # pragma: no cover (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads) and errors == []
    stats = t.stats()
    assert stats["samples"] == sum(drawn) == t.rate_limiter.samples and stats["sample_calls"] == 2 * n
    assert int(t.info(t.keys())["times_sampled"].sum()) <= sum(drawn)  # (evicted items took their counts)
    t.close()


def _sample_forever(name, directory, ready):
    t = SharedTable.attach(name, directory)
    ready.set()
    while True:  # (large draws: a long section under the lock, where the kills should land)
        t.sample(8192)


def test_learners_killed_at_random_in_compiled_samples_leave_a_whole_table(tmp_path):
    """SIGKILL a learner process at random moments (some land inside its section); the next call recovers."""
    t = SharedTable.create("killed", 4096, SPEC, directory=tmp_path, seed=2)
    t.extend(transitions(1024))
    ctx = mp.get_context("fork")
    rng = np.random.default_rng(11)
    for round_ in range(12):
        ready = ctx.Event()
        p = ctx.Process(target=_sample_forever, args=("killed", tmp_path, ready), daemon=True)
        p.start()
        assert ready.wait(60)
        time.sleep(float(rng.uniform(0.001, 0.02)))
        os.kill(p.pid, signal.SIGKILL)
        p.join(60)
        assert p.exitcode == -signal.SIGKILL
        before = t.stats()
        s = t.sample(64)  # (enters after the dead learner: recovers if it must)
        assert consistent(s.data) and (s.keys == s.data["id"]).all()
        t.extend(transitions(8, 1024 + 8 * round_))  # (ids = keys)
        keys = t.keys()
        data, found = t.get(keys)
        assert found.all() and consistent(data) and (np.diff(keys) > 0).all()
        after = t.stats()
        assert after["size"] == len(keys) and after["samples"] == before["samples"] + 64
        assert after["samples"] == t.rate_limiter.samples
    t.close()


def test_a_compiled_sample_after_a_writer_died_inside_the_lock_recovers_first(tmp_path):
    """The compiled sample finds the busy word of a holder killed inside its section: repair, then the sample."""
    t = SharedTable.create("died", 16, SPEC, directory=tmp_path, seed=5)
    t.extend(transitions(6))
    t.sample(2)  # (the compiled sample is built)
    marker = tmp_path / "paused"
    proc = run_python(
        f"""
import numpy as np
from replaystore.shared import SharedTable
t = SharedTable.attach("died", directory={str(tmp_path)!r})
bad = {{"obs": np.full((5, 4), -7, np.float32), "action": np.zeros(5, np.int64),
        "reward": np.ones(5, np.float32), "id": np.arange(5)}}
t.extend(bad)
""",
        env={"REPLAYSTORE_SHM_TEST_HOOK": f"pause-before-publish:{marker}"},
        wait=False,
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    t._segment.lock_timeout = 30.0
    s = t.sample(32)  # (the dead insert never happened)
    assert t.recoveries() == 1 and type(t._drawer).__name__ == "RingSampler"
    assert consistent(s.data) and set(s.keys.tolist()) <= set(range(6))
    assert t.keys().tolist() == list(range(6)) and t.stats()["samples"] == 34
    t.close()


def _compiled(t):
    t.sample(1)  # (builds the compiled sample)
    assert type(t._drawer).__name__ == "RingSampler"
    return t._drawer


def _whole(s) -> bool:
    return consistent(s.data) and bool((s.keys == s.data["id"]).all())


def test_rows_written_during_the_compiled_copy_are_drawn_again_and_counted_once(tmp_path):
    """A writer (another handle, as another process would) overwrites every slot during the compiled call's copy."""
    t = SharedTable.create("torn", 8, SPEC, directory=tmp_path, seed=1)
    other = SharedTable.attach("torn", tmp_path)
    t.extend(transitions(8))
    drawer = _compiled(t)
    copies, reads = [], []
    read = t.storage.read

    def read_again(slots):
        reads.append(len(slots))
        return read(slots)

    drawer.after_copy = lambda slots: copies.append(len(slots)) or other.extend(transitions(8, 8))
    t.storage.read = read_again  # (the positions drawn again are read by the Python path)
    s = t.sample(256)
    drawer.after_copy = None
    del t.storage.read
    assert copies == [256] and len(reads) == 1  # the copy, then the sample finished under the lock
    assert _whole(s) and (s.keys >= 8).all()  # only the items alive after the eviction
    st_ = t.stats()
    assert st_["samples"] == 257 and st_["sample_calls"] == 2
    assert t.info(np.unique(s.keys))["times_sampled"].sum() == 256  # the redraws counted, the evicted items gone
    other.close()
    t.close()


def test_a_compiled_copy_no_writer_touched_is_kept(tmp_path):
    t = SharedTable.create("quiet", 64, SPEC, directory=tmp_path, seed=2)
    other = SharedTable.attach("quiet", tmp_path)
    t.extend(transitions(32))
    drawer = _compiled(t)
    drawer.after_copy = lambda slots: other.extend(transitions(8, 32))  # free slots only: no drawn row touched
    reads = []
    read = t.storage.read
    t.storage.read = lambda slots: reads.append(1) or read(slots)
    s = t.sample(128)
    drawer.after_copy = None
    del t.storage.read
    assert reads == [] and _whole(s) and (s.keys < 32).all()
    other.close()
    t.close()


def test_a_compiled_copy_that_ends_inside_a_writers_section_waits_then_finishes_under_the_lock(tmp_path):
    """The copy ends while another process holds the lock mid-insert and dies there: repaired, then redrawn."""
    t = SharedTable.create("dying", 32, SPEC, directory=tmp_path, seed=5, lock_timeout=30)
    t.extend(transitions(32))
    drawer = _compiled(t)
    marker = tmp_path / "paused"
    procs = []

    def a_writer_dies_in_the_lock(slots):
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
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)

    drawer.after_copy = a_writer_dies_in_the_lock
    s = t.sample(64, timeout=30)
    drawer.after_copy = None
    assert len(procs) == 1
    assert _whole(s) and (s.keys >= 8).all() and t.recoveries() == 1 and len(t) == 24
    assert t.stats()["samples"] == 65 and t.stats()["sample_calls"] == 2
    t.close()


def test_a_table_of_more_columns_than_the_compiled_calls_hold_takes_the_python_paths(tmp_path):
    spec = {f"f{i}": ((), np.float32) for i in range(40)}  # (the compiled calls hold 32 columns)
    t = SharedTable.create("many", 16, spec, directory=tmp_path, seed=1)
    batch = {k: np.arange(4, dtype=np.float32) + i for i, k in enumerate(spec)}
    assert t.extend(batch).tolist() == [0, 1, 2, 3] and t.extend(batch).tolist() == [4, 5, 6, 7]
    assert t.add({k: np.float32(i) for i, k in enumerate(spec)}) == 8
    s = t.sample(6)
    assert t._inserter is None and t._drawer is None
    assert (s.data["f5"] - s.data["f0"] == 5).all() and t.stats()["samples"] == 6
    t.close()


def test_compiled_sample_rows_carry_the_rings_implicit_keys_and_see_a_removal_during_the_copy(tmp_path):
    """Keys are not stored in ring mode: the compiled call's rows take them from the ring's bounds.

    On a ring that wrapped and whose oldest items were deleted (its live run starts mid-array, key
    ``base`` is not the slot-0 key any more), every sampled key is its row's ``id`` and equals the
    Python path's ``RingIndex.keys_of``; the oldest items deleted by another handle during the copy
    (no payload write: only the bounds move, and ``written_hi`` with them) are drawn again.
    """
    t = SharedTable.create("implicit", 16, SPEC, directory=tmp_path, seed=3)
    other = SharedTable.attach("implicit", tmp_path)
    t.extend(transitions(16))
    t.extend(transitions(7, 16))  # wraps: keys 7..22, key 16 in slot 0
    assert t.delete([7, 8, 9]) == 3 and t._ring is not None  # the oldest: still a ring
    drawer = _compiled(t)
    for _ in range(5):
        s = t.sample(64)
        assert _whole(s) and ((s.keys >= 10) & (s.keys < 23)).all()
        assert s.keys.tolist() == t._index.keys_of(s.indices).tolist()
    drawer.after_copy = lambda slots: other.delete([10, 11, 12, 13])  # the oldest four, during the copy
    s = t.sample(256)
    drawer.after_copy = None
    assert _whole(s) and (s.keys >= 14).all()  # the deleted items' positions were drawn again
    assert t._ring is not None and t.stats()["samples"] == 1 + 5 * 64 + 256
    other.delete([20])  # out of order: ring mode ends, the keys are written out to the key column
    s = t.sample(64)
    assert t._ring is None and _whole(s) and 20 not in s.keys.tolist()
    column = t._index.key_of_slot
    assert sorted(column[column >= 0].tolist()) == t.keys().tolist() == [14, 15, 16, 17, 18, 19, 21, 22]
    other.close()
    t.close()
