"""Ring mode: a FIFO table keeps no key index, free list or selector arrays until a removal that is
not the oldest items; it must behave exactly as the same table with them (the differential model
below), and use less memory."""

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import replaystore as rs
from replaystore.keys import KeyIndex, RingIndex


def rows(n, start=0):
    return {
        "x": np.arange(start, start + n, dtype=np.float32)[:, None].repeat(3, 1),
        "y": np.arange(start, start + n, dtype=np.int64),
    }


def explicit(table):
    """The same table, forced out of ring mode before its first item."""
    table._leave_ring()
    return table


def test_a_fifo_table_starts_in_ring_mode_and_allocates_no_bookkeeping():
    t = rs.Table(1000, sampler=rs.Uniform(), seed=0)
    assert isinstance(t._index, RingIndex)
    assert t._free is None and t.sampler._set is None and t.remover._log_slots is None
    t.extend(rows(1500))
    assert t.keys().tolist() == list(range(500, 1500))
    assert isinstance(t._index, RingIndex)
    other = rs.Table(10, remover=rs.Lifo())
    assert isinstance(other._index, KeyIndex)


@pytest.mark.parametrize("how", ["delete_middle", "delete_sampled", "stale", "update_then_delete"])
def test_leaving_ring_mode_keeps_every_item(how):
    kwargs = {}
    if how == "stale":
        kwargs["max_staleness"] = 1
    t = rs.Table(50, sampler=rs.Uniform(), seed=1, **kwargs)
    ref = explicit(rs.Table(50, sampler=rs.Uniform(), seed=1, **kwargs))
    picked = None
    for table in (t, ref):
        table.extend(rows(30))
        table.set_version(1)
        versions = np.arange(40) % 2 if how == "stale" else None
        table.extend(rows(40, 30), version=versions)  # wraps: 70 keys through 50 slots
        if how == "delete_middle" or how == "update_then_delete":
            if how == "update_then_delete":
                table.update_priorities([40, 41], [3.0, 4.0])
            assert table.delete([35, 60, 999]) == 2
        elif how == "delete_sampled":  # (which keys a seeded sample picks depends on the slot layout)
            picked = t.sample(5).keys if picked is None else picked
            table.delete(picked)
        else:
            assert table.set_version(2) == 30  # versions 0: keys 20..29 and every other key from 30
    assert isinstance(t._index, KeyIndex)
    assert t.keys().tolist() == ref.keys().tolist()
    if how == "delete_sampled":
        assert len(t) == 50 - len(set(picked.tolist()))
    else:
        assert t.stats() == ref.stats()
    keys = t.keys()
    a, fa = t.get(keys)
    b, fb = ref.get(keys)
    assert fa.all() and fb.all() and all(np.array_equal(a[k], b[k]) for k in a)
    t.extend(rows(20, 100))  # and inserts keep working after the switch
    ref.extend(rows(20, 100))
    assert t.keys().tolist() == ref.keys().tolist()


def test_retiring_sampled_items_leaves_ring_mode_with_the_rest_intact():
    t = rs.Table(50, seed=4, max_times_sampled=1)
    t.extend(rows(70))
    s = t.sample(8)
    assert isinstance(t._index, KeyIndex)
    assert t.keys().tolist() == [k for k in range(20, 70) if k not in set(s.keys.tolist())]
    data, found = t.get(t.keys())
    assert found.all() and np.array_equal(data["y"], t.keys())
    assert t.stats()["retired"] == len(set(s.keys.tolist()))


def test_removing_exactly_the_oldest_keeps_ring_mode():
    q = rs.Table.queue(10)
    q.extend(rows(8))
    assert q.sample(3).keys.tolist() == [0, 1, 2]  # retired: the oldest run
    assert isinstance(q._index, RingIndex)
    q.extend(rows(5, 8))
    assert q.sample(10, timeout=1).keys.tolist() == list(range(3, 13))
    t = rs.Table(10)
    t.extend(rows(10))
    assert t.delete([0, 1]) == 2 and isinstance(t._index, RingIndex)
    t.clear()
    assert isinstance(t._index, RingIndex) and len(t) == 0
    t.extend(rows(3, 50))
    assert t.keys().tolist() == [10, 11, 12]


def test_fast_paths_refuse_bad_input_and_change_nothing():
    t = rs.Table(16, seed=0)
    t.extend(rows(10))
    before = (t.stats(), t.keys().tolist())
    bad = [
        {"x": np.zeros((2, 3), np.float64), "y": np.zeros(2, np.int64)},  # dtype
        {"x": np.zeros((2, 4), np.float32), "y": np.zeros(2, np.int64)},  # shape
        {"x": np.zeros((2, 3), np.float32), "y": np.zeros(3, np.int64)},  # batch sizes differ
        {"x": np.zeros((2, 3), np.float32)},  # a missing field
    ]
    for i, b in enumerate(bad):
        with pytest.raises(rs.SpecError):
            t.extend(b)
        if i != 2:  # (one row of that batch is a valid item)
            with pytest.raises(rs.SpecError):
                t.add({k: v[0] for k, v in b.items()})
    with pytest.raises(rs.SpecError):
        t.add({"x": np.zeros(3, np.float32), "y": 1.5})  # a float into an int field
    assert (t.stats(), t.keys().tolist()) == before


def test_single_adds_and_batches_across_the_wrap_match_the_explicit_table():
    t = rs.Table(7, seed=3)
    ref = explicit(rs.Table(7, seed=3))
    for table in (t, ref):
        for i in range(5):
            table.add({"x": np.full(3, i, np.float32), "y": i})
        table.extend(rows(4, 5))  # wraps around slot 7
        table.add({"x": np.zeros(3, np.float32), "y": np.int64(9)}, priority=2.0, version=4)
        table.extend(rows(9, 10))  # larger than the table: the newest 7 stay
    assert t.keys().tolist() == ref.keys().tolist() == list(range(12, 19))
    assert t.stats() == ref.stats()
    a, _ = t.get(t.keys())
    assert a["y"].tolist() == list(range(12, 19))


def test_checkpoint_round_trip_stays_in_ring_mode(tmp_path):
    t = rs.Table(100, seed=5)
    t.extend(rows(250))
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    assert isinstance(u._index, RingIndex) and u.keys().tolist() == t.keys().tolist()
    s = u.sample(20)
    assert np.array_equal(s.data["y"], s.keys)
    u.extend(rows(30, 250))  # and goes on from the same keys
    assert u.keys().tolist() == list(range(180, 280))
    t.delete([160])
    t.save(tmp_path / "ck2")
    v = rs.Table.load(tmp_path / "ck2")
    assert isinstance(v._index, KeyIndex) and v.keys().tolist() == t.keys().tolist()


class RingAgainstExplicit(RuleBasedStateMachine):
    """Random operations on a ring-mode table and on the same table without ring mode."""

    # Which keys a sample picks depends on the slot layout (the two tables may place a key in
    # different slots after a batch larger than the table or a clear), so samples are compared
    # as counts (not which items' times_sampled they raised), and retirement, which depends on
    # the picks, is left to test_table_model.py (ring mode against a plain model) and the tests
    # above.

    @initialize(capacity=st.integers(1, 12), prioritized=st.booleans(), seed=st.integers(0, 3))
    def setup(self, capacity, prioritized, seed):
        def make():
            sampler = rs.Prioritized(0.7, 0.5) if prioritized else rs.Uniform()
            return rs.Table(capacity, sampler=sampler, max_staleness=2, seed=seed)

        self.ring, self.ref = make(), explicit(make())
        self.next = 0

    def both(self, f):
        results = []
        for table in (self.ring, self.ref):
            try:
                results.append(("ok", f(table)))
            except rs.ReplayError as e:
                results.append(("error", type(e)))
        assert results[0][0] == results[1][0], results
        return results[0]

    @rule(n=st.integers(1, 15), prios=st.booleans())
    def extend(self, n, prios):
        p = np.linspace(0.5, 2.0, n) if prios else None
        out = self.both(lambda t: t.extend(rows(n, self.next), priorities=p).tolist())
        self.next += n
        assert out[0] == "ok"

    @rule(priority=st.sampled_from([None, 0.5, 3.0]), version=st.sampled_from([None, 0, 5]))
    def add(self, priority, version):
        item = {"x": np.full(3, self.next, np.float32), "y": self.next}
        self.both(lambda t: t.add(item, priority=priority, version=version))
        self.next += 1

    @rule(n=st.integers(1, 5))
    def sample(self, n):
        def draw(t):
            if len(t) == 0:
                return None
            s = t.sample(n, timeout=0)
            data, found = t.get(s.keys)
            assert found.all() and np.array_equal(data["y"], s.data["y"])  # live keys, their payloads
            return len(s.keys)

        self.both(draw)

    @rule(k=st.integers(0, 40))
    def delete(self, k):
        a = self.both(lambda t: t.delete([k, k + 1]))
        assert a[0] == "ok"

    @rule(v=st.integers(0, 8))
    def set_version(self, v):
        self.both(lambda t: t.set_version(v))

    @rule()
    def clear(self):
        self.both(lambda t: t.clear())

    @rule(k=st.integers(0, 40), p=st.floats(0.1, 5.0))
    def update(self, k, p):
        self.both(lambda t: t.update_priorities([k], [p]))

    @invariant()
    def same(self):
        if not hasattr(self, "ring"):
            return
        keys = self.ring.keys()
        assert keys.tolist() == self.ref.keys().tolist()
        if len(keys):
            a, fa = self.ring.get(keys)
            b, fb = self.ref.get(keys)
            assert fa.all() and fb.all() and np.array_equal(a["y"], b["y"])
        sa, sb = self.ring.stats(), self.ref.stats()
        assert sa.keys() == sb.keys()
        # (times sampled: a seeded sample draws by slot, and the slots differ; float means: summed in slot order)
        for k in sa.keys() - {"times_sampled_max", "times_sampled_mean", "times_sampled_histogram"}:
            assert sa[k] == pytest.approx(sb[k], rel=1e-12) if isinstance(sa[k], float) else sa[k] == sb[k], k
        ia, ib = self.ring.info(keys), self.ref.info(keys)
        for k in ("found", "priorities", "versions"):
            assert np.array_equal(ia[k], ib[k]), k


RingAgainstExplicit.TestCase.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
test_ring_against_explicit = RingAgainstExplicit.TestCase


@pytest.mark.parametrize("prioritized", [False, True])
def test_episodic_tables_run_in_ring_mode_until_a_delete(prioritized):
    def make():
        sampler = rs.Prioritized(0.6, 0.4) if prioritized else rs.Uniform()
        return rs.Table(40, sampler=sampler, seed=2, episodes=rs.Episodes(max_streams=4, sequence_length=3))

    t, ref = make(), explicit(make())
    for table in (t, ref):
        for step in range(60):  # 4 interleaved streams, episodes of 7 steps, through 40 slots
            table.add_step(
                {"obs": np.float32([step]), "reward": np.float32(1)}, stream=step % 4, terminated=(step // 4) % 7 == 6
            )
    assert isinstance(t._index, RingIndex)
    assert prioritized or t.sampler._set is None
    assert sorted(t._episodes.live.contents().tolist()) == sorted(ref._episodes.live.contents().tolist())
    for table in (t, ref):
        table.delete([45])
    assert isinstance(t._index, KeyIndex)
    assert sorted(t._episodes.live.contents().tolist()) == sorted(ref._episodes.live.contents().tolist())
    if not prioritized:
        assert t._episodes.live is t.sampler._set
    for table in (t, ref):
        s = table.sample_sequences(16, 3)
        keys = s.step_keys
        assert (np.diff(keys, axis=1) == 4).all()  # consecutive steps of one stream, none crosses key 45
        assert not np.isin(keys, [45]).any()
    assert t.episode_info(t.keys()).positions.tolist() == ref.episode_info(ref.keys()).positions.tolist()


def test_fast_paths_respect_a_rate_limiter():
    limiter = rs.SampleToInsertRatio(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=(0, 4))
    t = rs.Table(100, rate_limiter=limiter, seed=0)
    t.extend(rows(2))
    t.extend(rows(2, 2))
    assert t._plan  # the fast path is on for this table
    before = (t.stats(), t.keys().tolist())
    with pytest.raises(rs.Timeout):
        t.extend(rows(2, 4), timeout=0.05)  # 6 inserts, 0 samples: over the error buffer
    with pytest.raises(rs.Timeout):
        t.add({"x": np.zeros(3, np.float32), "y": 1}, timeout=0.05)
    after = t.stats()
    assert {k: v for k, v in after.items() if k != "insert_blocked_s"} == {
        k: v for k, v in before[0].items() if k != "insert_blocked_s"
    }
    assert t.keys().tolist() == before[1]
    t.sample(4)
    assert t.extend(rows(2, 4)).tolist() == [4, 5]
