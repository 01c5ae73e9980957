import threading
import time

import pytest

import replaystore as rs
from conftest import transitions


def test_iterator_yields_fifo_order_from_queue_table():
    t = rs.Table.queue(100)
    t.extend(transitions(40))
    with t.iterate(8, prefetch=2, max_batches=5) as it:
        batches = [s.keys.tolist() for s in it]
    assert batches == [list(range(i, i + 8)) for i in range(0, 40, 8)]
    assert not it.alive


def test_iterator_prefetch_is_bounded():
    t = rs.Table(100, seed=0)
    t.extend(transitions(50))
    it = t.iterate(4, prefetch=3)
    time.sleep(0.3)
    # the thread drew at most `prefetch` batches plus the one it is blocked on putting
    assert t.stats()["sample_calls"] <= 4
    next(it)
    it.close()
    assert not it.alive


def test_iterator_waits_for_data_then_stops_on_close():
    t = rs.Table(100, rate_limiter=rs.MinSize(5), seed=0)
    it = t.iterate(2, prefetch=1)
    threading.Timer(0.2, lambda: t.extend(transitions(5))).start()
    s = next(it)
    assert len(s) == 2
    it.close()
    it.close()  # idempotent
    with pytest.raises(StopIteration):
        next(it)


def test_iterator_ends_when_table_closes():
    t = rs.Table(100, rate_limiter=rs.MinSize(5), seed=0)
    it = t.iterate(2)
    threading.Timer(0.2, t.close).start()
    assert list(it) == []


def test_iterator_propagates_exceptions_to_consumer():
    t = rs.Table(100, seed=0)
    it = t.iterate(3, timeout=0.3)
    with pytest.raises(rs.Timeout):
        next(it)
    assert not it.alive

    class Boom(rs.Uniform):
        calls = 0

        def sample(self, n):
            Boom.calls += 1
            if Boom.calls > 2:
                raise RuntimeError("sampler exploded")
            return super().sample(n)

    t = rs.Table(100, sampler=Boom(), seed=0)
    t.extend(transitions(10))
    it = t.iterate(2, prefetch=4)
    assert len(next(it)) == 2 and len(next(it)) == 2
    with pytest.raises(RuntimeError, match="exploded"):
        next(it)
    it.close()


def test_iterator_tensor_output():
    torch = pytest.importorskip("torch")
    t = rs.Table(100, seed=0)
    t.extend(transitions(10))
    with t.iterate(4, as_tensor=True, max_batches=2) as it:
        out = list(it)
    assert len(out) == 2 and isinstance(out[0].data["obs"], torch.Tensor)


def test_iterator_rejects_bad_prefetch():
    with pytest.raises(ValueError):
        rs.Table(10).iterate(2, prefetch=0)
