"""A Ray start that fails tears down everything it started (issue 37 item 5).

On a loaded machine ``ray.init`` (or a cluster's start) can time out after it spawned the head's
processes (gcs_server, raylet, dashboard agents, monitors); those orphans then load the machine
further and fail every later Ray test. ``start_ray``/``start_cluster`` (tests/ray/ray_fixtures.py,
used by every Ray fixture) undo a failed attempt and try again. Failures are forced here after the
processes were spawned (the driver's connect, a node's start) and with an impossible argument.
"""

import time

import pytest
import ray_fixtures
from ray_fixtures import descendants, start_cluster, start_ray

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def no_ray():
    if ray.is_initialized():
        ray.shutdown()
    before = descendants()
    yield before
    if ray.is_initialized():
        ray.shutdown()


def settled(before, wait_s=30.0):
    """The processes this test process spawned since ``before`` that are still alive (after a grace period)."""
    deadline = time.monotonic() + wait_s
    while (left := descendants() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


class Forced(RuntimeError):
    pass


def test_a_start_that_fails_after_spawning_leaves_no_process(no_ray, monkeypatch):
    calls = []

    def connect(*a, **k):  # the head node runs by now; the driver's connection fails (a timeout)
        calls.append(len(descendants() - no_ray))
        raise Forced("forced start-up failure")

    monkeypatch.setattr(ray._private.worker, "connect", connect)
    monkeypatch.setattr(ray_fixtures, "START_ATTEMPTS", 1)  # (the slow test below retries)
    with pytest.raises(RuntimeError, match="failed 1 times") as e:
        start_ray()
    assert isinstance(e.value.__cause__, Forced)
    assert len(calls) == 1 and calls[0] > 0  # the attempt had spawned Ray's processes
    assert not ray.is_initialized()
    assert not settled(no_ray)


def test_an_impossible_argument_fails_at_once_and_leaves_nothing(no_ray):
    with pytest.raises((ValueError, TypeError)):
        start_ray(num_cpus=-1)
    assert not ray.is_initialized()
    assert not settled(no_ray)


@pytest.mark.slow
def test_a_cluster_whose_node_fails_to_start_leaves_no_process(no_ray, monkeypatch):
    from ray.cluster_utils import Cluster

    started = []
    real = Cluster.add_node

    def add_node(self, **kw):  # the head starts; adding the worker node fails
        if self.head_node is None:
            return real(self, **kw)
        started.append(len(descendants() - no_ray))
        raise Forced("forced node failure")

    monkeypatch.setattr(Cluster, "add_node", add_node)
    monkeypatch.setattr(ray_fixtures, "START_ATTEMPTS", 1)
    with pytest.raises(RuntimeError, match="failed 1 times"):
        start_cluster({"num_cpus": 1, "include_dashboard": False}, [dict(num_cpus=1)])
    assert started and started[0] > 0
    assert not ray.is_initialized()
    assert not settled(no_ray)


@pytest.mark.slow
def test_a_start_that_fails_twice_is_retried_and_serves(no_ray, monkeypatch):
    real = ray._private.worker.connect
    fails = [1, 1]

    def connect(*a, **k):
        if fails:
            fails.pop()
            raise Forced("forced start-up failure")
        return real(*a, **k)

    monkeypatch.setattr(ray._private.worker, "connect", connect)
    start_ray()
    try:
        assert ray.get(ray.put(7)) == 7
    finally:
        ray.shutdown()
    assert not settled(no_ray)
