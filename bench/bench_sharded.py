"""Sharded tables vs one served Table: inserts/s and samples/s, one process per writer.

Configurations (one Ray instance, ``--cpus`` CPUs): one service actor (``rsr.serve``, the
baseline) and ``rsr.serve_sharded`` with 1, 2 and 4 shards. Items are small transitions (obs
f32[17], action f32[6], reward, next_obs f32[17], done: ~180 bytes). Phases, each ``--seconds``:

- **insert**: ``--writers`` (2 and 8) writer actors call ``extend`` with batches of 1, 64 and 256
  rows, one call at a time each (a writer waits for its answer);
- **sample**: one learner (this process) calls ``sample(256)`` (and, for the prioritized table,
  ``update_priorities`` on what it drew) in a loop while the table holds 100k items.

Printed per configuration: items/s, the ratio to the one-actor baseline measured in the same run,
and the service processes' CPU time per call (``/proc/<pid>/stat``, summed over shards): the per-call cost the
cost model in docs/ray.md starts from. Medians over ``--repeats``.

    nice python bench/bench_sharded.py [--seconds 3] [--repeats 3] [--cpus 2] [--quick]

The machine this was written on has 2 cores shared with other jobs: absolute figures are loaded;
compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
import uuid

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402

import replaystore as rs  # noqa: E402
from replaystore import ray as rsr  # noqa: E402

CAPACITY = 200_000


def make_batch(n: int, seed: int = 0) -> dict:
    """``n`` small transitions (~180 bytes each)."""
    rng = np.random.default_rng(seed)
    return {"obs": rng.random((n, 17), dtype=np.float32), "action": rng.random((n, 6), dtype=np.float32),
            "reward": rng.random(n, dtype=np.float32), "next_obs": rng.random((n, 17), dtype=np.float32),
            "done": np.zeros(n, np.float32)}


def table(capacity: int, prioritized: bool) -> rs.Table:
    """One table (or one shard's)."""
    sampler = rs.Prioritized(0.6, 0.4) if prioritized else rs.Uniform()
    return rs.Table(capacity, sampler=sampler, rate_limiter=rs.MinSize(1), seed=0)


class Writer:
    """A writer process: ``extend`` in a loop, one call at a time."""

    def __init__(self, client, seed: int) -> None:
        self.client = client
        self.seed = seed

    def run(self, seconds: float, batch: int, start_at: float) -> int:
        data = make_batch(batch, self.seed)
        prio = np.ones(batch)
        while time.time() < start_at:
            time.sleep(0.001)
        n, end = 0, time.time() + seconds
        while time.time() < end:
            self.client.extend(data, priorities=prio, timeout=30)
            n += batch
        return n


def start(kind: str, shards: int, prioritized: bool):
    name = f"bs-{uuid.uuid4().hex[:6]}"
    if kind == "one":
        client = rsr.serve({"replay": functools.partial(table, CAPACITY, prioritized)}, name=name)
        return client, [client]
    client = rsr.serve_sharded(functools.partial(table, CAPACITY // shards, prioritized), shards, name=name, seed=0)
    return client, client.shards


def cpu_of(services) -> float:
    """CPU seconds (user + system) the service processes used so far (Linux ``/proc``, same machine)."""
    ray = rsr.import_ray()
    total = 0.0
    for s in services:
        with open(f"/proc/{ray.get(s.actor.pid.remote())}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def insert_phase(ray, actors, services, batch: int, seconds: float) -> tuple[float, float]:
    """``(items/s, service CPU µs per call)`` of the writer ``actors`` writing together."""
    ray.get([a.run.remote(0.05, batch, 0) for a in actors], timeout=120)  # warm up
    cpu0 = cpu_of(services)
    start_at = time.time() + 0.5
    counts = ray.get([a.run.remote(seconds, batch, start_at) for a in actors], timeout=seconds + 120)
    cpu = cpu_of(services) - cpu0
    items = sum(counts)
    return items / seconds, 1e6 * cpu / max(1, items // batch)


def sample_phase(client, services, prioritized: bool, seconds: float, batch: int = 256) -> tuple[float, float, float]:
    """``(sampled items/s, service CPU µs per learner step, learner CPU µs per step)`` of one learner."""
    while len(client) < 100_000:
        client.extend(make_batch(4096), priorities=np.ones(4096), timeout=60)
    cpu0 = cpu_of(services)
    own0 = time.process_time()
    n = calls = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        s = client.sample(batch, timeout=30)
        if prioritized:
            client.update_priorities(s.keys, np.abs(s.weights) + 0.5)
        n += len(s.keys)
        calls += 1
    own = time.process_time() - own0
    return n / seconds, 1e6 * (cpu_of(services) - cpu0) / calls, 1e6 * own / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="batches 64 and 256, 2 and 8 writers, 1 s phases")
    args = ap.parse_args()
    if args.quick:
        args.seconds = 1.0
    ray = rsr.init_local(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    configs = [("one", 1), ("sharded", 1), ("sharded", 2), ("sharded", 4)]
    batches = [64, 256] if args.quick else [1, 64, 256]
    print(f"loaded machine ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}); ray num_cpus={args.cpus}; "
          f"{args.seconds:g}s phases, medians of {args.repeats}")
    results: dict = {}
    for prioritized in (False, True):
        label = "prioritized" if prioritized else "uniform"
        for kind, shards in configs:
            cfg = "one actor" if kind == "one" else f"{shards} shard{'s' if shards > 1 else ''}"
            client, services = start(kind, shards, prioritized)
            try:
                if not prioritized:
                    pool = [ray.remote(Writer).options(num_cpus=0).remote(client, i) for i in range(8)]
                    for writers in (2, 8):
                        for b in batches:
                            runs = [insert_phase(ray, pool[:writers], services, b, args.seconds)
                                    for _ in range(args.repeats)]
                            results[("insert", cfg, writers, b)] = (statistics.median(r[0] for r in runs),
                                                                    statistics.median(r[1] for r in runs))
                            print(f"  insert {cfg:<9} writers {writers} batch {b:>3}: "
                                  f"{results[('insert', cfg, writers, b)][0]:>9.0f} items/s", flush=True)
                    for a in pool:
                        ray.kill(a)
                runs = [sample_phase(client, services, prioritized, args.seconds) for _ in range(args.repeats)]
                results[("sample", cfg, label)] = tuple(statistics.median(r[i] for r in runs) for i in range(3))
                print(f"  sample {cfg:<9} {label}: {results[('sample', cfg, label)][0]:>9.0f} items/s", flush=True)
            finally:
                client.shutdown()
    print("\ninserts/s (uniform table), ratio to one actor, service CPU us per call")
    print(f"{'config':<10} {'writers':>7} {'batch':>5} {'items/s':>10} {'ratio':>6} {'cpu us/call':>11}")
    for (what, cfg, *rest), values in results.items():
        if what == "insert":
            (rate, cpu), (writers, b) = values, rest
            base = results[("insert", "one actor", writers, b)][0]
            print(f"{cfg:<10} {writers:>7} {b:>5} {rate:>10.0f} {rate / base:>6.2f} {cpu:>11.0f}")
    print("\nsamples/s (one learner, batches of 256; prioritized: + update_priorities), ratio, "
          "service CPU us/step (all shards), learner CPU us/step")
    for (what, cfg, *rest), values in results.items():
        if what == "sample":
            rate, cpu, own = values
            base = results[("sample", "one actor", rest[0])][0]
            print(f"{cfg:<10} {rest[0]:<11} {rate:>10.0f} {rate / base:>6.2f} {cpu:>11.0f} {own:>11.0f}")
    ray.shutdown()


if __name__ == "__main__":
    main()
