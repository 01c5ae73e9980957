"""Sharded tables vs one served Table: inserts/s, and the learner's CPU and batches/s per sample.

One Ray instance (``--cpus`` CPUs). Configurations: one service actor (``rsr.serve``, the
baseline) and ``rsr.serve_sharded`` with 2 and 4 shards. Items are small transitions (obs f32[17],
action f32[6], reward, next_obs f32[17], done: ~180 bytes). Phases, each ``--seconds`` long,
repeated ``--repeats`` times (medians printed):

- **insert** (uniform table): 2 and 8 writer actors call ``extend`` with batches of 1, 64 and 256
  rows, one call at a time each, and 8 writers adding single rows through a ``BatchingWriter``
  that sends 256 per call. Printed: items/s, the ratio to one actor, the service CPU per call
  (``/proc``, summed over shards) and the writers' own CPU per Ray call (``time.process_time``).
- **sample** (the table holds 100k items): one learner (this process) calls ``sample(256)`` in a
  loop, and for the prioritized table ``update_priorities`` on what it drew. Sharded tables are
  sampled three ways: ``depth 1`` (one call per shard per sample, updates sent at once: the client
  before issue 19's follow-up), ``depth 8`` (the default: one call per shard per 8 batches,
  updates riding on the next fetch) and through a *sampling actor* (the learner calls one actor,
  which holds a default ``ShardedClient``). Printed: batches/s, the ratio to one actor, the
  learner's CPU per ``sample`` call and per ``update_priorities`` call, and the services' CPU per
  step.

    nice python bench/bench_sharded.py              # default: ~4-6 minutes on 2 cores
    nice python bench/bench_sharded.py --quick      # ~1.5 minutes: batches 64/256, 1 repeat, 1 s

Figures measured on a loaded machine are loaded: compare the ratios of one run and the CPU per call.
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
BATCH = 256


def make_batch(n: int, seed: int = 0) -> dict:
    """``n`` small transitions (~180 bytes each)."""
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.random((n, 17), dtype=np.float32),
        "action": rng.random((n, 6), dtype=np.float32),
        "reward": rng.random(n, dtype=np.float32),
        "next_obs": rng.random((n, 17), dtype=np.float32),
        "done": np.zeros(n, np.float32),
    }


def table(capacity: int, prioritized: bool) -> rs.Table:
    """One table (or one shard's)."""
    sampler = rs.Prioritized(0.6, 0.4) if prioritized else rs.Uniform()
    return rs.Table(capacity, sampler=sampler, rate_limiter=rs.MinSize(1), seed=0)


class Writer:
    """A writer process: ``extend`` in a loop, one call at a time."""

    def __init__(self, client, seed: int) -> None:
        self.client = client
        self.seed = seed

    def run(self, seconds: float, batch: int, start_at: float, rows_per_call: int = 0) -> tuple[int, float, int]:
        """``(items written, own CPU seconds, Ray calls)``; ``rows_per_call``: through a BatchingWriter."""
        data = make_batch(batch, self.seed)
        prio = np.ones(batch)
        out = rsr.BatchingWriter(self.client, rows_per_call, timeout=30) if rows_per_call else None
        while time.time() < start_at:
            time.sleep(0.001)
        n = calls = 0
        cpu0, end = time.process_time(), time.time() + seconds
        while time.time() < end:
            if out is None:
                self.client.extend(data, priorities=prio, timeout=30)
                calls += 1
            elif len(out.extend(data, priorities=prio)):
                calls += 1
            n += batch
        if out is not None:
            n -= out.pending  # rows still waiting are not in
        return n, time.process_time() - cpu0, calls


class SamplingActor:
    """One actor between the learner and the shards: the learner makes one call per sample or update."""

    def __init__(self, client) -> None:
        self.client = client

    def sample(self, batch: int):
        """A merged sample of the sharded table."""
        return self.client.sample(batch, timeout=30)

    def update_priorities(self, keys, priorities) -> int:
        """``update_priorities`` on the sharded table."""
        return self.client.update_priorities(keys, priorities)

    def pid(self) -> int:
        """The actor's process id."""
        return os.getpid()


def start(shards: int, prioritized: bool):
    """``(client, the service clients)``: one service (``shards == 0``) or a sharded table."""
    name = f"bs-{uuid.uuid4().hex[:6]}"
    if shards == 0:
        client = rsr.serve({"replay": functools.partial(table, CAPACITY, prioritized)}, name=name)
        return client, [client]
    # the factory's capacity is the whole table's: serve_sharded splits it over the shards (with the
    # per-shard CAPACITY // shards of before the split, 4 shards held 50k and the 100k fill never ended)
    client = rsr.serve_sharded(functools.partial(table, CAPACITY, prioritized), shards, name=name, seed=0)
    return client, client.shards


def cpu_of_pids(pids) -> float:
    """CPU seconds (user + system) the processes used so far (Linux ``/proc``, same machine)."""
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def insert_phase(ray, actors, pids, batch: int, seconds: float, rows_per_call: int = 0) -> tuple[float, float, float]:
    """``(items/s, service CPU µs per call, writer CPU µs per call)`` of the writers writing together."""
    ray.get([a.run.remote(0.05, batch, 0) for a in actors], timeout=120)  # warm up
    cpu0 = cpu_of_pids(pids)
    start_at = time.time() + 0.3
    out = ray.get([a.run.remote(seconds, batch, start_at, rows_per_call) for a in actors], timeout=seconds + 120)
    cpu = cpu_of_pids(pids) - cpu0
    items, own, calls = (sum(o[i] for o in out) for i in range(3))
    return items / seconds, 1e6 * cpu / max(1, calls), 1e6 * own / max(1, calls)


def sample_phase(sample, update, pids, seconds: float) -> tuple[float, float, float, float]:
    """``(batches/s, learner CPU µs per sample, per update, service CPU µs per step)``."""
    cpu0 = cpu_of_pids(pids)
    t_sample = t_update = 0.0
    steps = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        c0 = time.process_time()
        s = sample(BATCH)
        c1 = time.process_time()
        if update is not None:
            update(s.keys, np.abs(s.weights) + 0.5)
        t_sample += c1 - c0
        t_update += time.process_time() - c1
        steps += 1
    service = cpu_of_pids(pids) - cpu0
    return steps / seconds, 1e6 * t_sample / steps, 1e6 * t_update / steps, 1e6 * service / steps


def med(runs: list[tuple]) -> tuple:
    """Medians, field by field."""
    return tuple(statistics.median(r[i] for r in runs) for i in range(len(runs[0])))


def learner_modes(ray, shards: int, client, prioritized: bool) -> list[tuple[str, object, object, list]]:
    """``(label, sample function, update function or None, extra pids)`` per way of sampling."""
    if shards == 0:
        return [("one actor", functools.partial(client.sample, timeout=30), client.update_priorities, [])]
    old = rsr.connect_sharded(client.name, depth=1, defer_updates=False, seed=1)
    actor = ray.remote(SamplingActor).options(num_cpus=0).remote(rsr.connect_sharded(client.name, seed=2))
    modes = [
        ("depth 1", functools.partial(old.sample, timeout=30), old.update_priorities, []),
        (f"depth {client.depth}", functools.partial(client.sample, timeout=30), client.update_priorities, []),
        (
            "sampling actor",
            lambda b: ray.get(actor.sample.remote(b)),
            lambda k, p: ray.get(actor.update_priorities.remote(k, p)),
            [ray.get(actor.pid.remote())],
        ),
    ]
    return [(f"{shards} shards, {label}", s, u if prioritized else None, extra) for label, s, u, extra in modes]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.5, help="length of each phase")
    ap.add_argument("--repeats", type=int, default=3, help="phases per cell (medians)")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--shards", default="2,4", help="shard counts to compare with one actor")
    ap.add_argument("--quick", action="store_true", help="batches 64/256, one 1 s phase per cell")
    args = ap.parse_args()
    batches = [1, 64, 256]
    if args.quick:
        args.seconds, args.repeats, batches = 1.0, 1, [64, 256]
    ray = rsr.init_local(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    t0 = time.time()
    load = os.getloadavg()[0]
    print(
        f"{os.cpu_count()} cores, load average {load:.1f} at start ({'loaded' if load > 1.5 else 'quiet'}); "
        f"ray num_cpus={args.cpus}; {args.seconds:g} s phases, medians of {args.repeats}",
        flush=True,
    )
    inserts: dict = {}
    samples: dict = {}
    for shards in [0] + [int(x) for x in args.shards.split(",")]:
        cfg = "one actor" if shards == 0 else f"{shards} shards"
        for prioritized in (False, True):
            client, services = start(shards, prioritized)
            pids = [ray.get(s.actor.pid.remote()) for s in services]
            try:
                if not prioritized:
                    pool = [ray.remote(Writer).options(num_cpus=0).remote(client, i) for i in range(8)]
                    for writers in (2, 8):
                        for b in batches:
                            runs = [
                                insert_phase(ray, pool[:writers], pids, b, args.seconds) for _ in range(args.repeats)
                            ]
                            inserts[(cfg, writers, b)] = med(runs)
                            print(
                                f"  insert {cfg:<9} writers {writers} batch {b:>3}: "
                                f"{inserts[(cfg, writers, b)][0]:>9.0f} items/s",
                                flush=True,
                            )
                    runs = [insert_phase(ray, pool, pids, 1, args.seconds, 256) for _ in range(args.repeats)]
                    inserts[(cfg, 8, "1, BatchingWriter 256")] = med(runs)
                    print(f"  insert {cfg:<9} writers 8 batch 1 via BatchingWriter(256): {med(runs)[0]:>9.0f} items/s")
                    for a in pool:
                        ray.kill(a)
                while len(client) < 100_000:
                    client.extend(make_batch(4096), priorities=np.ones(4096), timeout=60)
                label = "prioritized + update" if prioritized else "uniform"
                for mode, sample, update, extra in learner_modes(ray, shards, client, prioritized):
                    sample(BATCH)  # warm up (and the masses)
                    runs = [sample_phase(sample, update, pids + extra, args.seconds) for _ in range(args.repeats)]
                    samples[(label, mode)] = med(runs)
                    print(f"  sample {mode:<28} {label}: {samples[(label, mode)][0]:>7.0f} batches/s", flush=True)
            finally:
                client.shutdown()
    ray.shutdown()
    print("\ninserts/s (uniform table; medians), ratio to one actor; CPU µs per insert call: services, each writer")
    print("| config | writers | batch | items/s | ratio | service CPU µs/call | writer CPU µs/call |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (cfg, writers, b), (rate, cpu, own) in inserts.items():
        base = inserts[("one actor", writers, b)][0]
        print(f"| {cfg} | {writers} | {b} | {rate:,.0f} | {rate / base:.2f} | {cpu:,.0f} | {own:,.0f} |")
    print(f"\none learner, sample({BATCH}) (prioritized: + update_priorities of the batch); medians")
    print("| table | learner | batches/s | ratio | learner CPU µs/sample | µs/update | services CPU µs/step |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (label, mode), (rate, t_s, t_u, svc) in samples.items():
        base = samples[(label, "one actor")]
        upd = f"{t_u:,.0f}" if label != "uniform" else "-"
        print(f"| {label} | {mode} | {rate:,.0f} | {rate / base[0]:.2f} | {t_s:,.0f} | {upd} | {svc:,.0f} |")
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end; {time.time() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
