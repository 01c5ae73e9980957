"""Node-local fragment stores on a three-node ``ray.cluster_utils.Cluster`` (raylets on 127.0.0.1).

Head and two workers each declare ``database``; the service runs on the head. Producers on the
two workers put into their own node's store (the ids name it), per-node loaders read each payload
on the node holding it (the loader's node id comes back with the result), and a worker removed
mid-run takes its fragments with it (``fragments_lost_with_node``, ``NodeLost`` for a leased record
on it) while the service keeps serving the rest.
"""

import os
import time
import uuid

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(280)

FPC = 2  # fragments per chunk


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    pytest.importorskip("lmdb")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "resources": {"database": 1}}
    )
    workers = [c.add_node(num_cpus=1, resources={"database": 1}) for _ in range(2)]
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.path.dirname(here), os.environ.get("PYTHONPATH")) if p)
    ray.init(
        address=c.address,
        namespace=f"nl-{uuid.uuid4().hex[:6]}",
        runtime_env={"env_vars": {"PYTHONPATH": path}},
        log_to_driver=False,
    )
    c.wait_for_nodes()
    yield ray, c, workers
    ray.shutdown()
    c.shutdown()


def produce(service, namespace, stream, n, fill):
    """Runs on a worker node: put ``n`` fragments into this node's store and acknowledge them."""
    import ray

    from replaystore import ray as rsr

    fc = rsr.connect(service, namespace=namespace).fragments
    out = []
    for seq in range(n):
        fid = fc.put({"obs": np.full((4, 8, 8, 3), fill + seq, np.uint8), "stream": stream})
        fc.add(fid, stream, seq, 0, "s")
        out.append(fid)
    return out, ray.get_runtime_context().get_node_id()


def where(index, payload):
    """Loader-side wrap: the record's index, the stream, and the node the loader runs on."""
    import ray

    return index, payload["stream"], int(payload["obs"][0, 0, 0, 0]), ray.get_runtime_context().get_node_id()


def test_producers_put_locally_loaders_read_locally_and_a_node_is_lost(cluster, tmp_path):
    ray, c, workers = cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import replaystore as rs
    from replaystore import ray as rsr
    from replaystore.ray.node_stores import NodeLost, label_of

    head = ray.get_runtime_context().get_node_id()
    name = f"nl-{uuid.uuid4().hex[:6]}"
    ns = ray.get_runtime_context().namespace
    cfg = rsr.FragmentBufferConfig(
        max_chunks=16,
        max_staleness=4,
        max_reuse=100,
        fragments_per_chunk=FPC,
        path=str(tmp_path / "frag"),
        num_shards=1,
        map_size=1 << 26,
        lease_ttl=None,
        node_local="database",
        seed=0,
    )
    client = rsr.serve(
        name=name,
        fragments=cfg,
        housekeeping_period=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False),
        start_timeout=120,
    )
    fc = client.fragments
    fc.update_model_version("s", 0)
    nodes = fc.store_info["nodes"]  # label -> node id: one store per node
    assert sorted(nodes.values()) == sorted([head] + [w.node_id for w in workers])
    assert all(os.path.isdir(tmp_path / "frag" / f"node-{lb}") for lb in nodes)

    task = ray.remote(produce)
    runs = ray.get(
        [
            task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(w.node_id, soft=False)).remote(
                name, ns, f"w{i}", 4, 10 * i
            )
            for i, w in enumerate(workers)
        ],
        timeout=120,
    )
    by_node = {}
    for (fids, node), w in zip(runs, workers):
        assert node == w.node_id
        assert {nodes[label_of(f)] for f in fids} == {w.node_id}  # each producer wrote into its own node's store
        by_node[w.node_id] = fids
    assert fc.stats()["replay_buffer_size_chunks"] == 4

    fetch = fc.fetch(8, timeout=60)
    assert {fc.node_of(r.fragment_id) for r in fetch.records} == {w.node_id for w in workers}  # records say where
    pool = rsr.create_loader_pool(1, 0, service=name, namespace=ns, wrap=where, per_node=True)
    assert all(ids == [nodes[lb]] for lb, ids in pool.node_ids().items())
    loaded = [
        x
        for b in rsr.data_iter(
            pool, [(i, r.fragment_id) for i, r in enumerate(fetch.records)], 4, 1, seed=0, timeout=60
        )
        for x in b
    ]
    assert len(loaded) == 8
    for index, stream, value, loader_node in loaded:
        rec = fetch.records[index]
        assert loader_node == nodes[label_of(rec.fragment_id)]  # read on the node holding it
        assert stream == rec.stream and value == 10 * int(stream[1:]) + rec.seq
    # the trainer (on the head) reads a worker's payload through that node's store: one hop
    assert fc.load(fetch.records[0].fragment_id)["stream"] == fetch.records[0].stream

    # a worker leaves while the fetch is leased
    gone = workers[1]
    c.remove_node(gone)
    deadline = time.monotonic() + 60
    while True:
        attached, lost = ray.get(client.actor.check_nodes.remote(), timeout=60)
        if lost or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert [nodes[lb] for lb in lost] == [gone.node_id]
    st = fc.stats()
    assert st["fragments_lost_with_node"] == 4 and st["nodes_lost"] == 1 and st["chunks_lost_with_node"] == 2
    assert st["replay_buffer_size_chunks"] == 2
    gone_records = [
        (i, r.fragment_id) for i, r in enumerate(fetch.records) if nodes[label_of(r.fragment_id)] == gone.node_id
    ]
    with pytest.raises(NodeLost):
        list(rsr.data_iter(pool, gone_records, 4, 0, timeout=60))
    with pytest.raises(NodeLost):
        fc.load(gone_records[0][1])
    # the service keeps serving the rest
    fetch2 = fc.fetch(4, timeout=60)
    assert {nodes[label_of(r.fragment_id)] for r in fetch2.records} == {workers[0].node_id}
    again = [
        x
        for b in rsr.data_iter(pool, [(i, r.fragment_id) for i, r in enumerate(fetch2.records)], 4, 0, timeout=60)
        for x in b
    ]
    assert len(again) == 4 and {x[3] for x in again} == {workers[0].node_id}
    with pytest.raises(rs.KeyNotFound):
        fc.release(fetch)  # the client's second fetch released its first (auto_release)
    fc.release(fetch2)
    with pytest.raises(rs.Timeout):
        fc.fetch(6, timeout=1)  # only 2 chunks left
    pool.close()
    client.shutdown()
    c.add_node(num_cpus=1, resources={"database": 1})
