"""``update_priorities(s.indices, p)`` (the cpprb/TorchRL habit) is refused once slots differ from keys.

Issue 38 item 2: it used to return 0 after the table wrapped, counting the updates as skipped, so
prioritized replay degraded quietly. See ``replaystore.table.recent`` and docs/per.md.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore.shared import SharedTable

SPEC = {"obs": ((4,), np.float32)}


def _wrapped(capacity: int = 100, n: int = 150) -> rs.Table:
    table = rs.Table(capacity, sampler=rs.Prioritized(alpha=0.6, beta=0.4), seed=0)
    table.extend({"obs": np.zeros((n, 4), np.float32)})
    return table


@pytest.mark.parametrize("convert", [np.asarray, list, torch.as_tensor], ids=["numpy", "list", "tensor"])
def test_indices_after_a_wrap_are_refused_and_change_nothing(convert):
    table = _wrapped()
    s = table.sample(32)
    assert not np.array_equal(s.indices, s.keys)
    before_stats, before = table.stats(), table.info(s.keys)["priorities"].copy()
    with pytest.raises(rs.InvalidArgument, match=r"s\.keys"):
        table.update_priorities(convert(s.indices), np.full(32, 7.0))
    assert table.stats() == before_stats
    np.testing.assert_array_equal(table.info(s.keys)["priorities"], before)
    # the keys of the same sample work
    assert table.update_priorities(s.keys, np.full(32, 7.0)) == len(np.unique(s.keys))
    assert (table.info(s.keys)["priorities"] == 7.0).all()
    assert table.stats()["skipped_updates"] == 0


def test_before_the_first_wrap_indices_are_the_keys_and_work():
    table = _wrapped(100, 60)
    s = table.sample(16)
    np.testing.assert_array_equal(s.indices, s.keys)
    assert table.update_priorities(s.indices, np.full(16, 3.0)) == len(np.unique(s.keys))


def test_an_older_sample_still_held_by_a_prefetching_learner_is_recognised():
    table = _wrapped()
    first = table.sample(8)
    for _ in range(5):
        table.sample(8)
    with pytest.raises(rs.InvalidArgument):
        table.update_priorities(first.indices, np.ones(8))
    table.update_priorities(first.keys, np.ones(8))


def test_shared_table_refuses_indices_too(tmp_path):
    t = SharedTable.create("byidx", 16, SPEC, sampler=rs.Prioritized(), directory=tmp_path, seed=0)
    try:
        t.extend({"obs": np.zeros((40, 4), np.float32)})
        s = t.sample(8)
        with pytest.raises(rs.InvalidArgument, match="indices"):
            t.update_priorities(s.indices, np.ones(8))
        assert t.update_priorities(s.keys, np.ones(8)) == len(np.unique(s.keys))
    finally:
        t.close()
        t.unlink()


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(4, 24),
    inserts=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    batch=st.integers(2, 8),
)
@example(capacity=8, inserts=[4, 1, 6], batch=2)  # the indices of the 3rd draw are the 1st draw's keys
def test_model_keys_always_apply_indices_refused_exactly_when_they_differ(capacity, inserts, batch):
    """Against a plain model: key k of a Fifo ring lives in slot k % capacity."""
    table = rs.Table(capacity, sampler=rs.Prioritized(), seed=1)
    total = 0
    skipped = 0
    drawn = []  # every draw's keys (at most 6 draws: all kept, recent.KEPT is 8)
    for n in inserts:
        table.extend({"x": np.zeros((n, 1), np.float32)})
        total += n
        s = table.sample(batch)
        drawn.append(s.keys.copy())
        live = set(range(max(0, total - capacity), total))
        assert set(s.keys.tolist()) <= live
        np.testing.assert_array_equal(s.indices, s.keys % capacity)  # the model of the slots
        # the indices pass as keys when they are element for element a kept draw's keys
        # (this draw's: no wrap yet, or an earlier one's: then they are keys of that draw)
        if any(np.array_equal(s.indices, k) for k in drawn):  # keys: the live ones apply, the rest skip
            applied = len(set(s.indices.tolist()) & live)
            assert table.update_priorities(s.indices, np.full(batch, 2.0)) == applied
            skipped += len(np.unique(s.indices)) - applied
        else:
            with pytest.raises(rs.InvalidArgument):
                table.update_priorities(s.indices, np.full(batch, 2.0))
        assert table.update_priorities(s.keys, np.full(batch, 2.0)) == len(np.unique(s.keys))
    assert table.stats()["skipped_updates"] == skipped
