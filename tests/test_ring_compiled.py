"""The compiled whole add / small extend (``replaystore._ring``) against the Python methods.

``Table.add`` and ``Table.extend`` are ``FastMethod`` descriptors when the extension is built: a
call the compiled path takes runs in one C call, every other one runs the Python method. The
Python methods are the reference: a table whose class calls them directly (``PyTable``) is driven
with the same random calls as a normal one, and after every call both must have returned the same
thing (or raised the same named error with the same message) and hold the same state (keys,
payloads, metadata rows, every counter, the rate limiter's counts, the model version, the
largest priority). Bad input must leave both as they were.
"""

import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore import rows
from replaystore.table.state import STATE_DTYPE

pytestmark = pytest.mark.skipif(rows.FastMethod is None, reason="replaystore._ring is not built")

SPEC = {"obs": ((3,), np.float32), "r": ((), np.float32), "n": ((), np.int64), "flag": ((), np.bool_)}


class PyTable(rs.Table):
    """The Table with its Python add / extend: the reference."""

    if rows.FastMethod is not None:
        add = rs.Table.add.__wrapped__
        extend = rs.Table.extend.__wrapped__


def limiter(kind):
    if kind == "min":
        return rs.MinSize(2)
    if kind == "ratio":  # inserts block once they run ahead of samples: the compiled path must not
        return rs.SampleToInsertRatio(1.0, 2, 12.0)
    return rs.RateLimiter(0.5, 1, -1e9, 1e9)  # a finite max_diff the compiled path computes


def make(cls, capacity, kind, staleness):
    return cls(
        capacity,
        rate_limiter=limiter(kind),
        max_staleness=staleness,
        spec=None if kind == "ratio" else SPEC,  # (with and without a spec given up front)
        seed=3,
    )


def row(rng, how):
    """One item: usually exact dtypes (the compiled path), sometimes what only the Python path takes."""
    obs = rng.standard_normal(3).astype(np.float32)
    item = {"obs": obs, "r": np.float32(rng.standard_normal()), "n": int(rng.integers(-5, 5)), "flag": True}
    if how == "pyfloat":
        item["r"] = float(rng.standard_normal())
    elif how == "f64":  # cast by the general path
        item["obs"] = obs.astype(np.float64)
    elif how == "strided":
        item["obs"] = np.repeat(obs, 2)[::2]
    elif how == "shape":  # SpecError
        item["obs"] = np.zeros(4, np.float32)
    elif how == "missing":  # SpecError
        del item["flag"]
    elif how == "extra":  # SpecError
        item["x"] = 1.0
    elif how == "order":  # the same keys in another order
        item = dict(reversed(list(item.items())))
    elif how == "np_int":
        item["n"] = np.int64(7)
    elif how == "0d":
        item["r"] = np.array(2.5, np.float32)
    elif how == "bigint":  # out of int64: the general path says so
        item["n"] = 2**70
    elif how == "str":
        item["r"] = "x"
    return item


def batch(rng, n, how):
    data = {
        "obs": rng.standard_normal((n, 3)).astype(np.float32),
        "r": rng.standard_normal(n).astype(np.float32),
        "n": rng.integers(-5, 5, n),
        "flag": rng.random(n) < 0.5,
    }
    if how == "f64":
        data["r"] = data["r"].astype(np.float64)
    elif how == "list":
        data["n"] = data["n"].tolist()
    elif how == "ragged":  # SpecError
        data["r"] = data["r"][: max(0, n - 1)]
    elif how == "fortran":
        data["obs"] = np.asfortranarray(data["obs"])
    elif how == "missing":
        del data["flag"]
    return data


ROW_KINDS = ["ok"] * 16 + [
    "pyfloat",
    "f64",
    "strided",
    "shape",
    "missing",
    "extra",
    "order",
    "np_int",
    "0d",
    "bigint",
    "str",
]
BATCH_KINDS = ["ok"] * 10 + ["f64", "list", "ragged", "fortran", "missing"]
PRIORITIES = [None] * 10 + [0.5, 3.0, 0.0, -1.0, float("nan"), float("inf"), np.float64(2.0), 1]
VERSIONS = [None] * 10 + [0, 1, 5, -3, True, np.int64(2)]

_ADD = (
    st.tuples(st.just("add"), st.sampled_from(ROW_KINDS), st.sampled_from(PRIORITIES), st.sampled_from(VERSIONS)),
    st.tuples(st.just("add_kw"), st.sampled_from(ROW_KINDS), st.sampled_from(PRIORITIES), st.sampled_from(VERSIONS)),
    st.tuples(st.just("add_locked"), st.just("ok"), st.just(None), st.just(None)),
)
_EXTEND = st.tuples(
    st.just("extend"), st.sampled_from(BATCH_KINDS), st.integers(0, 12), st.sampled_from([None] * 5 + [0.7])
)
CALLS = st.one_of(
    *_ADD,
    *_ADD,
    _EXTEND,
    _EXTEND,
    st.tuples(st.just("sample"), st.integers(1, 4)),
    st.tuples(st.just("delete_oldest"), st.sampled_from([True, True, True, False])),
    st.tuples(st.just("set_version"), st.integers(0, 6)),
    st.tuples(st.just("update"), st.floats(0.0, 4.0)),
)


def outcome(call):
    try:
        out = call()
    except Exception as exc:  # noqa: BLE001 - the outcome compared is the error's type and message
        return ("raised", type(exc).__name__, str(exc).replace("PyTable", "Table"))
    if isinstance(out, np.ndarray):
        return ("keys", out.tolist())
    if isinstance(out, rs.Sample):
        return ("sample", out.keys.tolist(), {k: v.tolist() for k, v in out.data.items()})
    return ("value", out)


def state_of(t):
    with t._lock:
        t._flush_pending()
        st_ = t._state.to_array()
        state = {name: st_[name].item() for name in STATE_DTYPE.names if not name.endswith("_blocked_s")}
        lim = t.rate_limiter
        keys = t.keys()
        slots = t._index.lookup(keys) if len(keys) else np.empty(0, np.int64)
        meta = t._meta[slots].tolist()
        payload = {k: v[slots].tolist() for k, v in t.storage.columns.items()} if t.storage.spec else {}
        return state, (lim.inserts, lim.samples, lim.deletes), keys.tolist(), meta, payload, t._ring is not None


def apply(t, call, rng):
    kind = call[0]
    if kind in ("add", "add_kw", "add_locked"):
        _, how, p, v = call
        item = row(rng, how)
        if kind == "add":
            return outcome(lambda: t.add(item, p, v, 0.0))
        if kind == "add_locked":  # the caller holds the lock already (as the logged table does)
            with t._lock:
                return outcome(lambda: t.add(item, p, v, 0.0))
        return outcome(lambda: t.add(item, priority=p, version=v, timeout=0.0))
    if kind == "extend":
        _, how, n, p = call
        data = batch(rng, n, how)
        return outcome(lambda: t.extend(data, p, timeout=0.0))
    if kind == "sample":
        return outcome(lambda: t.sample(call[1], timeout=0.0))
    if kind == "delete_oldest":  # deleting any but the oldest takes the table out of ring mode
        keys = t.keys()
        if not len(keys):
            return ("empty",)
        return outcome(lambda: t.delete(keys[:1] if call[1] else keys[-1:]))
    if kind == "set_version":
        return outcome(lambda: t.set_version(call[1]))
    keys = t.keys()
    return outcome(lambda: t.update_priorities(keys[:2], np.full(len(keys[:2]), call[1])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.integers(1, 24),
    kind=st.sampled_from(["min", "ratio", "finite"]),
    staleness=st.sampled_from([None, 2]),
    calls=st.lists(CALLS, min_size=1, max_size=40),
    seed=st.integers(0, 2**16),
)
def test_compiled_and_python_add_extend_agree(capacity, kind, staleness, calls, seed):
    fast, ref = make(rs.Table, capacity, kind, staleness), make(PyTable, capacity, kind, staleness)
    rng_fast, rng_ref = np.random.default_rng(seed), np.random.default_rng(seed)
    for call in calls:
        before = state_of(fast)
        got, want = apply(fast, call, rng_fast), apply(ref, call, rng_ref)
        assert got == want, call
        after = state_of(fast)
        assert after == state_of(ref), call
        if got[0] == "raised":  # bad input (or a refusal): nothing changed
            assert after == before, call


def test_the_compiled_path_runs_for_exact_rows_and_batches():
    t = rs.Table(8, spec=SPEC)
    rng = np.random.default_rng(0)
    t.add(row(rng, "ok"))  # (the first call builds the plan)
    writer = t._plan[3]
    assert isinstance(writer, rows.RingWriter)
    inserts = t.stats()["inserts"]
    keys = [t.add(row(rng, "ok")) for _ in range(20)] + t.extend(batch(rng, 5, "ok")).tolist()
    assert keys == list(range(1, 26)) and len(t) == 8
    assert t.stats()["inserts"] == inserts + 25 and t.stats()["evictions"] == 26 - 8
    assert t._plan[3] is writer  # still the compiled path's table
    if sys.implementation.name == "cpython" and sys.version_info[:2] in ((3, 11), (3, 12), (3, 13)):
        assert writer.peek == 1  # (the lock's layout was probed: free-lock calls do not take it)
    # the method is the Table's, documented as such
    assert rs.Table.add.__doc__ == PyTable.add.__doc__ and rs.Table.add.__name__ == "add"
    import inspect

    assert list(inspect.signature(rs.Table.add).parameters) == ["self", "item", "priority", "version", "timeout"]


def test_tables_with_a_selector_to_tell_or_placed_keep_the_python_path():
    rng = np.random.default_rng(1)
    per = rs.Table(8, sampler=rs.Prioritized(), spec=SPEC)
    per.extend(batch(rng, 3, "ok"))
    per.add(row(rng, "ok"))
    assert per._plan[3] is None
    heap = rs.Table(8, remover=rs.MinHeap(), spec=SPEC)
    heap.add(row(rng, "ok"))
    assert heap._plan is False


def test_a_blocked_add_waits_in_python_and_a_sample_frees_it():
    t = rs.Table(100, rate_limiter=rs.SampleToInsertRatio(1.0, 2, 3.0), spec=SPEC)
    rng = np.random.default_rng(2)
    keys = []
    with pytest.raises(rs.Timeout):
        for _ in range(20):
            keys.append(t.add(row(rng, "ok"), timeout=0.0))
    stats = t.stats()
    done = threading.Event()
    result = []

    def blocked_add():
        result.append(t.add(row(rng, "ok"), timeout=60.0))
        done.set()

    thread = threading.Thread(target=blocked_add)
    thread.start()
    try:
        t.sample(2, timeout=60.0)
        assert done.wait(60.0)
    finally:
        thread.join(60.0)
    assert result == [keys[-1] + 1]
    assert t.stats()["inserts"] == stats["inserts"] + 1


def test_threads_adding_at_once_lose_nothing():
    t = rs.Table(10_000, spec=SPEC)
    per_thread = 500

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(per_thread):
            t.add(row(rng, "ok"))
            t.extend(batch(rng, 3, "ok"))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120.0)
    assert len(t) == 4 * per_thread * 4
    assert t.keys().tolist() == list(range(4 * per_thread * 4))
    assert t.stats()["inserts"] == t.rate_limiter.inserts == 4 * per_thread * 4


def test_an_add_waits_while_another_thread_holds_the_lock():
    t = rs.Table(8, spec=SPEC)
    rng = np.random.default_rng(3)
    t.add(row(rng, "ok"))
    t.add(row(rng, "ok"))
    assert isinstance(t._plan[3], rows.RingWriter)
    holding, release, added = threading.Event(), threading.Event(), threading.Event()

    def hold():
        with t._lock:
            holding.set()
            release.wait(60.0)

    def add():
        t.add(row(rng, "ok"))
        t.extend(batch(rng, 2, "ok"))
        added.set()

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(60.0)
    adder = threading.Thread(target=add)
    adder.start()
    try:
        assert not added.wait(0.3)  # (it cannot finish while the lock is held, however loaded the machine)
        assert t._state.next_key == 2 and not t._meta[2:].any()  # nothing written meanwhile
    finally:
        release.set()
        holder.join(60.0)
        adder.join(60.0)
    assert added.is_set() and t.keys().tolist() == [0, 1, 2, 3, 4]
