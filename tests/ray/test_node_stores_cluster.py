"""Node-local fragment stores on one ``ray.cluster_utils.Cluster`` (raylets on 127.0.0.1).

Head and workers ``a`` and ``b`` each declare ``database``; the workers also declare the node label
``replaystore-store`` (``a``, ``b``), so a restarted worker comes back under its label. The service
runs on the head. In order (one cluster for the module):

- a full disk on one node (a 4 MiB tmpfs under ``b``'s store): puts there raise ``DiskFull`` naming
  the node, the other nodes keep accepting, ``stats()["nodes"]`` has each node's bytes and free
  space, and deleting ``b``'s payloads (fetched, released) gives its disk back;
- the MineStudio API unchanged on node-local stores (config key ``node_local``);
- the service killed and restarted by Ray: every node's store re-attached and reconciled with the
  journal, nothing acknowledged lost, payloads readable through the restarted store actors;
- worker ``a`` removed while its producer writes (a chunk half written): only its fragments are
  lost (counted), the head's producer and everything else go on; ``a`` added back under its label is
  re-attached (its old payloads are orphans: collected), and accepts fragments again;
- producers put into their own node's store, per-node loaders read each payload on the node
  holding it, and a worker removed with a fetch leased takes its fragments with it
  (``fragments_lost_with_node``, ``NodeLost`` for a leased record on it).
"""

import os
import time
import uuid

import numpy as np
import pytest
from ray_fixtures import start_cluster, stop_cluster, wait_restarted

pytestmark = pytest.mark.timeout(280)

WORKERS = ("a", "b")


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    pytest.importorskip("lmdb")
    ray, c, added = start_cluster(  # torn down and retried if the start fails
        {"num_cpus": 1, "include_dashboard": False, "resources": {"database": 1}},
        [dict(num_cpus=1, resources={"database": 1}, labels={"replaystore-store": lb}) for lb in WORKERS],
        namespace=f"nlf-{uuid.uuid4().hex[:6]}",
    )
    workers = dict(zip(WORKERS, added))
    yield ray, c, workers
    stop_cluster(ray, c)


def on(node_id):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def serve(ray, path, **kw):
    from replaystore import ray as rsr

    cfg = dict(
        max_chunks=64,
        max_staleness=4,
        max_reuse=100,
        fragments_per_chunk=1,
        path=str(path),
        num_shards=1,
        map_size=1 << 26,
        lease_ttl=None,
        node_local="database",
        seed=0,
    )
    restarts = kw.pop("max_restarts", 0)
    cfg.update(kw)
    client = rsr.serve(
        name=f"nlf-{uuid.uuid4().hex[:6]}",
        fragments=rsr.FragmentBufferConfig(**cfg),
        housekeeping_period=0,
        scheduling_strategy=on(ray.get_runtime_context().get_node_id()),
        start_timeout=120,
        max_restarts=restarts,
    )
    client.fragments.update_model_version("s", 0)
    return client


def produce(service, namespace, stream, n, nbytes=1024, start=0, collector=None):
    """On some node: put and acknowledge up to ``n`` fragments; stop at the first error.

    Returns ``(acknowledged ids, error class name or None, error message, this node)``. With a
    ``collector`` actor, every acknowledged id is reported to it at once (it outlives this node).
    """
    import ray

    import replaystore as rs
    from replaystore import ray as rsr

    fc = rsr.connect(service, namespace=namespace).fragments
    ids, err = [], (None, "")
    try:
        for seq in range(start, start + n):
            try:
                fid = fc.put({"seq": seq, "stream": stream, "blob": np.full(nbytes, seq % 251, np.uint8)})
            except rs.ReplayError as e:
                err = (type(e).__name__, str(e))
                break
            fc.add(fid, stream, seq, 0, "s")
            ids.append(fid)
            if collector is not None:
                ray.get(collector.append.remote(fid), timeout=30)
    finally:  # Ray reuses this worker process: let go of the store (its replaced shards' blocks)
        fc.store.close()
    return ids, err[0], err[1], ray.get_runtime_context().get_node_id()


class Collector:
    """Acknowledged ids reported by a producer that may die with its node."""

    def __init__(self):
        self.ids = []

    def append(self, fid):
        self.ids.append(fid)

    def get(self):
        return list(self.ids)


def run_on(ray, node_id, *args, **kw):
    return ray.remote(produce).options(num_cpus=0, scheduling_strategy=on(node_id)).remote(*args, **kw)


def check_payloads(fc, records):
    """Every record's payload reads back whole (the trainer's ``load``, on whichever node)."""
    for r in records:
        p = fc.load(r.fragment_id)
        assert p["seq"] == r.seq and p["stream"] == r.stream and int(p["blob"][-1]) == r.seq % 251


def test_a_full_disk_on_one_node(cluster, tmp_path, tmpfs_factory):
    ray, c, workers = cluster
    import replaystore as rs

    (tmp_path / "frag").mkdir()
    tmpfs_factory("4m", name="frag/node-b")  # b's store directory is a 4 MiB file system
    client = serve(ray, tmp_path / "frag")
    fc, ns = client.fragments, ray.get_runtime_context().namespace
    assert set(WORKERS) < set(fc.store_info["nodes"]) and len(fc.store_info["nodes"]) == 3  # head, a, b
    ids_b, err, msg, node_b = ray.get(
        run_on(ray, workers["b"].node_id, client.name, ns, "b", 100, 300_000), timeout=120
    )
    assert node_b == workers["b"].node_id
    assert err == "DiskFull" and "node store 'b'" in msg and node_b in msg  # names the node
    assert 3 <= len(ids_b) < 14
    # the other nodes keep accepting
    ids_a, err_a, _, _ = ray.get(run_on(ray, workers["a"].node_id, client.name, ns, "a", 4, 300_000), timeout=120)
    assert err_a is None and len(ids_a) == 4
    st = fc.stats()
    nodes = st["nodes"]
    assert nodes["b"]["node_id"] == node_b and nodes["b"]["payloads"] == len(ids_b)
    assert nodes["a"]["payloads"] == 4 and nodes["a"]["free_bytes"] > 100 << 20
    assert nodes["b"]["free_bytes"] < 300_000 and nodes["b"]["disk_bytes"] >= len(ids_b) * 300_000
    assert st["store_disk_bytes"] == sum(n["disk_bytes"] for n in nodes.values())
    assert st["fragments_added"] == len(ids_a) + len(ids_b)  # every acknowledged fragment is in the buffer
    # disk space comes back on b once its payloads are consumed
    fetch = fc.fetch(len(ids_a) + len(ids_b), timeout=30)
    check_payloads(fc, fetch.records)
    held = fc.stats()["nodes"]  # the lease, per node (the dashboard's per-node table)
    for label in ("a", "b"):
        n = sum(r.fragment_id.endswith("@" + label) for r in fetch.records)
        assert held[label]["leases"] == (n > 0) and held[label]["leased_fragments"] == n
    fc.drain()  # drops every chunk and the lease: the payloads are deleted on their nodes
    deadline = time.monotonic() + 60
    while fc.stats()["nodes"]["b"]["payloads"]:  # deletes are sent to b's store without waiting for them
        assert time.monotonic() < deadline, "b's payloads were not deleted"
        time.sleep(0.2)
    more, err, _, _ = ray.get(
        run_on(ray, workers["b"].node_id, client.name, ns, "b", 3, 300_000, start=100), timeout=120
    )
    assert err is None and len(more) == 3  # the emptied shard was replaced: its blocks went back
    assert fc.stats()["nodes"]["b"]["payloads"] == 3 and fc.stats()["nodes"]["b"]["free_bytes"] > 300_000
    with pytest.raises(rs.Timeout):
        fc.fetch(4, timeout=0.5)
    client.shutdown()


def minestudio_producer(name, namespace, worker, n):
    """MineStudio's producer code, unchanged: ``ReplayBufferInterface().add_fragment``."""
    from replaystore.compat.minestudio import FragmentMetadata, ReplayBufferInterface, SampleFragment

    buf = ReplayBufferInterface(name=name, namespace=namespace)
    out = []
    for fid in range(n):
        frag = SampleFragment(
            obs={"image": np.full((4, 8, 8, 3), fid, np.uint8)},
            action=np.zeros(4, np.int64),
            next_done=np.zeros(4, bool),
            reward=np.full(4, fid, np.float32),
            first=np.zeros(4, bool),
            in_state=[],
            worker_uuid=worker,
            fid_in_worker=fid,
            next_obs={"image": np.zeros((8, 8, 3), np.uint8)},
            episode_uuids=["e"] * 4,
        )
        out.append(buf.add_fragment(frag, FragmentMetadata(0, "s", worker, fid)))
    return out, buf.store.local


def test_the_minestudio_api_on_node_local_stores(cluster, tmp_path):
    ray, c, workers = cluster
    from replaystore.compat.minestudio import ReplayBufferInterface, create_loader_pool, data_iter
    from replaystore.ray.fragments.node_stores import label_of

    name, ns = f"ms-{uuid.uuid4().hex[:6]}", ray.get_runtime_context().namespace
    config = {
        "max_chunks": 16,
        "max_staleness": 2,
        "max_reuse": 2,
        "fragments_per_chunk": 2,
        "node_local": "database",
        "lease_ttl": None,
        "database_config": {"path": str(tmp_path / "ms"), "num_shards": 1, "map_size": 1 << 26},
    }
    buf = ReplayBufferInterface(config, name=name, namespace=ns)
    buf.update_model_version("s", 0)
    task = ray.remote(minestudio_producer)
    runs = ray.get(
        [
            task.options(num_cpus=0, scheduling_strategy=on(w.node_id)).remote(name, ns, f"env-{lb}", 4)
            for lb, w in workers.items()
        ],
        timeout=120,
    )
    for (statuses, local), _ in zip(runs, workers):
        assert statuses == ["pending", "chunk", "pending", "chunk"] and local  # written on its own node
    records = buf.fetch_fragments(8, timeout=30)
    assert {label_of(fid) for _, fid in records} == set(WORKERS)  # each payload stayed on its producer's node
    pool = create_loader_pool(1, 0, name=name, namespace=ns)  # per node: the buffer keeps node-local stores
    assert sorted(pool.labels) == sorted(buf.fragments.store_info["nodes"])
    seen = []
    for batch in data_iter(pool, records, batch_size=4, prefetch_batches=1, seed=0, timeout=60):
        for index, frag in zip(batch["index"], batch["fragment"]):
            assert frag.worker_uuid == index.worker_uuid and frag.fid_in_worker == index.fid_in_worker
            assert int(frag.obs["image"][0, 0, 0, 0]) == index.fid_in_worker
            seen.append((index.worker_uuid, index.fid_in_worker))
    assert sorted(seen) == sorted((f"env-{lb}", i) for lb in WORKERS for i in range(4))
    assert buf.load_fragment(records[0][1]).fid_in_worker == records[0][0].fid_in_worker
    assert set(buf.prepared_fragments(records)) == set(records)
    assert buf.release(records) == 8
    pool.close()
    buf.client.shutdown()


def test_the_service_restarts_and_reattaches_every_node_store(cluster, tmp_path):
    ray, c, workers = cluster
    from replaystore.ray.fragments.node_stores import label_of

    client = serve(ray, tmp_path / "frag", max_restarts=-1)
    fc, ns = client.fragments, ray.get_runtime_context().namespace
    runs = ray.get([run_on(ray, w.node_id, client.name, ns, lb, 5) for lb, w in workers.items()], timeout=120)
    acked = {fid for ids, err, _, _ in runs for fid in ids}
    assert len(acked) == 10 and all(err is None for _, err, _, _ in runs)
    held = fc.fetch(4, timeout=30)  # a lease survives the restart too
    check_payloads(fc, held.records)  # the trainer now holds handles of the store actors
    ray.kill(client.actor, no_restart=False)
    wait_restarted(client)
    st = fc.stats()
    assert st["restarts"] == 1 and st["fragments_lost_with_node"] == 0 and st["lost_nodes"] == []
    assert st["replay_buffer_size_chunks"] == 10 and st["leases"] == 1
    assert {n["payloads"] for lb, n in st["nodes"].items() if lb in WORKERS} == {5}
    assert {r.fragment_id for r in fc.prepared(held)} == {r.fragment_id for r in held.records}
    check_payloads(fc, held.records)  # through the restarted store actors (old handles are dead)
    fetch = fc.fetch(10, timeout=30)
    assert {r.fragment_id for r in fetch.records} == acked and {label_of(f) for f in acked} == set(WORKERS)
    check_payloads(fc, fetch.records)
    # producers write on after the restart
    ids, err, _, _ = ray.get(run_on(ray, workers["a"].node_id, client.name, ns, "a", 2, start=5), timeout=120)
    assert err is None and fc.stats()["replay_buffer_size_chunks"] == 12
    client.shutdown()


def test_a_node_removed_mid_put_then_back(cluster, tmp_path):
    ray, c, workers = cluster
    from replaystore.ray import NodeLost
    from replaystore.ray.fragments.node_stores import label_of

    client = serve(ray, tmp_path / "frag", fragments_per_chunk=3, orphan_grace=1.0)
    fc, ns = client.fragments, ray.get_runtime_context().namespace
    head = ray.get_runtime_context().get_node_id()
    collector = ray.remote(Collector).options(num_cpus=0, scheduling_strategy=on(head)).remote()
    doomed = run_on(ray, workers["a"].node_id, client.name, ns, "a", 100_000, 200_000, collector=collector)
    deadline = time.monotonic() + 60
    while len(ray.get(collector.get.remote(), timeout=30)) < 7:
        assert time.monotonic() < deadline, "the producer on a did not start"
        time.sleep(0.1)
    survivor = run_on(ray, head, client.name, ns, "h", 30, 200_000)  # writes on through the removal
    c.remove_node(workers["a"])  # while a's producer writes (chunks of 3: one is usually half written)
    with pytest.raises(ray.exceptions.RayError):
        ray.get(doomed, timeout=120)  # the producer died with its node (no hang)
    acked_a = set(ray.get(collector.get.remote(), timeout=30))
    ids_h, err, _, _ = ray.get(survivor, timeout=120)
    assert err is None and len(ids_h) == 30
    deadline = time.monotonic() + 60
    lost = []
    while not lost:
        assert time.monotonic() < deadline, "the service never noticed the node left"
        attached, lost = ray.get(client.actor.check_nodes.remote(), timeout=60)
        time.sleep(0.5)
    assert lost == ["a"]
    st = fc.stats()
    # everything a acknowledged lived only on a: counted (one more may have been acknowledged
    # between its add and its report to the collector)
    assert len(acked_a) <= st["fragments_lost_with_node"] <= len(acked_a) + 1
    assert st["replay_buffer_size_chunks"] == 10 and st["pending_fragments"] == 0
    with pytest.raises(NodeLost):
        fc.load(next(iter(acked_a)))  # a trainer holding one of a's records learns it by name
    fetch = fc.fetch(30, timeout=30)  # nothing else lost: every fragment of the head's producer
    assert {r.fragment_id for r in fetch.records} == set(ids_h)
    check_payloads(fc, fetch.records)
    # a comes back with its directory, under its label: re-attached, accepts fragments again
    workers["a"] = c.add_node(num_cpus=1, resources={"database": 1}, labels={"replaystore-store": "a"})
    c.wait_for_nodes()
    deadline = time.monotonic() + 60
    attached = []
    while "a" not in attached:
        assert time.monotonic() < deadline, "the returned node was not attached"
        attached, _ = ray.get(client.actor.check_nodes.remote(), timeout=60)
        time.sleep(0.5)
    assert fc.stats()["nodes_reattached"] == 1 and fc.stats()["lost_nodes"] == []
    ids, err, _, _ = ray.get(run_on(ray, workers["a"].node_id, client.name, ns, "a2", 3), timeout=120)
    assert err is None and {label_of(f) for f in ids} == {"a"} and fc.stats()["replay_buffer_size_chunks"] == 11
    time.sleep(1.2)
    fc.housekeeping()  # a's old payloads are orphans now (their chunks were counted lost): collected
    assert fc.stats()["nodes"]["a"]["payloads"] == 3
    client.shutdown()


FPC = 2  # fragments per chunk (the last test)


def produce_small(service, namespace, stream, n, fill):
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


def where_loaded(index, payload):
    """Loader-side wrap: the record's index, the stream, and the node the loader runs on."""
    import ray

    return index, payload["stream"], int(payload["obs"][0, 0, 0, 0]), ray.get_runtime_context().get_node_id()


def test_producers_put_locally_loaders_read_locally_and_a_node_is_lost(cluster, tmp_path):
    ray, c, by_label = cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    workers = list(by_label.values())

    import replaystore as rs
    from replaystore import ray as rsr
    from replaystore.ray.fragments.node_stores import NodeLost, label_of

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

    task = ray.remote(produce_small)
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
    pool = rsr.create_loader_pool(1, 0, service=name, namespace=ns, wrap=where_loaded, per_node=True)
    assert all(ids == [nodes[lb]] for lb, ids in pool.node_ids().items())
    # the loaders' queue per node: loads submitted and not collected, reported to the service
    for i, r in enumerate(fetch.records):
        pool.submit((i, r.fragment_id))
    pool.report()
    want = {lb: sum(label_of(r.fragment_id) == lb for r in fetch.records) for lb in nodes}
    deadline = time.monotonic() + 60
    while {lb: n.get("loader_queue") for lb, n in fc.stats()["nodes"].items()} != want:
        assert time.monotonic() < deadline, fc.stats()["nodes"]
        time.sleep(0.1)
    # Ray does not keep the order of calls to an async actor: a late, older report must not win
    ray.get(client.actor.note_loader_queue.remote(pool.pool_id, dict.fromkeys(nodes, 0), 0), timeout=60)
    assert {lb: n.get("loader_queue") for lb, n in fc.stats()["nodes"].items()} == want
    pool.drain(60)  # reports zeros
    deadline = time.monotonic() + 60  # (a deadline of its own: the one above may be spent by now)
    while any(n["loader_queue"] for n in fc.stats()["nodes"].values()):
        assert time.monotonic() < deadline, fc.stats()["nodes"]
        time.sleep(0.1)
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
