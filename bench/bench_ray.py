"""The Ray replay service under an Ape-X-style load: inserts/s and samples/s from client processes.

Workload (the performance issue's item 5): small transitions (obs f32[17], action f32[6], reward,
next_obs f32[17], done; ~180 bytes, plus padding to ~1 KB with ``--item-bytes 1024``) sent inline in
batches of 256 per Ray call by ``--writers`` writer actors, while ``--samplers`` sampler actors draw
batches of 256 and update their priorities. One served table: capacity 1M, ``Prioritized(0.6,
0.4)`` or ``Uniform``, ``MinSize(1000)``. Each phase runs ``--seconds`` and is repeated.

Usage::

    python bench/bench_ray.py [--writers 2] [--samplers 2] [--seconds 5] [--repeats 3]   # needs replaystore[ray]

``--prefetch 0,4`` (the default) runs the samplers twice: one blocking ``sample()`` at a time, and
``client.iterate(prefetch=4)``, which keeps four sample calls in flight. DeepMind Reverb (dm-reverb
0.14 + TensorFlow 2.15 in ``bench/.venv-reverb``) is run by ``bench/bench_reverb.py`` with the
same shapes.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402

import replaystore as rs  # noqa: E402
from replaystore import ray as rsr  # noqa: E402


def make_batch(n: int, pad: int, rng: np.random.Generator) -> dict:
    batch = {
        "obs": rng.random((n, 17), dtype=np.float32),
        "action": rng.random((n, 6), dtype=np.float32),
        "reward": rng.random(n, dtype=np.float32),
        "next_obs": rng.random((n, 17), dtype=np.float32),
        "done": np.zeros(n, np.float32),
    }
    if pad:
        batch["pad"] = np.zeros((n, pad), np.uint8)
    return batch


def run(args: argparse.Namespace, prioritized: bool, prefetch: int) -> dict:
    ray = rsr.init_local(num_cpus=2, include_dashboard=False, log_to_driver=False)
    sampler = rs.Prioritized(0.6, 0.4) if prioritized else rs.Uniform()
    name = f"bench-{'per' if prioritized else 'uniform'}-{os.getpid()}"
    client = rsr.serve({"replay": functools.partial(rs.Table, 1_000_000, sampler=sampler,
                                                    rate_limiter=rs.MinSize(1000), seed=0)}, name=name)
    pad = max(0, args.item_bytes - 180)

    @ray.remote(num_cpus=0)
    class Writer:
        def __init__(self, seed: int) -> None:
            self.c = rsr.connect(name, table="replay")
            self.batch = make_batch(args.batch, pad, np.random.default_rng(seed))

        def run(self, seconds: float) -> int:
            n = 0
            end = time.monotonic() + seconds
            pending = []
            while time.monotonic() < end:
                pending.append(self.c.extend_async(self.batch))
                if len(pending) >= 4:  # a few calls in flight per writer
                    ray.get(pending.pop(0))
                n += args.batch
            ray.get(pending)
            return n

    @ray.remote(num_cpus=0)
    class Sampler:
        def __init__(self) -> None:
            self.c = rsr.connect(name, table="replay")

        def run(self, seconds: float) -> int:
            n = 0
            end = time.monotonic() + seconds
            rng = np.random.default_rng(0)
            if prefetch:  # samples kept in flight by the client (as Reverb's datasets do)
                batches = self.c.iterate(args.batch, prefetch=prefetch, timeout=30)
            else:
                batches = iter(lambda: self.c.sample(args.batch, timeout=30), None)
            for s in batches:
                if prioritized:
                    self.c.update_priorities(s.keys, rng.random(len(s)) + 0.01)
                n += len(s)
                if time.monotonic() >= end:
                    break
            return n

    client.extend(make_batch(5000, pad, np.random.default_rng(1)))
    writers = [Writer.remote(i) for i in range(args.writers)]
    samplers = [Sampler.remote() for _ in range(args.samplers)]
    ray.get([w.run.remote(0.5) for w in writers] + [s.run.remote(0.5) for s in samplers])  # warm up
    ins, smp, both_i, both_s = [], [], [], []
    for _ in range(args.repeats):
        ins.append(sum(ray.get([w.run.remote(args.seconds) for w in writers])) / args.seconds)
        smp.append(sum(ray.get([s.run.remote(args.seconds) for s in samplers])) / args.seconds)
        refs_w = [w.run.remote(args.seconds) for w in writers]
        refs_s = [s.run.remote(args.seconds) for s in samplers]
        both_i.append(sum(ray.get(refs_w)) / args.seconds)
        both_s.append(sum(ray.get(refs_s)) / args.seconds)
    client.shutdown()
    return {
        "sampler": "Prioritized (+ update)" if prioritized else "Uniform",
        "prefetch": prefetch,
        "inserts_alone": statistics.median(ins),
        "samples_alone": statistics.median(smp),
        "inserts_mixed": statistics.median(both_i),
        "samples_mixed": statistics.median(both_s),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--samplers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--item-bytes", type=int, default=1024, help="bytes per item (padded), default 1 KB")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prefetch", default="0,4",
                    help="sample calls in flight per sampler, comma-separated (0: one blocking sample() at a time; "
                         "k: client.iterate(prefetch=k)); default 0,4")
    args = ap.parse_args()
    rows = [run(args, prioritized=p, prefetch=int(k)) for k in args.prefetch.split(",") for p in (False, True)]
    import ray

    ray.shutdown()
    print(f"\nRay service: {args.writers} writer and {args.samplers} sampler actors, batches of {args.batch}, "
          f"~{args.item_bytes} B items, medians of {args.repeats} x {args.seconds:g} s\n")
    print("| table | samples in flight | inserts/s alone | samples/s alone | inserts/s mixed | samples/s mixed |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['sampler']} | {r['prefetch'] or 1} | {r['inserts_alone']:,.0f} | {r['samples_alone']:,.0f} | "
              f"{r['inserts_mixed']:,.0f} | {r['samples_mixed']:,.0f} |")


if __name__ == "__main__":
    main()
