"""A write-ahead log's view of a table, ``Journal`` (locked, wal_lsn, slots_of, keys_of_slots, replay_*).

A replica that replays what a table recorded must end in the same state as the table.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions
from replaystore.errors import InvalidArgument
from replaystore.table.journal import Journal


def _state(t: rs.Table) -> tuple:
    keys = t.keys()
    info = t.info(keys)
    # (rounded: a mean over slots in another order may differ in the last bit)
    stats = {
        k: round(v, 12) if isinstance(v, float) else v for k, v in t.stats().items() if not k.endswith("_blocked_s")
    }
    return keys.tolist(), info["priorities"].tolist(), info["times_sampled"].tolist(), stats


def test_slots_of_and_keys_of_slots_round_trip():
    t = rs.Table(8, remover=rs.Uniform(), seed=0)
    keys = t.extend(transitions(5))
    slots = Journal(t).slots_of(np.append(keys, [99, -3]))
    assert (slots[:5] >= 0).all() and slots[5:].tolist() == [-1, -1]
    assert Journal(t).keys_of_slots(slots[:5]).tolist() == keys.tolist()
    free = np.setdiff1d(np.arange(8), slots[:5])
    assert (Journal(t).keys_of_slots(free) == -1).all()
    with pytest.raises(InvalidArgument):
        Journal(t).keys_of_slots([8])
    with pytest.raises(InvalidArgument):
        Journal(t).slots_of(["a"])


def test_slots_of_sees_staged_adds():
    t = rs.Table(16)
    t.add({"x": np.zeros(2)})
    key = t.add({"x": np.ones(2)})  # staged or written at once: either way visible
    assert Journal(t).slots_of([key])[0] >= 0


def test_locked_flushes_and_excludes_other_threads():
    t = rs.Table(16)
    for i in range(3):
        t.add({"x": np.full(2, float(i))})
    got = []
    with Journal(t).locked() as held:
        assert held is t
        th = threading.Thread(target=lambda: got.append(len(t.keys())))
        th.start()
        th.join(0.2)
        assert th.is_alive() and not got  # the other thread waits for the lock
        t.extend({"x": np.zeros((2, 2))})  # the holder's own calls proceed (reentrant)
    th.join(5)
    assert got == [5]


def test_wal_lsn_is_saved_and_restored(tmp_path):
    t = rs.Table(8)
    j = Journal(t)
    assert j.wal_lsn == 0 and "wal_lsn" not in t.stats()
    t.extend(transitions(3))
    with j.locked():
        j.wal_lsn = 41
    assert Journal(t).wal_lsn == 41 and t.stats()["wal_lsn"] == 41  # (views of one table agree)
    t.save(tmp_path / "c")
    assert Journal(rs.Table.load(tmp_path / "c")).wal_lsn == 41
    with pytest.raises(InvalidArgument):
        j.wal_lsn = 1.5
    with pytest.raises(InvalidArgument):
        j.wal_lsn = -1
    assert j.wal_lsn == 41


def test_the_journal_is_not_the_tables_public_surface():
    public = {n for n in dir(rs.Table) if not n.startswith("_")}
    assert not public & {"locked", "wal_lsn", "slots_of", "keys_of_slots", "replay_insert", "replay_sample"}


@pytest.mark.parametrize("remover", ["fifo", "uniform", "minheap"])
def test_replayed_inserts_and_samples_reach_the_same_state(remover):
    def make():
        rm = {"fifo": rs.Fifo, "uniform": rs.Uniform, "minheap": rs.MinHeap}[remover]()
        return rs.Table(10, sampler=rs.Prioritized(), remover=rm, max_times_sampled=3, seed=1)

    live, replica = make(), make()
    rng = np.random.default_rng(2)
    for step in range(30):
        if step % 3 == 2:
            s = live.sample(4)
            assert Journal(replica).replay_sample(s.keys) == 4
            continue
        n = int(rng.integers(1, 6))
        prio = rng.random(n) + 0.1
        before = set(live.keys().tolist())
        keys = live.extend(transitions(n, step * 10), priorities=prio)
        evicted = sorted(before - set(live.keys().tolist()))
        got = Journal(replica).replay_insert(
            transitions(n, step * 10), priorities=prio, evict_keys=None if remover == "fifo" else evicted
        )
        assert got.tolist() == keys.tolist()
        assert _state(replica) == _state(live)
    assert _state(replica) == _state(live)
    assert live.stats()["retired"] > 0


def test_replay_insert_does_not_wait_for_the_rate_limiter():
    t = rs.Table(8, rate_limiter=rs.Queue(2))
    t.extend(transitions(2))
    keys = Journal(t).replay_insert(transitions(1, 5))  # extend would block: the queue is full
    assert keys.tolist() == [2] and len(t) == 3


def test_replay_insert_single_item():
    t = rs.Table(8)
    keys = Journal(t).replay_insert({"x": np.arange(3.0)}, batched=False)
    assert keys.tolist() == [0]
    assert np.array_equal(t.get([0])[0]["x"][0], np.arange(3.0))


def test_replay_insert_refuses_victims_it_does_not_hold_and_changes_nothing():
    t = rs.Table(4, remover=rs.Uniform(), seed=0)
    t.extend(transitions(4))
    before = _state(t)
    with pytest.raises(InvalidArgument, match="not in table"):
        Journal(t).replay_insert(transitions(1), evict_keys=[77])
    with pytest.raises(InvalidArgument, match="victims"):
        Journal(t).replay_insert(transitions(1), evict_keys=[0, 1])  # one insert into a full table evicts one
    assert _state(t) == before
    fifo = rs.Table(4)
    fifo.extend(transitions(4))
    with pytest.raises(InvalidArgument):  # a Fifo table evicts its oldest: key 0, not key 2
        Journal(fifo).replay_insert(transitions(1), evict_keys=[2])
    assert Journal(fifo).replay_insert(transitions(1), evict_keys=[0]).tolist() == [4]


def test_replay_sample_advances_a_without_replacement_epoch():
    live = rs.Table(6, sampler=rs.WithoutReplacement(), seed=3)
    replica = rs.Table(6, sampler=rs.WithoutReplacement(), seed=4)
    live.extend(transitions(6))
    replica.extend(transitions(6))
    for _ in range(4):
        Journal(replica).replay_sample(live.sample(4).keys)
    assert replica.sampler.epoch == live.sampler.epoch == 2  # 16 draws of 6 items
    assert replica.sampler.export_state(np.arange(6)) == live.sampler.export_state(np.arange(6))


def test_replay_sample_of_unknown_keys_changes_nothing():
    t = rs.Table(4)
    t.extend(transitions(2))
    before = _state(t)
    with pytest.raises(InvalidArgument):
        Journal(t).replay_sample([0, 9])
    with pytest.raises(InvalidArgument):
        Journal(t).replay_sample([])
    assert _state(t) == before
