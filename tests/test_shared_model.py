"""A shared table driven from two processes against a plain model (hypothesis state machine).

Every step runs in this process or in a worker process (forked once, attached by name to each
example's table); the checks read the table from this process. Deletes take any keys (the table
leaves ring mode); a second machine evicts with a ``Lifo`` remover and retires items after
``max_times_sampled`` draws, a third evicts with a ``MinHeap`` remover.
"""

import itertools
import multiprocessing as mp

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import replaystore as rs
from conftest import transitions
from replaystore.shared import SharedTable

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}
CAP = 8
_names = itertools.count()


def _worker(conn):
    table = None
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            break
        if msg[0] in ("attach", "detach"):
            if table is not None:
                table.close()
            table = SharedTable.attach(msg[1], directory=msg[2], seed=7) if msg[0] == "attach" else None
            if table is not None and len(msg) > 3:
                table.COPY_OUTSIDE_BYTES = msg[3]
            conn.send(("ok", None))
            continue
        _, method, args = msg
        try:
            out = getattr(table, method)(*args)
            conn.send(("ok", out))
        except Exception as e:  # noqa: BLE001 - reported to the test (a worker that died would hang it)
            conn.send(("err", f"{type(e).__name__}: {e}"))
    if table is not None:
        table.close()


@pytest.fixture(scope="module")
def worker():
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_worker, args=(there,), daemon=True)
    proc.start()
    yield here
    here.send(("stop",))
    proc.join(10)


class TwoProcesses(RuleBasedStateMachine):
    conn = None
    directory = None
    remover = "Fifo"
    max_times_sampled = 0
    copy_outside_bytes = SharedTable.COPY_OUTSIDE_BYTES

    @initialize()
    def start(self):
        self.name = f"model{next(_names)}"
        self.table = SharedTable.create(
            self.name,
            CAP,
            SPEC,
            sampler=rs.Prioritized(alpha=1.0),
            remover=getattr(rs, self.remover)(),
            max_times_sampled=self.max_times_sampled,
            directory=self.directory,
            seed=3,
        )
        self.table.COPY_OUTSIDE_BYTES = self.copy_outside_bytes
        self.conn.send(("attach", self.name, self.directory, self.copy_outside_bytes))
        assert self.conn.recv() == ("ok", None)
        self.items = {}  # key -> [id, priority, times_sampled]
        self.next_key = 0
        self.max_priority = 1.0
        self.counts = dict.fromkeys(
            ("inserts", "samples", "deletes", "evictions", "retired", "skipped_updates", "skipped_deletes"), 0
        )

    def teardown(self):
        if getattr(self, "table", None) is not None:
            self.table.close()

    def call(self, remote, method, *args):
        if not remote:
            return getattr(self.table, method)(*args)
        self.conn.send(("call", method, args))
        status, out = self.conn.recv()
        assert status == "ok", out
        return out

    @rule(remote=st.booleans(), n=st.integers(1, CAP + 2), prios=st.booleans(), data=st.data())
    def extend(self, remote, n, prios, data):
        if self.remover != "Fifo":
            n = min(n, CAP)  # (a larger batch: CapacityError, only a Fifo table keeps the newest)
        overflow = len(self.items) + n - CAP
        if self.remover != "Fifo" and overflow > 0:  # Lifo: the newest make room; MinHeap: the lowest
            order = sorted(self.items)[::-1] if self.remover == "Lifo" else sorted(self.items, key=self._rank)
            for k in order[:overflow]:
                del self.items[k]
            self.counts["evictions"] += overflow
            self.counts["deletes"] += overflow
        p = None
        if prios:
            p = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=n, max_size=n)))
        keys = self.call(remote, "extend", transitions(n, self.next_key), p)
        assert keys.tolist() == list(range(self.next_key, self.next_key + n))
        for i, k in enumerate(keys.tolist()):
            self.items[k] = [k, self.max_priority if p is None else float(p[i]), 0]
        if p is not None:
            self.max_priority = max(self.max_priority, float(p.max()))
        self.next_key += n
        self.counts["inserts"] += n
        while len(self.items) > CAP:
            del self.items[min(self.items)]
            self.counts["evictions"] += 1
            self.counts["deletes"] += 1

    def _rank(self, key):
        return (self.items[key][1], key)  # a MinHeap's order: lowest priority first, ties oldest first

    @precondition(lambda self: self.items)
    @rule(remote=st.booleans(), n=st.integers(1, 5))
    def sample(self, remote, n):
        s = self.call(remote, "sample", n)
        assert (s.data["id"] == s.keys).all()
        positive = any(v[1] > 0 for v in self.items.values())
        for k in s.keys.tolist():
            assert k in self.items
            assert self.items[k][1] > 0 or not positive
            self.items[k][2] += 1
        self.counts["samples"] += n
        if self.max_times_sampled:
            for k in set(s.keys.tolist()):
                if self.items[k][2] >= self.max_times_sampled:  # retired: deleted after the sample
                    del self.items[k]
                    self.counts["retired"] += 1
                    self.counts["deletes"] += 1

    @rule(
        remote=st.booleans(),
        picks=st.lists(st.integers(-2, 12), min_size=1, max_size=4),
        prio=st.sampled_from([0.0, 2.0, 5.0]),
    )
    def update(self, remote, picks, prio):
        keys = [max(0, self.next_key - 1 - i) for i in picks]
        applied = self.call(remote, "update_priorities", keys, [prio] * len(keys))
        live = {k for k in keys if k in self.items}
        assert applied == len(live)
        for k in live:
            self.items[k][1] = prio
        self.counts["skipped_updates"] += len(set(keys) - live)
        if live:
            self.max_priority = max(self.max_priority, prio)

    @rule(remote=st.booleans(), picks=st.lists(st.integers(-2, 12), min_size=0, max_size=4))
    def delete(self, remote, picks):
        keys = [max(0, self.next_key - 1 - i) for i in picks]  # any keys: live or gone, oldest or not
        live = {k for k in keys if k in self.items}
        assert self.call(remote, "delete", keys) == len(live)
        for k in live:
            del self.items[k]
        self.counts["deletes"] += len(live)
        self.counts["skipped_deletes"] += len(set(keys) - live)

    @rule(remote=st.booleans())
    def clear(self, remote):
        self.call(remote, "clear")
        self.counts["deletes"] += len(self.items)
        self.items.clear()

    @invariant()
    def agrees(self):
        if not hasattr(self, "items"):
            return
        keys = sorted(self.items)
        assert self.table.keys().tolist() == keys
        info = self.table.info(keys)
        assert info["priorities"].tolist() == [self.items[k][1] for k in keys]
        assert info["times_sampled"].tolist() == [self.items[k][2] for k in keys]
        data, _ = self.table.get(keys)
        assert data["id"].tolist() == keys and (data["obs"][:, 0] == data["id"]).all()
        stats = self.table.stats()
        assert {k: stats[k] for k in self.counts} == self.counts
        assert stats["size"] == len(keys) and len(self.table) == len(keys)


class TwoProcessesLifo(TwoProcesses):
    remover = "Lifo"
    max_times_sampled = 2


class TwoProcessesMinHeap(TwoProcesses):
    remover = "MinHeap"  # (its order lives in the segment: a tournament tree)


class TwoProcessesReserving(TwoProcesses):
    copy_outside_bytes = 0  # (every batch the ring's fast path takes reserves its slots, copies, commits)


@pytest.mark.parametrize(
    ("machine", "examples"),
    [(TwoProcesses, 25), (TwoProcessesLifo, 20), (TwoProcessesMinHeap, 15), (TwoProcessesReserving, 20)],
)
def test_two_processes_against_a_model(worker, tmp_path, machine, examples):
    machine = type(machine.__name__, (machine,), {"conn": worker, "directory": str(tmp_path)})
    run = settings(max_examples=examples, stateful_step_count=20, deadline=None)(machine).TestCase
    run("runTest").runTest()
    worker.send(("detach",))
    assert worker.recv() == ("ok", None)
    assert list(tmp_path.iterdir()) == []  # every example's table was removed
