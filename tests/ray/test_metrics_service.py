"""replaystore.metrics against real Ray services: a service, a sharded table, a restart, Ray's metrics."""

import functools
import threading
import time
import uuid

import numpy as np
import pytest
from ray_fixtures import start_ray, transitions

import replaystore as rs
from replaystore.errors import Unavailable
from replaystore.metrics import RayMetricsExporter, Recorder, ServiceSource, ShardedSource

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray()
    yield ray
    ray.shutdown()


def limited_table():
    return rs.Table(1000, rate_limiter=rs.SampleToInsertRatio(2.0, 10, 40.0), seed=0)


def test_service_source_matches_stats_shows_a_stalled_learner_and_survives_a_restart(ray_local):
    from replaystore import ray as rsr

    name = f"metrics-{uuid.uuid4().hex[:6]}"
    with pytest.raises(Unavailable, match=name):  # nothing of that name yet
        ServiceSource(name, rpc_timeout=5).read()
    client = rsr.serve({"replay": limited_table}, name=name)
    try:
        client.extend(transitions(20))
        client.sample(8)
        rec = Recorder(ServiceSource(name, rpc_timeout=30), period=60)
        snap_point = rec.poll()
        assert snap_point["ok"], snap_point["error"]
        stats = client.stats()["replay"]
        row = snap_point["tables"]["replay"]
        assert row["inserts"] == stats["inserts"] == 20 and row["samples"] == stats["samples"] == 8
        assert row["ratio_target"] == 2.0 and row["sample_waiting"] == 0
        # a learner that wants more than the limiter allows blocks inside the service: the poll shows
        # it while it waits; then inserts unblock it
        got = []
        learner = threading.Thread(target=lambda: got.append(len(client.sample(64, timeout=120))))
        learner.start()
        deadline = time.monotonic() + 60
        while True:
            p = rec.poll()["tables"]["replay"]
            if p["sample_waiting"] == 1:
                break
            assert time.monotonic() < deadline, "the blocked sample never showed"
            time.sleep(0.2)
        assert rec.latest()["tables"]["replay"]["stats"]["sample_blocked_now_s"] >= 0.0
        client.extend(transitions(10, 20))  # 2 * 30 - (8 + 64) >= -20: the limiter admits the sample
        learner.join(120)
        assert got == [64]
        # the service goes away: a point with the reason; it comes back: points again, no bogus rates
        client.shutdown()  # (ray.kill returns before the actor is gone)
        deadline = time.monotonic() + 60
        while (down := rec.poll())["ok"]:
            assert time.monotonic() < deadline, "the killed service still answers"
            time.sleep(0.2)
        assert name in down["error"]
        client = rsr.serve({"replay": limited_table}, name=name)
        client.extend(transitions(12))
        up = rec.poll()
        assert up["ok"], up["error"]
        assert up["tables"]["replay"]["inserts"] == 12 and up["tables"]["replay"]["inserts_per_s"] is None
        exporter = RayMetricsExporter(rec)
        rec.poll()
        assert exporter.writes == 1 and "inserts_per_s" in exporter._gauges
    finally:
        client.shutdown()


def make_shard(capacity=500):
    return rs.Table(capacity, sampler=rs.Prioritized(), seed=1)


def test_sharded_source_per_shard_and_total(ray_local):
    from replaystore import ray as rsr

    name = f"msh-{uuid.uuid4().hex[:6]}"
    c = rsr.serve_sharded(functools.partial(make_shard), 2, name=name, seed=5)
    try:
        c.extend(transitions(40), priorities=np.linspace(1, 2, 40))
        snap = ShardedSource(name, rpc_timeout=10).read()
        (tname,) = snap["tables"]
        t = snap["tables"][tname]
        assert len(t["shards"]) == 2 and all(s is not None for s in t["shards"])
        assert sum(s["size"] for s in t["shards"]) == t["stats"]["size"] == 40
        assert t["stats"]["capacity"] == 500 and len(t["nodes"]) == 2  # the whole table's, split over shards
        point = Recorder(ShardedSource(name, rpc_timeout=10), period=60).poll()
        assert [r["size"] for r in point["tables"][tname]["shards"]] == [s["size"] for s in t["shards"]]
    finally:
        c.shutdown()
    with pytest.raises(Unavailable, match="no shard"):
        ShardedSource(name, rpc_timeout=5).read()
