"""Implicit keys in ring mode (issue 36 item 2): no key is stored while a table is a ring.

A ring-mode table's key ``k`` sits in slot ``(k - base) % capacity``; its metadata row holds no key
(8 bytes uniform, 16 prioritized), the key column (``table.keys``) is written out only when ring
mode ends. What must not change: keys, ``info``, ``Sample.keys``, ``get``, the counters, for any
sequence of calls that enters and leaves ring mode, in process (compiled and Python methods) and
across two handles of a shared table; a writer killed mid-insert is recovered as before, and a
reader in another process never keeps a torn row (``shared.reads``: the header's ``written_hi``).
"""

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from test_shared_processes import run_python

import replaystore as rs
from replaystore import rows
from replaystore.shared import LayoutMismatch, SharedTable
from replaystore.shared.header import W_WRITTEN_HI

SPEC = {"obs": ((3,), np.float32), "id": ((), np.int64), "reward": ((), np.float32)}
CAP = 8


class PyTable(rs.Table):
    """The Table with its Python add / extend (the reference)."""

    if rows.FastMethod is not None:
        add = rs.Table.add.__wrapped__
        extend = rs.Table.extend.__wrapped__


def items(ids):
    ids = np.asarray(ids, np.int64)
    obs = np.repeat(ids[:, None], 3, 1).astype(np.float32)
    return {"obs": obs, "id": ids, "reward": (ids * 0.5 + 0.25).astype(np.float32)}


def whole(data, keys) -> bool:
    ids = data["id"]
    rewards = data["reward"] == ids * 0.5 + 0.25
    return bool((ids == keys).all() and (data["obs"] == ids[:, None]).all() and rewards.all())


class RingKeysModel(RuleBasedStateMachine):
    """A Fifo table against a dict ``key -> (times sampled, version)``: the keys are consecutive ids."""

    make = None  # set per test: (tmp) -> (table, reader)

    @initialize(prioritized=st.booleans())
    def start(self, prioritized):
        sampler = rs.Prioritized(0.6, 0.4) if prioritized else rs.Uniform()
        self.t, self.reader = type(self).make(sampler)
        self.live: dict[int, list[int]] = {}
        self.next = 0

    def teardown(self):
        if getattr(self, "t", None) is not None:
            self.t.close()
            if self.reader is not self.t:
                self.reader.close()

    def _insert(self, n, version):
        for k in range(self.next, self.next + n):
            self.live[k] = [0, version]
        self.next += n
        for k in sorted(self.live)[: max(0, len(self.live) - CAP)]:  # Fifo: the oldest leave
            del self.live[k]

    @rule(version=st.integers(0, 3))
    def add(self, version):
        item = {k: v[0] for k, v in items([self.next]).items()}
        assert self.t.add(item, version=version) == self.next
        self._insert(1, version)

    @rule(n=st.integers(1, CAP + 3), version=st.integers(0, 3))
    def extend(self, n, version):
        keys = self.t.extend(items(np.arange(self.next, self.next + n)), version=version)
        assert keys.tolist() == list(range(self.next, self.next + n))
        self._insert(n, version)

    @rule(n=st.integers(1, 20))
    def sample(self, n):
        if not self.live:
            return
        s = self.reader.sample(n, timeout=10)
        assert whole(s.data, s.keys) and set(s.keys.tolist()) <= set(self.live)
        for k in s.keys.tolist():
            self.live[k][0] += 1

    @rule(data=st.data())
    def delete(self, data):
        if not self.live:
            return
        live = sorted(self.live)
        oldest = data.draw(st.booleans())
        gone = live[: data.draw(st.integers(1, len(live)))] if oldest else data.draw(st.sets(st.sampled_from(live)))
        assert self.t.delete(sorted(gone) + [self.next + 5]) == len(gone)
        for k in gone:
            del self.live[k]

    @rule()
    def clear(self):
        self.t.clear()
        self.live.clear()

    @rule(data=st.data())
    def update(self, data):
        if self.live:
            keys = data.draw(st.lists(st.sampled_from(sorted(self.live)), max_size=4))
            assert self.t.update_priorities(keys, [2.0] * len(keys)) == len(set(keys))

    @invariant()
    def agrees(self):
        if not hasattr(self, "t"):
            return
        keys = sorted(self.live)
        for h in {id(self.t): self.t, id(self.reader): self.reader}.values():
            assert h.keys().tolist() == keys
            info = h.info(keys)
            assert info["found"].all()
            assert info["times_sampled"].tolist() == [self.live[k][0] for k in keys]
            assert info["versions"].tolist() == [self.live[k][1] for k in keys]
            data, found = h.get(keys)
            assert found.all() and whole(data, np.asarray(keys, np.int64))
        t = self.t
        if t._ring is None:  # the key column written out (a free slot -1) and the index on it
            column = t._index.key_of_slot
            assert sorted(column[column >= 0].tolist()) == keys
            assert (column[t._index.lookup(keys)] == keys).all()
        else:
            assert t._index.keys_of(t._index.lookup(keys)).tolist() == keys


def _run(make, **kw):
    RingKeysModel.make = staticmethod(make)
    run_state_machine_as_test(
        RingKeysModel,
        settings=settings(deadline=None, suppress_health_check=list(HealthCheck), stateful_step_count=25, **kw),
    )


@pytest.mark.parametrize("cls", [rs.Table, PyTable], ids=["table", "python-methods"])
def test_ring_keys_against_a_model_in_process(cls):
    def make(sampler):
        t = cls(CAP, spec=SPEC, sampler=sampler, seed=1)
        return t, t

    _run(make, max_examples=60)


def test_ring_keys_against_a_model_across_two_handles_of_a_shared_table(tmp_path_factory):
    def make(sampler):
        d = tmp_path_factory.mktemp("ringkeys")
        t = SharedTable.create("model", CAP, SPEC, sampler=sampler, directory=d, seed=1)
        return t, SharedTable.attach("model", d)

    _run(make, max_examples=20)


@pytest.mark.parametrize("full", [False, True])
def test_a_writer_killed_mid_insert_into_a_ring_with_implicit_keys_leaves_no_torn_row(tmp_path, full):
    """A uniform ring (no key stored): the dead writer raised ``written_hi`` and copied its rows, then died."""
    t = SharedTable.create("killed", 16, SPEC, directory=tmp_path)
    n0 = 16 if full else 6
    t.extend(items(np.arange(n0)))
    assert t._meta.shape == (16, rows.META_WIDTH_NO_PRIORITY) and t._ring is not None
    marker = tmp_path / "paused"
    code = f"""
import numpy as np
from replaystore.shared import LayoutMismatch, SharedTable
t = SharedTable.attach("killed", directory={str(tmp_path)!r})
t.extend({{"obs": np.full((5, 3), -7, np.float32), "id": np.full(5, -7), "reward": np.zeros(5, np.float32)}})
"""
    proc = run_python(code, env={"REPLAYSTORE_SHM_TEST_HOOK": f"pause-before-publish:{marker}"}, wait=False)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    words = np.frombuffer(t._segment.words, np.int64)
    assert words[W_WRITTEN_HI] == n0 + 5  # (raised before its rows were written)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    t._segment.lock_timeout = 5.0
    keys = t.keys()
    assert keys.tolist() == (list(range(5, 16)) if full else list(range(6))) and t.recoveries() == 1
    data, found = t.get(keys)
    assert found.all() and whole(data, keys) and t._ring is not None
    s = t.sample(300)
    assert whole(s.data, s.keys) and np.isin(s.keys, keys).all()
    assert t.extend(items(np.arange(n0, n0 + 2))).tolist() == [n0, n0 + 1]  # the dead insert's keys never published
    assert words[W_WRITTEN_HI] >= n0 + 5
    t.close()


def _write_then_leave_the_ring(name, directory, rounds, done):
    t = SharedTable.attach(name, directory)
    k = int(t.stats()["inserts"])
    for r in range(rounds):
        n = 1 + r % 7
        t.extend(items(np.arange(k, k + n)))
        k += n
        if r == rounds // 2:
            t.delete([k - 3])  # out of order: ring mode ends here, the writes go on out of it
    done.put(k)
    t.close()


def test_a_reader_in_this_process_never_keeps_a_torn_row_while_another_process_writes(tmp_path):
    """Samples copied outside the lock, in ring mode (checked against ``written_hi``) and after it (the key column)."""
    t = SharedTable.create("racing", 32, SPEC, directory=tmp_path, seed=4)
    t.extend(items(np.arange(32)))
    ctx = mp.get_context("fork")
    done = ctx.Queue()
    proc = ctx.Process(target=_write_then_leave_the_ring, args=("racing", tmp_path, 600, done), daemon=True)
    proc.start()
    try:
        samples, in_ring = 0, 0
        while proc.is_alive() or samples < 50:
            s = t.sample(32, timeout=30)
            assert whole(s.data, s.keys), "a torn or foreign row was kept"
            samples += 1
            in_ring += t._ring is not None
            if samples > 20000:
                break
        total = done.get(timeout=60)
        proc.join(60)
        assert proc.exitcode == 0 and t._ring is None and samples >= 50
        assert t.keys()[-1] == total - 1
    finally:
        if proc.is_alive():
            proc.kill()
        t.close()


def test_a_damaged_written_hi_word_is_a_layout_mismatch_and_a_large_one_is_bounded_in_recovery(tmp_path):
    t = SharedTable.create("damaged", 8, SPEC, directory=tmp_path)
    t.extend(items(np.arange(6)))
    words = np.frombuffer(t._segment.words, np.int64)
    assert words[W_WRITTEN_HI] == 6
    words[W_WRITTEN_HI] = -5
    with pytest.raises(LayoutMismatch, match=f"header word {W_WRITTEN_HI}"):
        SharedTable.attach("damaged", tmp_path, lock_timeout=0.5)
    words[W_WRITTEN_HI] = 2**62  # (in range for the header check; recovery bounds it by what a write could set)
    from replaystore.shared.recovery import reconcile

    with t._guard:
        view = t._hosted
        names, _ = view.state_layout()
        fixed, dropped = reconcile(view, t._segment, names, view.state_scalars(), 0)
        view.load_state_scalars(fixed)
    assert dropped == 6 and t.keys().tolist() == []  # (bounded at next_key + capacity: every item suspect)
    words[W_WRITTEN_HI] = 6
    t.close()
