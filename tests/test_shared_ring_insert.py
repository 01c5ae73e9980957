"""A shared table's small ring-mode inserts in one compiled call (``_sync.RingInserter``, ``ProcessGuard.ring_insert``).

The compiled call must be the Python path's twin: the same keys, state, counters, errors and
rows for any sequence of calls (a table whose inserter is switched off runs the same calls), and
a writer killed anywhere in it must leave a table the next process recovers whole.
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

pytestmark = pytest.mark.skipif(shared_guard.RingInserter is None, reason="_sync built without NumPy's headers")


def _state(t):
    keys = t.keys()
    data, _ = t.get(keys)
    stats = {k: v for k, v in t.stats().items() if not k.endswith("_s") and k != "name"}
    return keys.tolist(), {k: v.tolist() for k, v in data.items()}, t.info(keys)["times_sampled"].tolist(), stats


def test_the_compiled_call_takes_plain_batches_and_leaves_the_rest(tmp_path):
    t = SharedTable.create("taken", 64, SPEC, directory=tmp_path)
    calls = []
    locked = t._extend_locked
    t._extend_locked = lambda *a: calls.append(1) or locked(*a)
    t.extend(transitions(4))  # (the first insert makes the ring plan: the Python path)
    assert t._inserter is True or t._inserter is not None
    for i in range(20):
        assert t.extend(transitions(3, 4 + 3 * i)).tolist() == list(range(4 + 3 * i, 7 + 3 * i))
    assert type(t._inserter).__name__ == "RingInserter"
    assert len(calls) == 1  # every later batch went in compiled
    strided = {k: np.asfortranarray(v) for k, v in transitions(2, 100).items()}  # (obs not C-contiguous)
    assert t.extend(strided).tolist() == [64, 65]
    t.extend(transitions(2, 102), priorities=[1.0, 2.0])  # (priorities: the Python path)
    assert len(calls) == 3
    assert t.stats()["inserts"] == 4 + 60 + 4
    t.close()


def test_a_table_with_selectors_or_episodes_keeps_the_python_path(tmp_path):
    per = SharedTable.create("per", 64, SPEC, sampler=rs.Prioritized(), directory=tmp_path)
    flock = SharedTable.create("flock", 64, SPEC, directory=tmp_path, lock="flock")
    for t in (per, flock):
        t.extend(transitions(4))
        t.extend(transitions(4, 4))
        assert t._inserter is None
        t.close()


def _item(form, i):
    """One transition ``i`` in one of the forms an ``add`` takes (or refuses: 3 to 5)."""
    row = {k: v[0] for k, v in transitions(1, i).items()}  # (NumPy scalars, an obs row)
    if form == 1:  # Python scalars
        row.update(action=int(row["action"]), reward=float(row["reward"]), id=int(row["id"]))
    elif form == 2:  # 0-d arrays
        row.update(action=np.array(row["action"]), reward=np.array(row["reward"]))
    elif form == 3:  # a float for an int column
        row["action"] = 1.5
    elif form == 4:  # a float64 scalar for a float32 column, an obs of the wrong shape
        row.update(reward=np.float64(row["reward"]), obs=np.zeros(3, np.float32))
    elif form == 5:  # a missing field
        del row["reward"]
    return row


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(1, 40)),
        st.tuples(st.just("add"), st.integers(0, 5)),
        st.tuples(st.just("bad"), st.integers(1, 5)),
        st.tuples(st.just("sample"), st.integers(1, 16)),
        st.tuples(st.just("delete_oldest"), st.integers(1, 3)),
        st.tuples(st.just("delete_newest"), st.just(1)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(ops=OPS, capacity=st.sampled_from([8, 37, 64]), limited=st.booleans())
def test_the_compiled_call_agrees_with_the_python_path(tmp_path_factory, ops, capacity, limited):
    directory = tmp_path_factory.mktemp("twin")
    limiter = (lambda: rs.SampleToInsertRatio(1.0, 1, 24.0)) if limited else (lambda: None)
    tables = []
    for name in ("compiled", "python"):
        tables.append(SharedTable.create(name, capacity, SPEC, directory=directory, seed=7, rate_limiter=limiter()))
    compiled, python = tables
    python._inserter = None  # (every insert of this one takes the Python path)
    nxt = 0
    for op, k in ops:
        results = []
        for t in tables:
            try:
                if op == "extend":
                    r = t.extend(transitions(k, nxt), timeout=0).tolist()
                elif op == "add":
                    r = t.add(_item(k, nxt), timeout=0)
                elif op == "bad":
                    r = t.extend({**transitions(k, nxt), "id": np.zeros((k, 2), np.int64)}, timeout=0)
                elif op == "sample":
                    s = t.sample(k, timeout=0)
                    r = (s.keys.tolist(), s.data["id"].tolist())
                elif op == "delete_oldest":
                    r = t.delete(t.keys()[:k]) if len(t) else 0
                else:
                    r = t.delete(t.keys()[-1:]) if len(t) else 0
            except Exception as e:  # (the same named error from both)
                r = type(e).__name__
            results.append(r)
        assert results[0] == results[1], (op, k)
        nxt += 1 if op == "add" else k
        assert _state(compiled) == _state(python)
    for t in tables:
        t.close()


def test_the_compiled_add_takes_plain_items_and_leaves_the_rest(tmp_path, monkeypatch):
    t = SharedTable.create("adds", 64, SPEC, directory=tmp_path)
    calls = []
    add = rs.Table.add
    t.add(_item(0, 0))  # (the first insert makes the ring plan: the Python path)
    monkeypatch.setattr(rs.Table, "add", lambda *a, **k: calls.append(1) or add(*a, **k))
    assert [t.add(_item(i % 3, i)) for i in range(1, 10)] == list(range(1, 10))
    assert calls == [] and type(t._inserter).__name__ == "RingInserter"
    assert t.add(_item(0, 10), priority=2.0) == 10  # (a priority: the Python path)
    assert len(calls) == 1
    monkeypatch.undo()
    guard = t._guard  # (the guard's wrapper: the key of one item, the keys of a batch, None if refused)
    assert guard.ring_insert(t._inserter, _item(1, 11), batched=False) == 11
    assert guard.ring_insert(t._inserter, _item(3, 12), batched=False) is None
    assert guard.ring_insert(t._inserter, transitions(2, 12)).tolist() == [12, 13]
    data, found = t.get(t.keys())
    assert found.all() and data["id"].tolist() == list(range(14)) and consistent(data)
    assert (data["action"] == data["id"] % 3).all() and t.stats()["inserts"] == 14
    t.close()


def test_threads_mixing_compiled_and_python_inserts_lose_nothing(tmp_path):
    """Compiled inserts skip the guard's thread lock: threads on both paths, with samples and deletes."""
    import threading

    t = SharedTable.create("threads", 512, SPEC, directory=tmp_path, seed=3)
    t.extend(transitions(8))
    errors, n, per = [], 300, 4

    def run(w):
        try:
            for i in range(n):
                base = 10_000 * (w + 1) + per * i
                if w == 0:
                    t.extend(transitions(per, base))  # compiled
                elif w == 1:
                    t.extend(transitions(per, base), priorities=np.ones(per))  # the Python path
                elif w == 2:
                    for j in range(per):
                        t.add(_item(j % 3, base + j))  # compiled adds
                else:
                    t.sample(8)
                    if i % 50 == 0:
                        t.delete(t.keys()[:2])
        except Exception as e:  # pragma: no cover (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads) and errors == []
    keys = t.keys()
    data, found = t.get(keys)
    assert found.all() and consistent(data) and (np.diff(keys) > 0).all()
    st_ = t.stats()
    assert st_["inserts"] == 8 + 3 * n * per and st_["size"] == len(keys) == len(np.unique(keys))
    assert len(np.unique(data["id"])) == len(keys)
    t.close()


def _insert_forever(name, directory, start, ready):
    t = SharedTable.attach(name, directory)
    ready.set()
    i = 0
    while True:
        t.extend(transitions(8, start + 8 * i))
        i += 1


def test_writers_killed_at_random_in_compiled_inserts_leave_a_whole_table(tmp_path):
    """SIGKILL a writer process at random moments (some land inside its section); the next one recovers."""
    t = SharedTable.create("killed", 4096, SPEC, directory=tmp_path, seed=2)
    t.extend(transitions(8))
    ctx = mp.get_context("fork")
    rng = np.random.default_rng(11)
    for round_ in range(12):
        ready = ctx.Event()
        p = ctx.Process(target=_insert_forever, args=("killed", tmp_path, (round_ + 1) * 100_000, ready), daemon=True)
        p.start()
        assert ready.wait(60)
        time.sleep(float(rng.uniform(0.001, 0.02)))
        os.kill(p.pid, signal.SIGKILL)
        p.join(60)
        t.extend(transitions(8, 50_000 + 8 * round_))  # (enters after the dead writer: recovers if it must)
        keys = t.keys()
        data, _ = t.get(keys)
        ids = data["id"]
        assert (data["obs"] == ids[:, None]).all() and (data["reward"] == ids * 0.5).all(), "a torn row"
        assert (np.diff(keys) > 0).all()
        assert t.stats()["size"] == len(keys) == len(np.unique(keys))
        s = t.sample(64)
        assert (s.data["obs"] == s.data["id"][:, None]).all()
    t.close()


@pytest.mark.parametrize("full", [False, True])
def test_a_compiled_insert_after_a_writer_died_inside_the_lock_recovers_first(tmp_path, full):
    """The compiled call finds the busy word of a holder killed inside its section: repair, then the insert."""
    t = SharedTable.create("died", 16, SPEC, directory=tmp_path)
    n0 = 16 if full else 6
    t.extend(transitions(n0 - 2))
    t.extend(transitions(2, n0 - 2))  # (the ring plan is made: the next insert is compiled)
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
    assert t.extend(transitions(2, 1000)).tolist() == [n0, n0 + 1]  # (the dead insert never happened)
    assert t.recoveries() == 1
    assert type(t._inserter).__name__ == "RingInserter"
    keys = t.keys()
    data, found = t.get(keys)
    assert found.all() and consistent(data)
    expected = list(range(5, n0)) if full else list(range(n0))  # (full: it had overwritten the 5 oldest)
    assert keys.tolist() == [*expected, n0, n0 + 1]
    t.close()
