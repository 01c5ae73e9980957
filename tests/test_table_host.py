"""The Table's host (replaystore.table.host): the one interface between a Table and where its state lives.

An in-process table has the default host; a host given at construction is bound to the table's
view and told what its hooks promise (the insert that starts, rows written before their keys,
leaving ring mode). A shared table is the Table with the segment's host (tests/test_shared_*.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions
from replaystore.placement import placed
from replaystore.table.host import HostedTable, TableHost, host_hooks


class Recording(TableHost):
    """A host that notes its hooks' calls (the table's lock is held in each: checked by a reentrant acquire)."""

    def __init__(self, refuse_ring_exit: bool = False) -> None:
        self.table: HostedTable | None = None
        self.calls: list[str] = []
        self.refuse_ring_exit = refuse_ring_exit

    def bind(self, table: HostedTable) -> None:
        self.table = table
        self.calls.append("bind")

    def await_head(self) -> None:
        self.calls.append("await_head")

    def unordered_write(self) -> None:
        self.calls.append("unordered_write")

    def reserve_outside_ring(self) -> None:
        self.calls.append("reserve_outside_ring")
        if self.refuse_ring_exit:
            raise rs.DiskFull("no room for the out-of-ring structures", path="/dev/shm/x", wanted=1)


def _state(t: rs.Table) -> tuple:
    keys = t.keys()
    return keys.tolist(), t.info(keys)["priorities"].tolist(), t.stats()


def test_the_host_is_bound_to_the_tables_view_at_construction():
    host = Recording()
    t = rs.Table(8, name="hosted", host=host)
    assert host.calls == ["bind"]
    view = host.table
    assert (view.name, view.capacity, view.storage, view.sampler) == ("hosted", 8, t.storage, t.sampler)
    assert view.ring() == (0, 0, 0)  # (a Fifo table starts in ring mode, empty)
    t.extend(transitions(3))
    assert view.ring() == (0, 3, 0) and view.slot_keys()[:3].tolist() == [0, 1, 2]
    with pytest.raises(rs.InvalidState, match="placement"):  # its parts may change: no published state
        view.state_layout()


def test_every_insert_path_starts_with_the_hosts_await_head():
    host = Recording()
    t = rs.Table(16, host=host)
    t.extend(transitions(4))  # the ring's fast path
    t.add({k: v[0] for k, v in transitions(1, 4).items()})  # a single add
    t.extend(transitions(2, 5), priorities=[1.0, 2.0])  # the general insert
    assert host.calls.count("await_head") >= 3
    assert len(t) == 7


def test_the_general_insert_tells_the_host_before_it_writes_rows_without_keys():
    host = Recording()
    t = rs.Table(8, sampler=rs.Prioritized(), host=host)
    t.extend(transitions(3), priorities=[1.0, 2.0, 3.0])
    i = host.calls.index("unordered_write")
    assert host.calls[i - 1] == "await_head"  # (the order the hooks promise: head first, then the write)


def test_leaving_ring_mode_asks_the_host_first_and_its_refusal_changes_nothing():
    host = Recording(refuse_ring_exit=True)
    t = rs.Table(8, host=host)
    keys = t.extend(transitions(6))
    before = _state(t)
    with pytest.raises(rs.DiskFull):
        t.delete([keys[3]])  # not the oldest: the table would leave ring mode
    assert host.calls[-1] == "reserve_outside_ring"
    assert _state(t) == before and host.table.ring() == (0, 6, 0)
    host.refuse_ring_exit = False
    assert t.delete([keys[3]]) == 1
    assert host.table.ring() is None and keys[3] not in t and len(t) == 5


def test_hooks_a_host_does_not_override_cost_the_table_no_call():
    class Quiet(TableHost):  # (the base's hooks are no-ops: the table keeps None and skips them)
        def bind(self, table: HostedTable) -> None:
            self.table = table

    assert host_hooks(Quiet()) == (None, None, None)
    assert all(callable(h) for h in host_hooks(Recording()))
    host = Quiet()
    t = rs.Table(8, host=host)
    t.extend(transitions(10))
    t.delete([t.keys()[2]])  # leaves ring mode without asking the host
    assert len(t) == 7 and host.table.ring() is None


def test_a_placed_tables_published_state_round_trips_through_the_view():
    host = Recording()
    with placed(lambda name, shape, dtype, fill: np.full(shape, fill, dtype)):
        t = rs.Table(8, sampler=rs.Prioritized(), host=host)
    view = host.table
    names, codes = view.state_layout()
    assert len(names) == len(codes) and "size" in names and "limiter.inserts" in names
    empty = view.state_scalars()
    t.extend(transitions(5), priorities=np.arange(1.0, 6.0))
    full = view.state_scalars()
    assert dict(zip(names, full))["size"] == 5
    view.load_state_scalars(empty)  # (another process's state: the scalars go back, the rows stay)
    assert len(t) == 0 and view.state_scalars() == empty
    view.load_state_scalars(full)
    assert len(t) == 5
    view.rebuild_from_rows(np.array([1, 3]))  # crash recovery: exactly these rows stay
    assert sorted(t.keys().tolist()) == [1, 3] and view.ring() is None
    assert set(t.sample(50).keys.tolist()) <= {1, 3}


def test_a_host_that_learns_a_hook_later_binds_it_and_the_table_calls_it_directly():
    class Late(TableHost):
        def bind(self, table: HostedTable) -> None:
            self.table = table

    host, seen = Late(), []
    t = rs.Table(8, host=host)
    t.extend(transitions(2))
    host.await_head = lambda: seen.append("head")  # (a shared table: when it opens its segment)
    assert seen == [] and host_hooks(host)[0] is host.await_head
    host.table.refresh_hooks()
    t.extend(transitions(2, 2))
    assert seen == ["head"]
    host.await_head = None  # a hook set to None is none
    host.table.refresh_hooks()
    t.extend(transitions(2, 4))
    assert seen == ["head"] and len(t) == 6
