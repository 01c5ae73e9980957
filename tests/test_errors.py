"""One error family, and a call that raises changes nothing (counters included).

Every error replaystore raises on purpose for bad input or state is a ``ReplayError`` and also the
built-in exception it used to be (``ValueError``, ``TypeError``, ``TimeoutError``), so old
``except`` clauses keep working. Each bad call below runs on a table with history (evictions,
samples, deletes, a staged add) and must leave contents, metadata, ``stats()`` and the rate
limiter's counters as they were. The one exception is the ``*_blocked_s`` gauges: they measure
time spent waiting, and a call that timed out did wait.
"""

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions
from replaystore.limiters import limiter_from_config
from replaystore.samplers import selector_from_config

_WAIT_GAUGES = ("insert_blocked_s", "sample_blocked_s")


def state(t):
    keys = t.keys()
    data, found = t.get(keys)
    info = t.info(keys)
    stats = {k: v for k, v in t.stats().items() if k not in _WAIT_GAUGES}
    return {
        "keys": keys.tolist(),
        "data": {k: v.tolist() for k, v in data.items()},
        "info": {k: v.tolist() for k, v in info.items()},
        "stats": stats,
        "limiter": (t.rate_limiter.inserts, t.rate_limiter.samples, t.rate_limiter.deletes),
        "max_priority": t.max_priority,
        "version": t.version,
        "next_key": t._next_key,
    }


def busy_table(**kw):
    kw.setdefault("sampler", rs.Prioritized(alpha=0.6))
    kw.setdefault("seed", 0)
    kw.setdefault("default_timeout", 5.0)
    t = rs.Table(8, **kw)
    t.extend(transitions(6), priorities=np.arange(1.0, 7.0))
    t.extend(transitions(4, 6), priorities=2.0)  # evicts two
    if t.rate_limiter.can_sample(3):
        t.sample(3)
    t.delete(t.keys()[:1])
    t.add({k: v[0] for k, v in transitions(1, 50).items()}, priority=1.5)  # may be staged
    return t


# (name, expected error class, also-a builtin, call on a busy table)
TABLE_CALLS = [
    ("sample(0)", rs.InvalidArgument, ValueError, lambda t: t.sample(0)),
    ("sample(-1)", rs.InvalidArgument, ValueError, lambda t: t.sample(-1)),
    ("sample(2.5)", rs.InvalidArgument, ValueError, lambda t: t.sample(2.5)),
    ("sample('4')", rs.InvalidArgument, ValueError, lambda t: t.sample("4")),
    ("sample(None)", rs.InvalidArgument, ValueError, lambda t: t.sample(None)),
    ("2-D keys update", rs.InvalidArgument, ValueError, lambda t: t.update_priorities(np.array([[1, 2], [3, 4]]), 1.0)),
    ("2-D keys delete", rs.InvalidArgument, ValueError, lambda t: t.delete(np.array([[1, 2], [3, 4]]))),
    ("2-D keys get", rs.InvalidArgument, ValueError, lambda t: t.get(np.array([[1, 2]]))),
    ("2-D keys info", rs.InvalidArgument, ValueError, lambda t: t.info(np.array([[1, 2]]))),
    ("string keys", rs.InvalidArgument, ValueError, lambda t: t.delete(["a", "b"])),
    ("fractional keys", rs.InvalidArgument, ValueError, lambda t: t.update_priorities([1.5], [1.0])),
    ("ragged keys", rs.InvalidArgument, ValueError, lambda t: t.get([[1], [2, 3]])),
    ("object in", rs.InvalidArgument, ValueError, lambda t: {"k": 1} in t),
    ("set_version('x')", rs.InvalidArgument, ValueError, lambda t: t.set_version("x")),
    ("set_version(1.5)", rs.InvalidArgument, ValueError, lambda t: t.set_version(1.5)),
    ("too large, Lifo", rs.CapacityError, ValueError, None),  # built below with a Lifo remover
    ("nan priority", rs.InvalidPriority, ValueError, lambda t: t.extend(transitions(2), priorities=np.nan)),
    ("negative update", rs.InvalidPriority, ValueError, lambda t: t.update_priorities(t.keys()[:1], -1.0)),
    ("wrong dtype", rs.SpecError, ValueError, lambda t: t.extend(dict(transitions(2), id=np.zeros(2, np.float32)))),
    (
        "sample to a bogus device",
        rs.InvalidArgument,
        ValueError,
        lambda t: t.sample(2, as_tensor=True, device="bogus:0"),
    ),
    ("sample to an absent GPU", rs.InvalidArgument, ValueError, lambda t: t.sample(2, as_tensor=True, device="cuda:7")),
    ("sample timeout", rs.Timeout, TimeoutError, None),  # built below with a limiter that blocks
]


@pytest.mark.parametrize("name, error, builtin, call", TABLE_CALLS, ids=[c[0] for c in TABLE_CALLS])
def test_bad_table_call_raises_a_replay_error_and_changes_nothing(name, error, builtin, call):
    if "device" in name or "GPU" in name:
        pytest.importorskip("torch")
    if name == "too large, Lifo":
        t = busy_table(remover=rs.Lifo())
        call = lambda t: t.extend(transitions(9))  # noqa: E731
    elif name == "sample timeout":
        t = busy_table(rate_limiter=rs.MinSize(9))
        call = lambda t: t.sample(3, timeout=0.01)  # noqa: E731
    else:
        t = busy_table()
    before = state(t)
    with pytest.raises(error) as e:
        call(t)
    assert isinstance(e.value, rs.ReplayError) and isinstance(e.value, builtin)
    assert state(t) == before
    # the table still works
    k = t.extend(transitions(1, 99), priorities=1.0)
    assert k[0] in t


CONFIG_CALLS = [
    ("capacity 0", rs.InvalidArgument, lambda: rs.Table(0)),
    ("capacity -3", rs.InvalidArgument, lambda: rs.Table(-3)),
    ("max_times_sampled -1", rs.InvalidArgument, lambda: rs.Table(4, max_times_sampled=-1)),
    ("max_staleness -1", rs.InvalidArgument, lambda: rs.Table(4, max_staleness=-1)),
    ("Prioritized remover", rs.InvalidArgument, lambda: rs.Table(4, remover=rs.Prioritized())),
    ("shared selector", rs.InvalidArgument, lambda: (lambda s: rs.Table(4, sampler=s, remover=s))(rs.Fifo())),
    ("storage name", rs.InvalidArgument, lambda: rs.Table(4, storage="bogus")),
    ("storage capacity", rs.InvalidArgument, lambda: rs.Table(4, storage=rs.ColumnStorage(5))),
    ("storage capacity 0", rs.InvalidArgument, lambda: rs.ColumnStorage(0)),
    ("MinSize(0)", rs.InvalidArgument, lambda: rs.MinSize(0)),
    ("ratio 0", rs.InvalidArgument, lambda: rs.SampleToInsertRatio(0.0, 1, 10.0)),
    ("narrow error buffer", rs.InvalidArgument, lambda: rs.SampleToInsertRatio(1.0, 1, 0.5)),
    ("Queue(0)", rs.InvalidArgument, lambda: rs.Queue(0)),
    ("min_diff > max_diff", rs.InvalidArgument, lambda: rs.RateLimiter(1.0, 1, 5.0, 1.0)),
    ("alpha", rs.InvalidArgument, lambda: rs.Prioritized(alpha=-1)),
    ("beta nan", rs.InvalidArgument, lambda: rs.Prioritized(beta=float("nan"))),
    ("backend", rs.InvalidArgument, lambda: rs.Prioritized(backend="gpu")),
    ("selector type", rs.InvalidArgument, lambda: selector_from_config({"type": "Nope"})),
    ("limiter type", rs.InvalidArgument, lambda: limiter_from_config({"type": "Nope"})),
    ("iterate prefetch", rs.InvalidArgument, lambda: rs.Table(4).iterate(2, prefetch=0)),
    ("fragment buffer chunks", rs.InvalidArgument, lambda: _fragment_config(max_chunks=0)),
    ("fragment buffer lease_ttl", rs.InvalidArgument, lambda: _fragment_config(lease_ttl=0)),
    (
        "frame ring too small",
        rs.InvalidArgument,
        lambda: rs.Table(4, storage=rs.FrameStackStorage(4, "obs", "next_obs", frame_capacity=3)).extend(
            {
                "obs": np.zeros((1, 4, 2), np.float32),
                "next_obs": np.zeros((1, 4, 2), np.float32),
                "done": np.zeros(1, bool),
            }
        ),
    ),
]


def _fragment_config(**kw):
    from replaystore.fragments.buffer import FragmentBufferConfig

    return FragmentBufferConfig(**{"max_chunks": 4, "max_staleness": 1, "max_reuse": 2, **kw})


@pytest.mark.parametrize("name, error, call", CONFIG_CALLS, ids=[c[0] for c in CONFIG_CALLS])
def test_bad_configuration_is_a_replay_error_and_a_value_error(name, error, call):
    with pytest.raises(error) as e:
        call()
    assert isinstance(e.value, rs.ReplayError) and isinstance(e.value, ValueError)


def test_rate_limiter_size_errors_are_named_and_change_nothing():
    t = rs.Table(20, rate_limiter=rs.Queue(4), sampler=rs.Fifo(), max_times_sampled=1, seed=0)
    t.extend(transitions(3))
    before = state(t)
    with pytest.raises(rs.RateLimitError, match="never") as e:
        t.extend(transitions(6))
    assert isinstance(e.value, ValueError)
    with pytest.raises(rs.RateLimitError, match="never"):
        t.sample(6, timeout=0)
    assert state(t) == before


def test_timed_out_insert_counts_no_stale_items_and_keeps_max_priority():
    """An insert refused by a timeout used to count its stale items in ``dropped_stale``."""
    t = rs.Table(10, rate_limiter=rs.Queue(3), sampler=rs.Fifo(), max_times_sampled=1, max_staleness=1, seed=0)
    t.set_version(5)
    t.extend(transitions(3), version=5)  # the queue is full
    before = state(t)
    with pytest.raises(rs.Timeout):
        # one stale item (version 0 < 5 - 1), two fresh ones with a new largest priority
        t.extend(transitions(3, 3), version=[0, 5, 5], priorities=[1.0, 9.0, 9.0], timeout=0.02)
    assert state(t) == before
    assert t.stats()["dropped_stale"] == 0 and t.max_priority == 1.0
    # once there is room, the same call drops the stale item and counts it once
    t.sample(2)
    keys = t.extend(transitions(3, 3), version=[0, 5, 5], priorities=[1.0, 9.0, 9.0], timeout=1)
    assert keys.tolist() == [-1, 3, 4]
    assert t.stats()["dropped_stale"] == 1 and t.max_priority == 9.0


def test_failed_first_write_gives_its_slots_back():
    """A frame-stack storage adopts its spec in the first write; a refused first write leaks nothing."""
    t = rs.Table(4, storage=rs.FrameStackStorage(4, "obs", "next_obs"), seed=0)
    bad = {
        "obs": np.zeros((2, 3, 5), np.float32),
        "next_obs": np.zeros((2, 3, 6), np.float32),
        "done": np.zeros(2, bool),
    }
    before = state(t)
    with pytest.raises(rs.SpecError):
        t.extend(bad)
    assert state(t) == before and t._nfree == 4
    good = {
        "obs": np.zeros((4, 3, 5), np.float32),
        "next_obs": np.ones((4, 3, 5), np.float32),
        "done": np.zeros(4, bool),
    }
    assert t.extend(good).tolist() == [0, 1, 2, 3]
    assert len(t) == 4


def test_integration_type_errors_are_replay_errors():
    from replaystore.errors import InvalidType

    assert issubclass(InvalidType, TypeError) and issubclass(InvalidType, rs.ReplayError)
    gym = pytest.importorskip("gymnasium")
    from replaystore.integrations.gym import space_spec

    with pytest.raises(InvalidType):
        space_spec(gym.spaces.Text(5))
