"""Node-local fragment stores vs one store: payload bytes moved between nodes per fragment.

A simulated cluster (``ray.cluster_utils.Cluster``: head + 2 workers on 127.0.0.1, each declaring
``database``). The service runs on the head; one producer task on each worker puts ``--per-producer``
MineStudio-sized fragments (64x128x128x3 uint8, 3 MiB) and acknowledges them; a trainer task on
worker 1 fetches them all and reads them through a loader pool with ``data_iter``.

- one store (today): the store is on the head; each put from a worker goes through the store
  actor (one hop), the loaders run on the head, and each result travels to the trainer (one hop).
- node-local: each producer writes into its own node's store (no hop); per-node loaders read each
  payload on its node, and only results from another node than the trainer's cross (one hop).

Bytes moved are counted from where things ran (a proxy for Ray's transfer counters): a put
crosses when the producer's node is not the node of the store it wrote into; a loaded payload
crosses when the loader's node is not the trainer's. Also fragments/s in (puts + acks) and out
(fetch + loads), wall time on a shared machine (loaded), and CPU seconds per fragment of each
process (read from ``/proc``: all nodes are processes of this machine): the metadata service, the
store actor (one store), a producer, the trainer.

``--calls N`` then measures the metadata service alone: N ``add`` calls of payload-less ids, and
the same N as ``add_many`` batches of 64, as service CPU per acknowledged fragment (the figures
the cost model in docs/ray.md uses).

    PYTHONPATH=src python bench/bench_node_stores.py --per-producer 8 --calls 2000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402

SHAPE = (64, 128, 128, 3)
TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def created_bytes() -> int:
    """Bytes ever created in the object stores of every alive node (Ray's ``cumulative_created_bytes``).

    A payload passed through Ray is created once where it is produced and once more in every node
    it is pulled to, so this counts Ray's own copies, transfers included.
    """
    import ray
    from ray._private import internal_api

    total = 0
    for n in ray.nodes():
        if n.get("Alive"):
            st = internal_api.node_stats(n["NodeManagerAddress"], n["NodeManagerPort"], include_memory_info=False)
            total += st.store_stats.cumulative_created_bytes
    return total


def pid_of(actor) -> int:
    """The process id of a Ray actor."""
    import ray

    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60)


def produce(service: str, namespace: str, stream: str, n: int) -> tuple[list[str], str, float, str | None, float]:
    """Put ``n`` fragments and acknowledge them; returns ids, this node, seconds, the store's node, CPU s."""
    import ray

    from replaystore import ray as rsr

    fc = rsr.connect(service, namespace=namespace).fragments
    frag = {"obs": np.random.default_rng(0).integers(0, 255, SHAPE, dtype=np.uint8)}
    fc.store  # noqa: B018 - open the store before the clock starts
    t0, c0 = time.perf_counter(), time.process_time()
    ids = []
    for seq in range(n):
        fid = fc.put(frag)
        fc.add(fid, stream, seq, 0, "s")
        ids.append(fid)
    cpu = time.process_time() - c0
    fc.store.close()
    return ids, ray.get_runtime_context().get_node_id(), time.perf_counter() - t0, fc.store_info["node_id"], cpu


def where(index, payload):
    """Loader side: the payload travels to the trainer, with the node it was read on."""
    import ray

    return index, payload["obs"], ray.get_runtime_context().get_node_id()


def train(service: str, namespace: str, n: int, per_node: bool) -> tuple[list, str, float, float]:
    """Fetch ``n`` fragments and load them all; returns (index, nbytes, loader node), this node, seconds, CPU s."""
    import ray

    from replaystore import ray as rsr

    fc = rsr.connect(service, namespace=namespace).fragments
    pool = rsr.create_loader_pool(1, 0, service=service, namespace=namespace, wrap=where, per_node=per_node)
    for _round in range(2):  # the first round (not kept) starts the loader actors
        t0, c0 = time.perf_counter(), time.process_time()
        fetch = fc.fetch(n, timeout=300)
        out = [(i, obs.nbytes, node)  # each payload arrived here whole (a copy the trainer owns)
               for b in rsr.data_iter(pool, [(i, r.fragment_id) for i, r in enumerate(fetch.records)], 2, 1,
                                      timeout=300) for i, obs, node in b]
        assert all(n == int(np.prod(SHAPE)) for _, n, _ in out)
    if hasattr(pool, "close"):
        pool.close()
    return out, ray.get_runtime_context().get_node_id(), time.perf_counter() - t0, time.process_time() - c0


def run(ray, workers, head: str, per_producer: int, node_local: bool) -> dict:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from replaystore import ray as rsr
    from replaystore.ray.fragments.node_stores import label_of

    name = f"bn-{uuid.uuid4().hex[:6]}"
    ns = ray.get_runtime_context().namespace
    with tempfile.TemporaryDirectory() as d:
        cfg = rsr.FragmentBufferConfig(max_chunks=64, max_staleness=4, max_reuse=100, fragments_per_chunk=1,
                                       path=d, num_shards=1, map_size=1 << 30, lease_ttl=None,
                                       node_local="database" if node_local else None)
        client = rsr.serve(name=name, fragments=cfg, housekeeping_period=0, start_timeout=300,
                           scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False))
        fc = client.fragments
        fc.update_model_version("s", 0)
        nodes = fc.store_info.get("nodes")
        service_pid = ray.get(client.actor.pid.remote(), timeout=60)
        store_pid = None if node_local else pid_of(ray.get(client.actor.store_actor.remote(), timeout=60)[0])

        def on(node):
            return NodeAffinitySchedulingStrategy(node, soft=False)

        s0, st0 = cpu_of(service_pid), (cpu_of(store_pid) if store_pid else 0.0)
        b0 = created_bytes()
        t0 = time.perf_counter()
        runs = ray.get([ray.remote(produce).options(num_cpus=0, scheduling_strategy=on(w.node_id))
                        .remote(name, ns, f"w{i}", per_producer) for i, w in enumerate(workers)], timeout=600)
        t_in = time.perf_counter() - t0
        s1, st1 = cpu_of(service_pid), (cpu_of(store_pid) if store_pid else 0.0)
        b1 = created_bytes()
        n = per_producer * len(workers)
        nbytes = int(np.prod(SHAPE))
        put_bytes = 0
        for ids, node, _, store_node, _ in runs:
            for fid in ids:
                holder = nodes[label_of(fid)] if node_local else store_node
                put_bytes += nbytes * (holder != node)
        trainer_task = ray.remote(train).options(num_cpus=0, scheduling_strategy=on(workers[0].node_id))
        loaded, trainer, t_out, trainer_cpu = ray.get(trainer_task.remote(name, ns, n, node_local), timeout=600)
        s2 = cpu_of(service_pid)
        b2 = created_bytes()
        load_bytes = sum(b for _, b, loader in loaded if loader != trainer)
        client.shutdown()
    return {"mode": "node-local" if node_local else "one store", "fragments": n,
            "put_hops_per_fragment": put_bytes / nbytes / n, "load_hops_per_fragment": load_bytes / nbytes / n,
            "bytes_per_fragment": (put_bytes + load_bytes) / n, "fragments_per_s_in": n / t_in,
            "fragments_per_s_out": n / t_out,
            "ray_bytes_in": (b1 - b0) / n, "ray_bytes_out": (b2 - b1) / (2 * n), "service_ms_in": 1e3 * (s1 - s0) / n,
            "service_ms_out": 1e3 * (s2 - s1) / (2 * n), "store_actor_ms_put": 1e3 * (st1 - st0) / n,
            "producer_ms_put": 1e3 * sum(r[4] for r in runs) / n, "trainer_ms": 1e3 * trainer_cpu / n}


def calls(ray, head: str, n: int) -> dict:
    """Service CPU per acknowledged fragment: ``n`` single ``add`` calls, then ``n`` in ``add_many`` of 64."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from replaystore import ray as rsr
    from replaystore.storage.fragments import new_fragment_id

    with tempfile.TemporaryDirectory() as d:
        cfg = rsr.FragmentBufferConfig(max_chunks=4 * n, max_staleness=4, max_reuse=1, fragments_per_chunk=1,
                                       path=d, num_shards=1, map_size=1 << 30, lease_ttl=None,
                                       node_local="database")
        client = rsr.serve(name=f"bc-{uuid.uuid4().hex[:6]}", fragments=cfg, housekeeping_period=0,
                           start_timeout=300, scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False))
        fc = client.fragments
        fc.update_model_version("s", 0)
        label = next(iter(fc.store_info["nodes"]))
        pid = ray.get(client.actor.pid.remote(), timeout=60)
        out = {}
        c0, t0 = cpu_of(pid), time.perf_counter()
        for seq in range(n):
            fc.add(f"{new_fragment_id()}@{label}", "one", seq, 0, "s")
        out["add"] = (1e3 * (cpu_of(pid) - c0) / n, n / (time.perf_counter() - t0))
        c0, t0 = cpu_of(pid), time.perf_counter()
        for start in range(0, n, 64):
            fc.add_many([(f"{new_fragment_id()}@{label}", "many", seq, 0, "s")
                         for seq in range(start, min(n, start + 64))])
        out["add_many(64)"] = (1e3 * (cpu_of(pid) - c0) / n, n / (time.perf_counter() - t0))
        c0, t0 = cpu_of(pid), time.perf_counter()
        rounds = 0
        while fc.stats()["replay_buffer_size_chunks"] >= 64:
            fc.release(fc.fetch(64, timeout=60))
            rounds += 1
        out["fetch(64)+release"] = (1e3 * (cpu_of(pid) - c0) / (64 * rounds), 64 * rounds / (time.perf_counter() - t0))
        client.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-producer", type=int, default=4)
    ap.add_argument("--calls", type=int, default=0, help="also time N metadata calls (0: skip)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each mode (medians printed)")
    args = ap.parse_args()
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                      "resources": {"database": 1}})
    workers = [c.add_node(num_cpus=1, resources={"database": 1}) for _ in range(2)]
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    ray.init(address=c.address, namespace=f"bn-{uuid.uuid4().hex[:6]}", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    c.wait_for_nodes()
    head = ray.get_runtime_context().get_node_id()
    try:
        runs = [[run(ray, workers, head, args.per_producer, nl) for nl in (False, True)] for _ in range(args.repeat)]
        rows = [{k: (float(np.median([r[i][k] for r in runs])) if isinstance(v, float) else v)
                 for k, v in runs[0][i].items()} for i in range(2)]
        meta = calls(ray, head, args.calls) if args.calls else {}
    finally:
        ray.shutdown()
        c.shutdown()
    mib = float(np.prod(SHAPE)) / 2**20
    print(f"fragments of {SHAPE} uint8 ({mib:.1f} MiB); producers on 2 workers, service on the head, "
          f"trainer on worker 1; medians of {args.repeat} runs (wall times: shared machine, loaded)")
    print(f"{'mode':12} {'frags':>5} {'put hops':>9} {'load hops':>10} {'MiB moved/frag':>15} "
          f"{'frag/s in':>10} {'frag/s out':>11}")
    for r in rows:
        print(f"{r['mode']:12} {r['fragments']:5d} {r['put_hops_per_fragment']:9.2f} "
              f"{r['load_hops_per_fragment']:10.2f} {r['bytes_per_fragment'] / 2**20:15.2f} "
              f"{r['fragments_per_s_in']:10.2f} {r['fragments_per_s_out']:11.2f}")
    print("Ray's object-store counters (cumulative_created_bytes over all nodes, MiB per fragment; "
          "out: over both trainer rounds):")
    for r in rows:
        print(f"{r['mode']:12} in {r['ray_bytes_in'] / 2**20:6.2f}  out {r['ray_bytes_out'] / 2**20:6.2f}")
    ratio = rows[1]["bytes_per_fragment"] / rows[0]["bytes_per_fragment"]
    print(f"bytes moved per fragment, node-local / one store: {ratio:.2f}")
    print("CPU ms per fragment (from /proc; service out: both trainer rounds and the loaders' start, over 2n):")
    print(f"{'mode':12} {'service in':>11} {'service out':>12} {'store actor':>12} {'producer':>9} {'trainer':>8}")
    for r in rows:
        print(f"{r['mode']:12} {r['service_ms_in']:11.2f} {r['service_ms_out']:12.2f} "
              f"{r['store_actor_ms_put']:12.2f} {r['producer_ms_put']:9.2f} {r['trainer_ms']:8.2f}")
    for what, (ms, rate) in meta.items():
        print(f"metadata service, {what:18}: {ms:.3f} ms CPU per fragment, {rate:8.0f} fragments/s (wall)")


if __name__ == "__main__":
    main()
