"""replaystore.ray hosting Tables: Ape-X style writers, a prioritized learner, timeouts, restarts."""

import functools
import signal
import threading
import time
import uuid

import numpy as np
import pytest
from ray_fixtures import start_ray, transitions

import replaystore as rs

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray(resources={"database": 1})
    yield ray
    ray.shutdown()


def per_table():
    return rs.Table(10_000, sampler=rs.Prioritized(0.6, 0.4), remover=rs.Fifo(), seed=0)


@pytest.fixture(scope="module")
def svc(ray_local):
    from replaystore import ray as rsr

    client = rsr.serve({"per": per_table, "queue": functools.partial(rs.Table.queue, 4)}, name="svc-tables")
    yield client
    client.shutdown()


def test_local_ray_listens_on_loopback(ray_local):
    assert ray_local.util.get_node_ip_address() == "127.0.0.1"


def test_table_api_round_trip(svc):
    c = svc.table("per")
    keys = c.extend(transitions(100), priorities=np.linspace(0.1, 1.0, 100), timeout=5)
    assert keys.dtype == np.int64 and len(keys) == 100
    assert (
        c.add(
            transitions(1, 100) | {"obs": np.zeros(4, np.float32), "action": 1, "reward": 0.5, "id": 100}, priority=0.5
        )
        == 100
    )
    s = c.sample(32, timeout=5)
    assert s.data["obs"].shape == (32, 4) and np.all(s.weights <= 1.0)
    assert c.update_priorities(s.keys, np.full(32, 2.0)) == len(np.unique(s.keys))
    data, found = c.get(keys[:3])
    assert found.all() and list(data["id"]) == [0, 1, 2]
    assert c.info(keys[:2])["priorities"].shape == (2,)
    assert c.delete(keys[:10]) == 10
    assert len(c) == 91
    assert c.set_version(3) == 0
    st = svc.stats()
    assert st["per"]["size"] == 91 and st["per"]["version"] == 3 and "queue" in st


def test_errors_come_back_as_replaystore_errors(svc):
    c = svc.table("per")
    with pytest.raises(rs.SpecError):
        c.extend({"obs": np.zeros((2, 9), np.float32)})
    with pytest.raises(rs.InvalidPriority):
        c.update_priorities([0], [float("nan")])
    with pytest.raises(rs.KeyNotFound):
        svc.table("nope").sample(1, timeout=1)


def test_blocking_calls_time_out_and_do_not_block_the_service(svc):
    q = svc.table("queue")
    q.clear()
    t0 = time.monotonic()
    with pytest.raises(rs.Timeout):
        q.sample(1, timeout=0.5)
    assert time.monotonic() - t0 < 30  # the timeout ended it (a loaded machine's Ray calls are slow)
    q.extend(transitions(4))
    with pytest.raises(rs.Timeout):
        q.extend(transitions(1), timeout=0.3)  # the queue is full
    # a sample that waits in a worker thread while other calls go on
    q.sample(4, timeout=5)
    got = {}
    th = threading.Thread(target=lambda: got.setdefault("s", q.sample(2, timeout=20)))
    th.start()
    time.sleep(0.5)
    assert svc.table("per").stats()["per"]["size"] >= 0  # the service answers meanwhile
    q.extend(transitions(2, 50), timeout=5)
    th.join(30)
    assert list(got["s"].data["id"]) == [50, 51]


def test_iterate_keeps_samples_in_flight_and_stops_exactly(svc):
    c = svc.table("per")
    c.extend(transitions(64, 1000), timeout=5)
    calls = c.stats()["per"]["sample_calls"]
    batches = list(c.iterate(16, prefetch=3, max_batches=5, timeout=5))
    assert [len(b) for b in batches] == [16] * 5
    assert all(np.isin(b.data["id"], np.arange(1064)).all() for b in batches)
    assert c.stats()["per"]["sample_calls"] == calls + 5  # max_batches caps the calls in flight too

    q = svc.table("queue")
    q.clear()
    q.extend(transitions(4, 70), timeout=5)
    # one call in flight: the service serves calls on threads, so a second call in flight could take an
    # item before the first (which would then time out on the emptied queue: seen on a loaded machine)
    it = q.iterate(1, prefetch=1, timeout=0.5)
    assert sorted(int(next(it).data["id"][0]) for _ in range(4)) == [70, 71, 72, 73]  # each item once
    with pytest.raises(rs.Timeout):
        next(it)  # the queue is empty: the error comes out of next()
    with pytest.raises(ValueError, match="prefetch"):
        q.iterate(1, prefetch=0)


def test_apex_writers_and_learner(ray_local, svc):
    """Several writer actors insert batches inline while a learner samples and updates priorities."""
    from replaystore import ray as rsr

    @ray_local.remote(num_cpus=0)
    def writer(i, n_batches):
        c = rsr.connect("svc-tables", table="per")
        for b in range(n_batches):
            batch = transitions(64, start=(i * 1000 + b * 64))
            c.extend(batch, priorities=np.ones(64), timeout=10)
        return n_batches * 64

    c = svc.table("per")
    before = c.stats()["per"]["inserts"]
    refs = [writer.remote(i, 10) for i in range(3)]
    updates = 0
    while updates < 20:
        s = c.sample(128, timeout=30)
        updates += 1
        c.update_priorities(s.keys, np.abs(np.random.default_rng(updates).normal(size=128)) + 1e-3)
    assert sum(ray_local.get(refs, timeout=120)) == 3 * 640
    assert c.stats()["per"]["inserts"] - before == 3 * 640


def test_pipelined_extend_async(ray_local, svc):
    c = svc.table("per")
    refs = [c.extend_async(transitions(16, 5000 + 16 * i)) for i in range(8)]
    keys = ray_local.get(refs, timeout=60)
    assert all(len(k) == 16 for k in keys)


def test_serve_and_connect_errors(svc):
    from replaystore import ray as rsr

    with pytest.raises(ValueError, match="already exists"):
        rsr.serve(per_table, name="svc-tables")
    with pytest.raises(ValueError, match="no replay service"):
        rsr.connect("does-not-exist")
    assert rsr.connect("svc-tables").table_name in ("per", "queue")


def test_checkpoint_and_restart(ray_local, tmp_path):
    from replaystore import ray as rsr

    c = rsr.serve(functools.partial(rs.Table, 1000), name="svc-restart", max_restarts=2, checkpoint_dir=str(tmp_path))
    c.extend(transitions(50), timeout=5)
    assert c.save() == [str(tmp_path / "default")]
    c.extend(transitions(5, 50), timeout=5)  # not checkpointed: lost in the crash
    ray_local.kill(c.actor, no_restart=False)
    deadline = time.monotonic() + 60
    while True:  # ray.kill is asynchronous: the old actor may still answer the first pings
        try:
            if c.ping()["restarted"]:
                break
        except (rs.Closed, rs.Timeout):
            pass
        assert time.monotonic() < deadline, "the service did not restart"
        time.sleep(0.2)
    assert len(c) == 50
    c.close()
    with pytest.raises(rs.Closed):
        c.sample(1, timeout=1)
    c.shutdown()


def test_stats_reach_the_monitor_sinks(ray_local, tmp_path):
    pytest.importorskip("tensorboard")
    from replaystore import ray as rsr

    logdir = tmp_path / "tb"
    c = rsr.serve(
        functools.partial(rs.Table, 100),
        name="svc-monitor",
        report_period=0.3,
        sinks=["logging", f"tensorboard:{logdir}"],
    )
    c.extend(transitions(10), timeout=5)
    deadline = time.monotonic() + 30
    while not list(logdir.glob("events.out.tfevents.*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(logdir.glob("events.out.tfevents.*"))
    scalars = c.reporter(sinks=[], period=60).report()  # the client-side reporter flattens the same stats
    assert scalars["default/size"] == 10.0
    c.shutdown()


class Alarm(Exception):
    pass


def _alarm(signum, frame):
    raise Alarm


@pytest.fixture
def service(ray_local):
    from replaystore import ray as rsr

    c = rsr.serve(lambda: rs.Table(100, seed=0), name=f"waits-{uuid.uuid4().hex[:8]}")
    yield c
    c.shutdown()


def test_blocked_sample_warns_in_the_caller_and_is_interruptible(service, monkeypatch):
    """Issue 38 item 6: the warning reaches the caller's process, a signal handler runs while it waits."""
    from replaystore.ray import _runtime

    monkeypatch.setattr(_runtime, "BLOCKING_WARNING_S", 0.5)
    old = signal.signal(signal.SIGALRM, _alarm)
    t0 = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 2.0)
        with pytest.warns(rs.BlockingWarning, match="no timeout"), pytest.raises(Alarm):
            service.sample(4)  # an empty table, no timeout: would wait for good
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - t0 < 10  # the handler ran while the call waited
    service.extend(transitions(10))  # still usable (the abandoned sample takes its 4 on the service)
    s = service.sample(2, timeout=5)
    assert len(s.keys) == 2


def test_calls_with_a_timeout_do_not_warn(service, monkeypatch, recwarn):
    from replaystore.ray import _runtime

    monkeypatch.setattr(_runtime, "BLOCKING_WARNING_S", 0.0)
    with pytest.raises(rs.Timeout):
        service.sample(4, timeout=0.6)
    service.extend(transitions(3))
    assert np.asarray(service.keys()).size == 3
    assert not [w for w in recwarn if issubclass(w.category, rs.BlockingWarning)]
