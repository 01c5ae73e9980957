"""``add`` given a batch where the spec says one row (issue 38 item 3): a ``SpecError`` naming ``extend``."""

from __future__ import annotations

import numpy as np
import pytest

import replaystore as rs
from replaystore.shared import SharedTable

SPEC = {"obs": ((4,), np.float32), "done": ((), np.bool_)}
ROW = {"obs": np.zeros(4, np.float32), "done": False}
BATCH = {"obs": np.zeros((32, 4), np.float32), "done": np.zeros(32, np.bool_)}


@pytest.mark.parametrize(
    "make",
    [
        lambda: rs.Table(100, spec=SPEC),  # the ring fast path
        lambda: rs.Table(100, spec=SPEC, sampler=rs.Prioritized()),  # the staged path
        lambda: rs.Table(100, spec=SPEC, remover=rs.Lifo()),  # the general insert
    ],
    ids=["ring", "staged", "general"],
)
def test_add_of_a_batch_is_a_spec_error_naming_extend(make):
    table = make()
    for _ in range(3):
        table.add(ROW)  # (the fast paths are built after the first add)
    before = table.stats()
    with pytest.raises(rs.SpecError, match=r"expected shape \(4,\), got \(32, 4\).*extend\(\)"):
        table.add(BATCH)
    assert table.stats() == before and len(table) == 3
    assert len(table.extend(BATCH)) == 32 and len(table) == 35


def test_first_add_without_a_spec_fixes_the_row_shape():
    table = rs.Table(100)
    table.add({"obs": np.zeros((32, 4), np.float32)})  # one item of shape (32, 4), as documented
    assert len(table) == 1 and table.sample(1).data["obs"].shape == (1, 32, 4)
    with pytest.raises(rs.SpecError, match=r"expected shape \(32, 4\), got \(4,\)"):
        table.add({"obs": np.zeros(4, np.float32)})
    # a table whose first add was one row: a later batch names extend
    table = rs.Table(100)
    table.add({"obs": np.zeros(4, np.float32)})
    with pytest.raises(rs.SpecError, match="extend"):
        table.add({"obs": np.zeros((8, 4), np.float32)})


def test_shared_table_add_of_a_batch(tmp_path):
    t = SharedTable.create("addb", 16, SPEC, directory=tmp_path)
    try:
        with pytest.raises(rs.SpecError, match="extend"):
            t.add(BATCH)
        assert len(t) == 0
        t.add(ROW)
        assert len(t) == 1
    finally:
        t.close()
        t.unlink()
