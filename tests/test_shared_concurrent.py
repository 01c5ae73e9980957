"""Writers and learners in separate processes on one shared table, at once: no torn or lost row, exact counts.

Each example forks writer processes (``extend`` of small batches, ring mode) and learner processes
(``sample``; prioritized ones also ``update_priorities``) that run at the same time, a fixed number
of calls each (never for a wall-clock time: the assertions hold on a loaded machine, only the
interleaving changes). After they are joined the parent checks, against what every process
reported:

- no torn row: every sampled row carries its writer's id in every field, and the id the writer
  stored under that key;
- no lost row: the table holds exactly the newest ``capacity`` keys of all those inserted (all of
  them when they fit), each with its writer's row;
- exact counts: ``inserts``, ``samples``, ``sample_calls`` and ``evictions`` are the sums of the
  processes' calls, and each surviving item's ``times_sampled`` is the number of times the
  learners received it (a draw whose item was overwritten during the copy is drawn again and
  counted on the new item, which is the one returned).
"""

import multiprocessing as mp

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs
from conftest import transitions
from replaystore.shared import SharedTable

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}
_JOIN_S = 120  # generous: a loaded machine only slows the processes down
# The children start from a fresh forkserver, not from a fork of the test process: a fork of a
# long-lived pytest process inherits whatever earlier tests left (torch's thread pools, Ray's
# client threads), and one full-suite run saw two such children abort at exit ("double free or
# corruption") after doing all their work; ~190 runs of the same examples from clean processes
# (also under MALLOC_CHECK_=3 and with CPU hogs beside them) never did.
_START = "forkserver"


def _writer(name, directory, w, batches, rows, q):
    try:
        t = SharedTable.attach(name, directory)
        out = []
        for j in range(batches):
            start = (w + 1) * 1_000_000 + j * rows  # (ids < 2**24: exact in the float32 fields)
            out.append((t.extend(transitions(rows, start), timeout=60), start))
        t.close()
        q.put(("writer", w, out))
    except BaseException as e:  # (reported, so the parent fails with the cause instead of a timeout)
        q.put(("error", w, repr(e)))


def _learner(name, directory, seed, calls, n, update, q):
    try:
        t = SharedTable.attach(name, directory)
        rng = np.random.default_rng(seed)
        keys, ids, torn = [], [], 0
        for _ in range(calls):
            s = t.sample(n, timeout=60)
            d = s.data
            if not (
                (d["obs"] == d["id"][:, None]).all()
                and (d["reward"] == d["id"] * 0.5).all()
                and (d["action"] == d["id"] % 3).all()
            ):
                torn += 1
            keys.append(s.keys)
            ids.append(d["id"])
            if update:
                t.update_priorities(s.keys, rng.random(n) + 0.1)
        t.close()
        q.put(("learner", seed, (np.concatenate(keys), np.concatenate(ids), torn)))
    except BaseException as e:
        q.put(("error", seed, repr(e)))


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    writers=st.integers(1, 2),
    learners=st.integers(1, 2),
    rows=st.sampled_from([1, 3, 8]),
    evicts=st.booleans(),
    prioritized=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_writers_and_learners_at_once_lose_tear_and_miscount_nothing(
    tmp_path_factory, writers, learners, rows, evicts, prioritized, seed
):
    directory = tmp_path_factory.mktemp("concurrent")
    batches, calls, n = 150, 60, 32
    prefill = 64
    total = prefill + writers * batches * rows
    capacity = 256 if evicts else total
    sampler = rs.Prioritized(0.6, 0.4) if prioritized else rs.Uniform()
    t = SharedTable.create("mix", capacity, SPEC, sampler=sampler, directory=directory, seed=seed)
    try:
        id_of = dict(zip(t.extend(transitions(prefill)).tolist(), range(prefill)))
        ctx = mp.get_context(_START)
        q = ctx.Queue()
        procs = [
            ctx.Process(target=_writer, args=("mix", directory, w, batches, rows, q), daemon=True)
            for w in range(writers)
        ] + [
            ctx.Process(target=_learner, args=("mix", directory, seed + i, calls, n, prioritized, q), daemon=True)
            for i in range(learners)
        ]
        for p in procs:
            p.start()
        results = [q.get(timeout=_JOIN_S) for _ in procs]
        for p in procs:
            p.join(_JOIN_S)
            assert p.exitcode == 0
        errors = [r for r in results if r[0] == "error"]
        assert not errors, errors
        # every insert's keys: consecutive within a batch, disjoint across writers, all keys 0 .. total-1
        for _, _, out in (r for r in results if r[0] == "writer"):
            for keys, start in out:
                assert keys.tolist() == list(range(int(keys[0]), int(keys[0]) + rows))
                id_of.update(zip(keys.tolist(), range(start, start + rows)))
        assert sorted(id_of) == list(range(total))
        seen = np.zeros(total, dtype=np.int64)
        for _, _, (keys, ids, torn) in (r for r in results if r[0] == "learner"):
            assert torn == 0, "a torn row"
            assert [id_of[k] for k in keys.tolist()] == ids.tolist(), "a row of another item"
            np.add.at(seen, keys, 1)
        # nothing lost: the newest `capacity` keys, each with its own row
        alive = list(range(max(0, total - capacity), total))
        assert t.keys().tolist() == alive
        data, _ = t.get(alive)
        assert data["id"].tolist() == [id_of[k] for k in alive]
        # counts exact after the join
        stats = t.stats()
        assert stats["inserts"] == total
        assert stats["samples"] == learners * calls * n
        assert stats["sample_calls"] == learners * calls
        assert stats["evictions"] == total - len(alive)
        assert stats["size"] == len(alive)
        assert t.info(alive)["times_sampled"].tolist() == seen[alive].tolist()
        if not evicts:
            assert int(seen.sum()) == learners * calls * n
    finally:
        t.close()


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_the_lock_is_free_and_the_busy_word_clear_after_the_processes_left(tmp_path, prioritized):
    """After concurrent writers and a learner exit, a new handle enters at once: no recovery, nothing held."""
    sampler = rs.Prioritized(0.6, 0.4) if prioritized else rs.Uniform()
    t = SharedTable.create("after", 512, SPEC, sampler=sampler, directory=tmp_path, seed=5)
    t.extend(transitions(64))
    ctx = mp.get_context(_START)
    q = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=("after", tmp_path, w, 100, 8, q), daemon=True) for w in range(2)]
    procs.append(ctx.Process(target=_learner, args=("after", tmp_path, 9, 50, 16, prioritized, q), daemon=True))
    for p in procs:
        p.start()
    results = [q.get(timeout=_JOIN_S) for _ in procs]
    for p in procs:
        p.join(_JOIN_S)
        assert p.exitcode == 0
    assert not [r for r in results if r[0] == "error"]
    state = t.lock_state()
    assert t.recoveries() == 0
    assert state["busy"] == 0
    t.extend(transitions(8, 10_000_000))  # (enters at once: the lock is free)
    assert t.stats()["inserts"] == 64 + 2 * 100 * 8 + 8
    t.close()
