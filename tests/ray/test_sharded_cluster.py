"""Shard placement on a two-node ``ray.cluster_utils.Cluster`` (two raylets on 127.0.0.1).

Spread, packed and co-located placements land where asked; a spread over more shards than nodes
fails within its timeout; a node removed mid-run takes its shard with it and a client with
``on_dead="skip"`` keeps sampling and inserting on the other one.
"""

import time
import uuid

import numpy as np
import pytest
from ray_fixtures import start_cluster, stop_cluster, transitions

import replaystore as rs
from replaystore import ray as rsr

pytestmark = pytest.mark.timeout(280)


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    ray, c, (worker,) = start_cluster(  # torn down and retried if the start fails
        {"num_cpus": 1, "include_dashboard": False},
        [dict(num_cpus=1, resources={"writers": 1})],
        namespace=f"cl-{uuid.uuid4().hex[:6]}",
    )
    yield ray, c, worker
    stop_cluster(ray, c)


def factory():
    return rs.Table(1000, sampler=rs.Prioritized(0.6, 0.4), seed=0)


def node_of(shard):
    return shard.ping()["node_id"]


def test_spread_pack_and_colocated_placements(cluster):
    ray, c, worker = cluster
    head_id = ray.get_runtime_context().get_node_id()
    worker_id = worker.node_id
    sc = rsr.serve_sharded(factory, 2, name=f"sp-{uuid.uuid4().hex[:6]}", placement="spread", placement_timeout=30)
    try:
        assert {node_of(s) for s in sc.shards} == {head_id, worker_id}
    finally:
        sc.shutdown()
    sc = rsr.serve_sharded(factory, 2, name=f"pk-{uuid.uuid4().hex[:6]}", placement="strict_pack", placement_timeout=30)
    try:
        assert len({node_of(s) for s in sc.shards}) == 1
    finally:
        sc.shutdown()
    # co-located with the writers: a writer actor reports its node, the shards go there
    writer = ray.remote(lambda: ray.get_runtime_context().get_node_id()).options(resources={"writers": 0.5})
    writer_node = ray.get(writer.remote(), timeout=60)
    assert writer_node == worker_id
    sc = rsr.serve_sharded(factory, 2, name=f"co-{uuid.uuid4().hex[:6]}", placement=[writer_node] * 2)
    try:
        assert [node_of(s) for s in sc.shards] == [worker_id, worker_id]
        keys = sc.extend(transitions(8), priorities=np.ones(8), route=np.arange(8))
        assert sc.get(keys)[1].all()
    finally:
        sc.shutdown()
    start = time.monotonic()
    with pytest.raises(rsr.PlacementError, match="2 alive node"):
        rsr.serve_sharded(factory, 3, name=f"no-{uuid.uuid4().hex[:6]}", placement="spread", placement_timeout=3)
    assert time.monotonic() - start < 60  # refused after the placement timeout, not hung


@pytest.mark.slow
def test_node_removed_mid_run_skip_keeps_serving(cluster):
    ray, c, worker = cluster
    sc = rsr.serve_sharded(
        factory,
        2,
        name=f"rm-{uuid.uuid4().hex[:6]}",
        placement="spread",
        on_dead="skip",
        skip_after=1.0,
        placement_timeout=30,
        seed=0,
    )
    try:
        keys = sc.extend(transitions(40), priorities=np.ones(40), route=np.arange(40))
        on_worker = [i for i, s in enumerate(sc.shards) if node_of(s) == worker.node_id]
        assert len(on_worker) == 1
        lost = on_worker[0]
        sc.sample(16, timeout=10)
        c.remove_node(worker)
        start = time.monotonic()
        s = sc.sample(32, timeout=30)  # the lost shard is skipped after skip_after
        assert time.monotonic() - start < 25
        assert set(((s.keys >> 40) & 0xFF).tolist()) == {1 - lost}
        new = sc.extend(transitions(4, 100), priorities=np.ones(4), timeout=10)  # round robin skips it too
        assert set(((new >> 40) & 0xFF).tolist()) == {1 - lost}
        alive_keys = keys[(keys >> 40) & 0xFF != lost]
        assert sc.get(alive_keys)[1].all()
        st = sc.stats()
        assert st["down"] == [lost] and st["shards"][lost] is None
        assert st["total"]["size"] == st["shards"][1 - lost]["size"] == 20 + 4
    finally:
        for s in sc.shards:
            try:
                ray.kill(s.actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        if sc.placement_group is not None:
            ray.util.remove_placement_group(sc.placement_group)
        worker = c.add_node(num_cpus=1, resources={"writers": 1})  # for later tests in this module
