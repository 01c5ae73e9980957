"""Two simulated nodes: the store lives on the ``database`` node, the driver is elsewhere."""

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("lmdb")

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402
from ray_fixtures import start_cluster, stop_cluster  # noqa: E402
from test_minestudio_helpers import Producer, config  # noqa: E402  (puts tests/ray on the path)

from replaystore.compat.minestudio import (  # noqa: E402
    FragmentMetadata,
    ReplayBufferInterface,
    create_loader_pool,
    data_iter,
)

pytestmark = pytest.mark.timeout(240)
S = "s"


@pytest.fixture(scope="module")
def cluster():
    # torn down and retried if the start fails (tests/ray/ray_fixtures.py)
    _, c, (db_node,) = start_cluster(
        {"num_cpus": 1, "include_dashboard": False}, [dict(num_cpus=1, resources={"database": 1})]
    )
    yield c, db_node
    stop_cluster(ray, c)


def test_remote_store_and_loaders_on_the_database_node(cluster, tmp_path):
    c, db_node = cluster
    from test_minestudio_helpers import make_fragment

    buf = ReplayBufferInterface(config(tmp_path, max_reuse=1))
    head_id = ray.get_runtime_context().get_node_id()
    info = buf.fragments.store_info
    assert info["node_id"] == db_node.node_id != head_id  # placed by the database resource
    assert not buf.store.local  # the driver goes through the store actor
    buf.update_model_version(S, 0)
    for fid in range(2):
        buf.add_fragment(
            make_fragment("driver-env", fid, 0, t=8, img=(16, 16, 3)), FragmentMetadata(0, S, "driver-env", fid)
        )
    on_head = (
        ray.remote(num_cpus=0)(Producer)
        .options(scheduling_strategy=NodeAffinitySchedulingStrategy(head_id, soft=False))
        .remote(2, t=8, img=(16, 16, 3))
    )
    on_db = (
        ray.remote(num_cpus=0)(Producer)
        .options(scheduling_strategy=NodeAffinitySchedulingStrategy(db_node.node_id, soft=False))
        .remote(2, t=8, img=(16, 16, 3))
    )
    assert ray.get(on_head.store_is_local.remote(), timeout=120) is False
    assert ray.get(on_db.store_is_local.remote(), timeout=120) is True
    ray.get([on_head.produce.remote(2, 0, S), on_db.produce.remote(2, 0, S)], timeout=120)
    records = buf.fetch_fragments(10, timeout=60)
    pool = create_loader_pool(2, 0.1)
    nodes = {ray.get(a.node_id.remote(), timeout=60) for a in pool._idle_actors}
    assert nodes == {db_node.node_id}
    got = [f for b in data_iter(pool, records, 4, 1, seed=0, timeout=60) for f in b["fragment"]]
    assert sorted((f.worker_uuid, f.fid_in_worker) for f in got) == sorted(
        (i.worker_uuid, i.fid_in_worker) for i, _ in records
    )
    assert buf.load_fragment(records[0][1]).obs["image"].shape == (8, 16, 16, 3)  # through the actor
    buf.fragments.drain()
    assert buf.fragments.store.size() == 0
    buf.client.shutdown()
