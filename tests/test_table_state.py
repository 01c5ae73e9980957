"""The Table's mutable scalars live in one TableState that converts to and from a NumPy record."""

from __future__ import annotations

import numpy as np

import replaystore as rs
from conftest import transitions
from replaystore.table import STATE_DTYPE, TableState
from replaystore.table.journal import Journal


def test_state_round_trips_through_a_record():
    t = rs.Table(8, sampler=rs.Prioritized(), seed=0)
    t.extend(transitions(12), priorities=np.linspace(0.5, 3.0, 12))  # wraps: evictions
    t.sample(5)
    t.set_version(3)
    with Journal(t).locked():
        Journal(t).wal_lsn = 17
    rec = t._state.to_array()
    assert rec.dtype == STATE_DTYPE and rec.shape == ()
    back = TableState.from_array(rec)
    assert repr(back) == repr(t._state)
    assert (int(rec["next_key"]), int(rec["size"]), int(rec["nfree"])) == (12, 8, 0)
    assert (int(rec["ring_lo"]), int(rec["ring_hi"])) == (4, 12)  # the ring's bounds are in the state
    assert int(rec["evictions"]) == t.stats()["evictions"] == 4 and int(rec["wal_lsn"]) == 17
    assert float(rec["max_priority"]) == t.max_priority == 3.0 and int(rec["version"]) == t.version == 3


def test_stats_and_counters_come_from_the_state():
    t = rs.Table(4, remover=rs.Uniform(), seed=1)
    t.extend(transitions(3))
    t.extend(transitions(3, 3))  # evicts 2 chosen at random
    t.delete([99])
    st = t._state
    s = t.stats()
    assert {k: s[k] for k in ("inserts", "evictions", "skipped_deletes", "size")} == {
        "inserts": st.inserts,
        "evictions": st.evictions,
        "skipped_deletes": st.skipped_deletes,
        "size": st.size,
    }
    assert "wal_lsn" not in s and Journal(t).wal_lsn == 0  # never set by a log
    t.close()
    assert t.closed and t._state.closed == 1
