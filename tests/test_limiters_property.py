"""Rate limiters against a reference model of Reverb's rules, and real blocking in a Table.

The reference (``Ref``) is written from the rules quoted in ``replaystore.limiters``'s docstring,
in exact rational arithmetic, with ``diff = inserts * samples_per_insert - samples``:

- sample of ``n``: ``size >= min_size_to_sample`` and ``diff - n >= min_diff``;
- insert of ``n``: ``size + n <= min_size_to_sample`` or ``diff + n * samples_per_insert <= max_diff``.

Every ``samples_per_insert`` and error buffer drawn here is a dyadic rational, so the library's float
arithmetic is exact on these small counters and must agree with the reference exactly.
"""

import collections
import math
import sys
import threading
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore.limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio, Stack

MAX = sys.float_info.max
SPEC = {"x": ((), np.int64)}


def rows(values):
    return {"x": np.asarray(values, dtype=np.int64)}


class Ref:
    """Reverb's rate limiter rules, exact."""

    def __init__(self, spi, min_size, min_diff, max_diff):
        self.spi = Fraction(spi)
        self.min_size = int(min_size)
        self.min_diff = Fraction(min_diff)
        self.max_diff = Fraction(max_diff)
        self.inserts = self.samples = self.deletes = 0

    @property
    def size(self):
        return self.inserts - self.deletes

    @property
    def diff(self):
        return self.inserts * self.spi - self.samples

    def can_sample(self, n):
        return self.size >= self.min_size and self.diff - n >= self.min_diff

    def can_insert(self, n):
        return self.size + n <= self.min_size or self.diff + n * self.spi <= self.max_diff

    # the documented checks (``check_insert_size`` / ``check_sample_size`` docstrings): the
    # reachable range of diff is [min_diff, max_diff] rounded inwards to the grid diff lives on,
    # the multiples of 1/q for samples_per_insert = p/q
    def reachable_range(self):
        q = self.spi.denominator
        lo, hi = self.min_diff, self.max_diff
        if abs(lo) < MAX / 2:
            lo = Fraction(math.ceil(lo * q), q)
        if abs(hi) < MAX / 2:
            hi = Fraction(math.floor(hi * q), q)
        return lo, hi

    def insert_size_ok(self, n):
        # the lowest diff reachable from now: the current one, or what samples can bring it to
        lo, hi = self.reachable_range()
        best = min(Fraction(self.inserts) * self.spi - self.samples, lo)
        return n <= self.min_size or n * self.spi + best <= hi

    def sample_size_ok(self, n):
        lo, hi = self.reachable_range()
        return n <= hi - lo

    def copy(self):
        r = Ref(self.spi, self.min_size, self.min_diff, self.max_diff)
        r.inserts, r.samples, r.deletes = self.inserts, self.samples, self.deletes
        return r


SPIS = [0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
BUFFERS = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 12.5]


@st.composite
def limiters(draw):
    """``(limiter, Ref)`` for a valid limiter of any kind, with the parameters it should have."""
    kind = draw(
        st.sampled_from(
            ["MinSize", "SampleToInsertRatio", "SampleToInsertRatio-tuple", "Queue", "Stack", "RateLimiter"]
        )
    )
    m = draw(st.integers(1, 5))
    if kind == "MinSize":
        return MinSize(m), Ref(1, m, -MAX, MAX)
    if kind in ("Queue", "Stack"):
        size = draw(st.integers(1, 8))
        return (Queue if kind == "Queue" else Stack)(size), Ref(1, 1, 0, size)
    spi = draw(st.sampled_from(SPIS))
    if kind == "SampleToInsertRatio":
        eb = draw(st.sampled_from(BUFFERS))
        if 2 * eb < 2 * max(1.0, spi):
            with pytest.raises(ValueError, match="deadlock"):
                SampleToInsertRatio(spi, m, eb)
            eb = max(1.0, spi)
        return SampleToInsertRatio(spi, m, eb), Ref(spi, m, m * spi - eb, m * spi + eb)
    lo = draw(st.sampled_from([-8.0, -2.0, -0.5, 0.0, 1.0, 3.0]))
    width = draw(st.sampled_from([2.0, 3.0, 4.5, 8.0, 16.0]))
    width = max(width, 2 * max(1.0, spi))
    if kind == "SampleToInsertRatio-tuple":
        return SampleToInsertRatio(spi, m, (lo, lo + width)), Ref(spi, m, lo, lo + width)
    return RateLimiter(spi, m, lo, lo + width), Ref(spi, m, lo, lo + width)


ops_st = st.lists(st.tuples(st.sampled_from(["insert", "insert", "sample", "delete"]), st.integers(1, 6)), max_size=60)
table_ops_st = st.lists(
    st.tuples(st.sampled_from(["insert", "add", "add", "sample", "delete"]), st.integers(1, 6)), max_size=60
)


def assert_agree(lim, ref):
    assert (lim.inserts, lim.samples, lim.deletes) == (ref.inserts, ref.samples, ref.deletes)
    assert lim.size == ref.size
    for k in range(1, 10):
        assert lim.can_insert(k) == ref.can_insert(k), (k, ref.inserts, ref.samples, ref.deletes)
        assert lim.can_sample(k) == ref.can_sample(k), (k, ref.inserts, ref.samples, ref.deletes)


# -- construction ------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(limiters())
def test_parameters_match_the_reference(pair):
    lim, ref = pair
    assert lim.samples_per_insert == float(ref.spi)
    assert lim.min_size_to_sample == ref.min_size
    assert lim.min_diff == float(ref.min_diff) and lim.max_diff == float(ref.max_diff)
    assert (lim.inserts, lim.samples, lim.deletes) == (0, 0, 0)


def test_error_buffer_scalar_vs_tuple():
    scalar = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=5, error_buffer=4)
    # scalar e: the range is centred on min_size_to_sample * samples_per_insert = 10
    assert (scalar.min_diff, scalar.max_diff) == (6.0, 14.0)
    tup = SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=5, error_buffer=(-3, 7))
    # a tuple is the explicit (min_diff, max_diff), not an offset around anything
    assert (tup.min_diff, tup.max_diff) == (-3.0, 7.0)
    lst = SampleToInsertRatio(2.0, 5, [-3, 7])
    assert (lst.min_diff, lst.max_diff) == (-3.0, 7.0)
    assert scalar.config()["error_buffer"] == 4
    assert tup.config()["error_buffer"] == [-3, 7]
    for lim in (scalar, tup):  # config round-trips through the constructor
        again = SampleToInsertRatio(**{k: v for k, v in lim.config().items() if k != "type"})
        assert (again.min_diff, again.max_diff) == (lim.min_diff, lim.max_diff)


@pytest.mark.parametrize(
    "spi, eb",
    [
        (1.0, 0.5),  # width 1 < 2
        (1.0, 0.999),  # width 1.998 < 2
        (0.5, 0.9),  # max(1, spi) = 1: width 1.8 < 2
        (3.0, 2.9),  # width 5.8 < 6
        (3.0, (0.0, 5.0)),  # tuple: width 5 < 6
        (1.0, (4.0, 5.5)),
    ],
)
def test_sample_to_insert_ratio_refuses_deadlocking_ranges(spi, eb):
    with pytest.raises(ValueError, match="deadlock"):
        SampleToInsertRatio(spi, 3, eb)


@pytest.mark.parametrize("spi, eb", [(1.0, 1.0), (0.5, 1.0), (3.0, 3.0), (3.0, (0.0, 6.0)), (1.0, (4.0, 6.0))])
def test_sample_to_insert_ratio_accepts_the_narrowest_safe_range(spi, eb):
    lim = SampleToInsertRatio(spi, 3, eb)
    assert lim.max_diff - lim.min_diff == 2 * max(1.0, spi)


@pytest.mark.parametrize(
    "make",
    [
        lambda: RateLimiter(1.0, 0, -1, 1),  # min_size_to_sample < 1
        lambda: RateLimiter(0.0, 1, -1, 1),  # samples_per_insert <= 0
        lambda: RateLimiter(-1.0, 1, -1, 1),
        lambda: RateLimiter(1.0, 1, 2, 1),  # min_diff > max_diff
        lambda: MinSize(0),
        lambda: Queue(0),
        lambda: Stack(0),
    ],
)
def test_invalid_limiter_arguments(make):
    with pytest.raises(ValueError):
        make()


# -- the rules ---------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(limiters(), ops_st)
def test_can_insert_and_can_sample_follow_reverbs_rules(pair, ops):
    lim, ref = pair
    assert_agree(lim, ref)
    for op, n in ops:
        if op == "insert" and ref.can_insert(n):
            lim.inserts += n
            ref.inserts += n
        elif op == "sample" and ref.can_sample(n):
            lim.samples += n
            ref.samples += n
        elif op == "delete" and n <= ref.size:
            lim.deletes += n
            ref.deletes += n
        assert_agree(lim, ref)
    lim.reset()
    assert (lim.inserts, lim.samples, lim.deletes) == (0, 0, 0)


@settings(max_examples=200, deadline=None)
@given(limiters(), st.integers(1, 40))
def test_size_checks_follow_the_documented_rule(pair, n):
    lim, ref = pair
    if ref.insert_size_ok(n):
        lim.check_insert_size(n)
    else:
        with pytest.raises(ValueError, match="can never"):
            lim.check_insert_size(n)
    if ref.sample_size_ok(n):
        lim.check_sample_size(n)
    else:
        with pytest.raises(ValueError, match="can never"):
            lim.check_sample_size(n)


def reachable(ref, max_inserts):
    """All (inserts, samples) states reachable without deletes, by BFS over single-item calls.

    Bounded to ``inserts <= max_inserts`` and ``samples <= max_inserts * spi + 10`` (MinSize lets
    samples run arbitrarily far ahead of inserts).

    Singles suffice: an allowed batch call passes through intermediate states each of which a
    single-item call also allows (the conditions are monotone in the counters).
    """
    max_samples = int(max_inserts * ref.spi) + 10
    seen = {(0, 0)}
    todo = [(0, 0)]
    while todo:
        i, s = todo.pop()
        r = ref.copy()
        r.inserts, r.samples = i, s
        nxt = []
        if i < max_inserts and r.can_insert(1):
            nxt.append((i + 1, s))
        if s < max_samples and r.can_sample(1):
            nxt.append((i, s + 1))
        for state in nxt:
            if state not in seen:
                seen.add(state)
                todo.append(state)
    return seen


@st.composite
def grid_limiters(draw):
    """Usual limiters: MinSize, Queue, and SampleToInsertRatio with a scalar error buffer on or
    off the grid of diff values."""
    kind = draw(st.sampled_from(["MinSize", "SampleToInsertRatio", "Queue"]))
    m = draw(st.integers(1, 4))
    if kind == "MinSize":
        return Ref(1, m, -MAX, MAX)
    if kind == "Queue":
        return Ref(1, 1, 0, draw(st.integers(1, 6)))
    spi = draw(st.sampled_from([1.0, 2.0, 3.0, 0.5, 1.5, 0.25]))
    eb = max(1.0, spi) + draw(st.integers(0, 6)) + draw(st.sampled_from([0.0, 0.0, 0.125, 0.25, 0.5, 0.75]))
    return Ref(spi, m, m * spi - eb, m * spi + eb)


@settings(max_examples=60, deadline=None)
@given(grid_limiters(), st.integers(1, 25))
def test_size_checks_raise_exactly_for_calls_that_can_never_proceed(ref, n):
    """Without deletes: an insert must be possible now (the fresh limiter) or once sampling has
    begun (states with samples > 0).

    An insert that only the very first call could make (e.g. a batch of 4 into
    SampleToInsertRatio(1, 3, 1) while diff is still 0, below min_diff = 2) proceeds; once diff is
    in its range the same batch is refused, since it would then block forever.
    """
    lim = RateLimiter(float(ref.spi), ref.min_size, float(ref.min_diff), float(ref.max_diff))
    states = reachable(ref, max_inserts=ref.min_size + 40)
    steady = [st_ for st_ in states if st_[1] > 0]
    assert steady

    def can(states_, what):
        for i, s in states_:
            r = ref.copy()
            r.inserts, r.samples = i, s
            if what(r):
                return True
        return False

    insert_possible = n <= ref.min_size or can([(0, 0)] + steady, lambda r: r.can_insert(n))
    sample_possible = can(states, lambda r: r.can_sample(n))
    if insert_possible:
        lim.check_insert_size(n)
    else:
        with pytest.raises(ValueError):
            lim.check_insert_size(n)
    if sample_possible:
        lim.check_sample_size(n)
    else:
        with pytest.raises(ValueError):
            lim.check_sample_size(n)


def test_size_checks_with_a_fractional_error_buffer():
    # range [-0.5, 2.5]; diff = inserts - samples is an integer, so it lives in [0, 2]:
    # an insert of 3 needs diff <= -0.5 and a sample of 3 needs diff >= 2.5 -- never.
    t = rs.Table(10, rate_limiter=SampleToInsertRatio(1.0, 1, 1.5), spec=SPEC, seed=0)
    with pytest.raises(ValueError, match="can never"):
        t.extend(rows([1, 2, 3]), timeout=0.2)
    t.add({"x": 1})
    t.add({"x": 2})
    with pytest.raises(ValueError, match="can never"):
        t.sample(3, timeout=0.2)
    assert len(t.sample(2, timeout=0)) == 2  # diff 2 -> 0: the largest sample that can proceed


def test_size_checks_with_a_fractional_ratio_and_an_off_grid_buffer():
    # SampleToInsertRatio(0.5, 1, 1.25): range [-0.75, 1.75]; diff is a multiple of 0.5 and no
    # sample may take it below -0.75, so diff >= -0.5. An insert of 5 (+2.5) needs diff <= -0.75.
    t = rs.Table(100, rate_limiter=SampleToInsertRatio(0.5, 1, 1.25), spec=SPEC, seed=0)
    with pytest.raises(ValueError, match="can never"):
        t.extend(rows(range(5)), timeout=0.2)
    # an insert of 4 (+2) fits from diff -0.5: it waits (here: times out) instead of raising
    with pytest.raises(rs.Timeout):
        t.extend(rows(range(4)), timeout=0)
    t.add({"x": 0})  # diff 0.5 (size 1 <= min_size_to_sample: free)
    assert len(t.sample(1, timeout=0)) == 1  # diff -0.5
    assert len(t.extend(rows(range(4)), timeout=0)) == 4  # diff 1.5


# -- the same rules through a Table (timeout=0 makes every call a non-blocking try) --------------------


@settings(max_examples=60, deadline=None)
@given(limiters(), table_ops_st, st.integers(0, 2**16))
def test_table_calls_follow_the_reference(pair, ops, seed):
    """``add`` is an insert of 1 (the table stages runs of adds; the limiter must not notice)."""
    lim, ref = pair
    t = rs.Table(1000, rate_limiter=lim, spec=SPEC, seed=seed)
    counter = 0
    for op, n in ops:
        if op == "add":
            if ref.can_insert(1):
                assert t.add({"x": counter}, timeout=0) == counter
                counter += 1
                ref.inserts += 1
            else:
                with pytest.raises(rs.Timeout):
                    t.add({"x": -1}, timeout=0)
            continue  # no reads here: consecutive adds stay staged
        if op == "insert":
            if not ref.insert_size_ok(n):
                with pytest.raises(ValueError):
                    t.extend(rows(range(n)), timeout=0)
            elif ref.can_insert(n):
                keys = t.extend(rows(range(counter, counter + n)), timeout=0)
                assert keys.tolist() == list(range(counter, counter + n))
                counter += n
                ref.inserts += n
            else:
                with pytest.raises(rs.Timeout):
                    t.extend(rows(range(n)), timeout=0)
        elif op == "sample":
            # a sample that can proceed now does; one that would block raises ValueError if it
            # could never proceed, else waits (here: times out at once)
            if ref.size > 0 and ref.can_sample(n):
                assert len(t.sample(n, timeout=0)) == n
                ref.samples += n
            elif not ref.sample_size_ok(n):
                with pytest.raises(ValueError):
                    t.sample(n, timeout=0)
            else:
                with pytest.raises(rs.Timeout):
                    t.sample(n, timeout=0)
        else:
            k = min(n, len(t))
            assert t.delete(t.keys()[:k]) == k
            ref.deletes += k
        stats = t.stats()
        assert (stats["inserts"], stats["samples"], stats["deletes"]) == (ref.inserts, ref.samples, ref.deletes)
        assert len(t) == ref.size
        assert_agree(t.rate_limiter, ref)


# -- real blocking with threads ----------------------------------------------------------------------


def run_thread(fn, errors):
    def wrapped():
        try:
            fn()
        except BaseException as e:  # noqa: B036 - collected and asserted on by the test
            errors.append(e)

    th = threading.Thread(target=wrapped, daemon=True)
    th.start()
    return th


# "add": the table stages single adds; a waiting sampler must still be woken by one
@pytest.mark.parametrize("method", ["extend", "add"])
def test_sample_blocks_until_min_size_is_reached(method):
    t = rs.Table(100, rate_limiter=MinSize(10), spec=SPEC, seed=0)
    result = {}
    errors = []

    def insert(v):
        if method == "add":
            t.add({"x": v}, timeout=5)
        else:
            t.extend(rows([v]), timeout=5)

    def sampler():
        result["sample"] = t.sample(4, timeout=5)
        result["len_at_return"] = len(t)

    for i in range(9):
        insert(i)
    th = run_thread(sampler, errors)
    time.sleep(0.3)
    assert th.is_alive() and "sample" not in result, "sampled with only 9 of 10 items"
    # an insert from another thread: the 10th wakes the sampler
    start = time.monotonic()
    th2 = run_thread(lambda: insert(9), errors)
    th2.join(10)
    th.join(10)
    assert not errors, errors
    assert time.monotonic() - start < 2.0  # woken by the insert, not by its 5 s timeout
    assert result["len_at_return"] == 10
    assert len(result["sample"]) == 4
    assert set(result["sample"].data["x"].tolist()) <= set(range(10))


def test_sample_to_insert_ratio_holds_under_a_producer_and_a_consumer():
    spi, min_size, eb = 2.0, 5, 4.0
    min_diff, max_diff = min_size * spi - eb, min_size * spi + eb  # [6, 14]
    n_inserts = 2000
    target_samples = int(n_inserts * spi - min_diff)  # sampling drains diff down to min_diff exactly
    t = rs.Table(100, rate_limiter=SampleToInsertRatio(spi, min_size, eb), spec=SPEC, seed=0)
    errors = []
    violations = []
    done = threading.Event()

    def check(where):
        with t._cond:
            lim = t.rate_limiter
            diff = lim.inserts * spi - lim.samples
            # inserts may never push diff above max_diff (the free fill-up phase ends at
            # min_size * spi = 10 <= 14), and no sample may take it below min_diff
            if diff > max_diff or (lim.samples > 0 and diff < min_diff):
                violations.append((where, lim.inserts, lim.samples, diff))

    # Batch sizes: a sample of s waits while diff <= min_diff - 1 + s and an insert of k waits while
    # diff >= max_diff + 1 - k * spi; both wait at once (deadlock) iff s + k * spi >= max_diff -
    # min_diff + 2 = 10. Inserts of 1..2 and samples of 1..4 give at most 8.
    def producer():
        rng = np.random.default_rng(1)
        i = 0
        while i < n_inserts:
            k = int(min(rng.integers(1, 3), n_inserts - i))
            t.extend(rows(range(i, i + k)), timeout=20)
            i += k
            check("producer")

    def consumer():
        rng = np.random.default_rng(2)
        got = 0
        while got < target_samples:
            k = int(min(rng.integers(1, 5), target_samples - got))
            s = t.sample(k, timeout=20)
            got += len(s)
            check("consumer")

    def monitor():
        while not done.is_set():
            check("monitor")
            time.sleep(0.0005)

    threads = [run_thread(f, errors) for f in (producer, consumer)]
    mon = run_thread(monitor, errors)
    for th in threads:
        th.join(60)
    done.set()
    mon.join(5)
    assert not errors, errors
    assert not violations, violations[:5]
    lim = t.rate_limiter
    assert (lim.inserts, lim.samples) == (n_inserts, target_samples)
    assert lim.samples / lim.inserts == pytest.approx(spi, abs=max_diff / n_inserts)
    # no further sample can proceed, and one more insert can
    assert not lim.can_sample(1) and lim.can_insert(1)


@pytest.mark.parametrize("timeout", [0.05, 0.3])
def test_timeout_raises_after_about_that_long(timeout):
    t = rs.Table(10, rate_limiter=MinSize(3), spec=SPEC)
    t.add({"x": 0})
    start = time.monotonic()
    with pytest.raises(rs.Timeout):
        t.sample(1, timeout=timeout)
    elapsed = time.monotonic() - start
    assert timeout <= elapsed < timeout + 10.0  # (the upper bound: it ended; a loaded machine wakes late)

    q = rs.Table.queue(2, spec=SPEC)
    q.extend(rows([1, 2]))
    start = time.monotonic()
    with pytest.raises(rs.Timeout):
        q.add({"x": 3}, timeout=timeout)
    elapsed = time.monotonic() - start
    assert timeout <= elapsed < timeout + 10.0  # (the upper bound: it ended; a loaded machine wakes late)
    assert len(q) == 2 and q.stats()["inserts"] == 2  # the refused insert changed nothing


def test_default_timeout_applies_when_none_is_passed():
    t = rs.Table(10, spec=SPEC, default_timeout=0.1)
    start = time.monotonic()
    with pytest.raises(rs.Timeout):
        t.sample(1)
    assert 0.1 <= time.monotonic() - start < 10.1


def test_close_wakes_a_blocked_sampler_and_a_blocked_inserter():
    empty = rs.Table(10, spec=SPEC)
    full = rs.Table.queue(2, spec=SPEC)
    full.extend(rows([1, 2]))
    outcome = {}

    def attempt(name, fn):
        def run():
            try:
                fn()
                outcome[name] = "returned"
            except BaseException as e:  # noqa: B036 - the test inspects it
                outcome[name] = e

        th = threading.Thread(target=run, daemon=True)
        th.start()
        return th

    ths = [
        attempt("sampler", lambda: empty.sample(1)),  # no timeout: only close() can end it
        attempt("inserter", lambda: full.add({"x": 3})),
        attempt("sampler_with_timeout", lambda: empty.sample(2, timeout=30)),
    ]
    time.sleep(0.3)
    assert all(th.is_alive() for th in ths) and not outcome
    start = time.monotonic()
    empty.close()
    full.close()
    for th in ths:
        th.join(30)
    assert not any(th.is_alive() for th in ths)
    assert time.monotonic() - start < 25.0  # woken by close(), not by the 30 s timeout
    for name in ("sampler", "inserter", "sampler_with_timeout"):
        assert isinstance(outcome[name], rs.Closed), (name, outcome[name])
    assert len(full) == 2
    with pytest.raises(rs.Closed):
        empty.sample(1, timeout=0)
    with pytest.raises(rs.Closed):
        full.add({"x": 4}, timeout=0)


def test_queue_is_fifo_exactly_once_across_threads():
    size, n = 7, 1500
    q = rs.Table.queue(size, spec=SPEC, seed=0)
    errors = []
    got = []

    def producer():
        rng = np.random.default_rng(3)
        i = 0
        while i < n:
            k = int(min(rng.integers(1, size + 1), n - i))
            q.extend(rows(range(i, i + k)), timeout=20)
            i += k

    def consumer():
        rng = np.random.default_rng(4)
        while len(got) < n:
            # never ask for more than the queue holds: a producer waiting to push a batch that
            # needs more room and a consumer waiting for more items than there are would deadlock
            k = int(max(1, min(rng.integers(1, size + 1), n - len(got), len(q))))
            s = q.sample(k, timeout=20)
            assert np.all(s.times_sampled == 1)
            got.extend(s.data["x"].tolist())

    ths = [run_thread(producer, errors), run_thread(consumer, errors)]
    for th in ths:
        th.join(60)
    assert not errors, errors
    assert got == list(range(n))
    assert len(q) == 0
    stats = q.stats()
    assert stats["inserts"] == n and stats["samples"] == n and stats["retired"] == n


@pytest.mark.parametrize("kind", ["queue", "stack"])
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 5)), max_size=50), size=st.integers(1, 6))
def test_queue_and_stack_order_against_a_deque(kind, ops, size):
    t = (rs.Table.queue if kind == "queue" else rs.Table.stack)(size, spec=SPEC, seed=0)
    model = collections.deque()
    counter = 0
    for push, k in ops:
        if k > size:
            with pytest.raises(ValueError):
                (t.extend(rows(range(k)), timeout=0) if push else t.sample(k, timeout=0))
        elif push:
            if len(model) + k > size:
                with pytest.raises(rs.Timeout):
                    t.extend(rows(range(k)), timeout=0)
            else:
                t.extend(rows(range(counter, counter + k)), timeout=0)
                model.extend(range(counter, counter + k))
                counter += k
        else:
            if k > len(model):
                with pytest.raises(rs.Timeout):
                    t.sample(k, timeout=0)
            else:
                got = t.sample(k, timeout=0).data["x"].tolist()
                if kind == "queue":
                    want = [model.popleft() for _ in range(k)]
                else:
                    want = [model.pop() for _ in range(k)]
                assert got == want
        assert len(t) == len(model)
        assert sorted(t.get(t.keys())[0]["x"].tolist()) == sorted(model)


def test_stack_is_lifo():
    s = rs.Table.stack(5, spec=SPEC)
    s.extend(rows([1, 2, 3]))
    assert s.sample(2).data["x"].tolist() == [3, 2]
    s.extend(rows([4, 5]))
    assert s.sample(1).data["x"].tolist() == [5]
    assert s.sample(2).data["x"].tolist() == [4, 1]
    assert len(s) == 0


def test_insert_size_check_counts_the_starting_diff():
    # range [6, 14] for SampleToInsertRatio(2, 5, 4); a first extend of 6 lands at diff 12: allowed
    t = rs.Table(100, rate_limiter=SampleToInsertRatio(2.0, 5, 4.0), spec=SPEC, seed=0)
    assert len(t.extend(rows(range(6)), timeout=0.2)) == 6
    # now diff is 12 and samples can bring it down to 6 at best: 6 more (+12) would need diff <= 2
    with pytest.raises(ValueError, match="can never"):
        t.extend(rows(range(6)), timeout=0.2)
