"""``Fifo.at`` / ``Lifo.at`` (a positional read of the order) against ``victims(size)``, the plain model."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(1, 9)),
        st.tuples(st.just("delete"), st.integers(0, 40)),
        st.tuples(st.just("clear"), st.just(0)),
    ),
    max_size=30,
)


def _check(selector, size: int, rng: np.random.Generator) -> None:
    order = selector.victims(size) if size else np.empty(0, dtype=np.int64)
    assert np.array_equal(selector.at(np.arange(size)), order)
    if size:
        pos = rng.integers(0, size, 7)
        assert np.array_equal(selector.at(pos), order[pos])


@settings(max_examples=60, deadline=None)
@given(ops=OPS, role=st.sampled_from(["remover-fifo", "sampler-fifo", "sampler-lifo"]), seed=st.integers(0, 99))
def test_at_reads_the_victims_order(ops, role, seed):
    """Following the table's ring (a Fifo remover) or its own log, with dead entries from deletes."""
    rng = np.random.default_rng(seed)
    kind = rs.Lifo if role.endswith("lifo") else rs.Fifo
    if role.startswith("remover"):
        table = rs.Table(16, remover=kind())
        selector = table.remover
    else:
        table = rs.Table(16, sampler=kind())
        selector = table.sampler
    keys: list[int] = []
    for op, arg in ops:
        if op == "extend":
            new = table.extend({"x": np.arange(arg, dtype=np.float32)})
            keys = (keys + list(np.asarray(new)))[-16:]
        elif op == "delete" and keys:
            key = keys.pop(arg % len(keys))
            table.delete([key])
        elif op == "clear":
            table.clear()
            keys = []
        _check(selector, len(table), rng)
