"""Tianshou 2.0.1's buffers vs replaystore.compat.tianshou, through Tianshou's API (medians per call).

- add: ``VectorReplayBuffer(total, buffer_num=n).add(batch of n rows)`` (what a collector with
  n environments does), n in ROWS; and ``ReplayBuffer.add`` of one transition.
- sample: ``VectorReplayBuffer(1M, 10)`` filled, ``sample(n)`` (the draw and the gather of every
  stored array) and ``sample_indices(n)`` (the draw alone); ``PrioritizedVectorReplayBuffer``
  ``sample(n)`` + ``update_weight`` (what DQN with PER does per step).

Rows are CartPole-like (obs and obs_next: 4 float32, int action, float reward, flags, an
``info`` with ``env_id``). Needs Tianshou (its own environment, see docs/compat/tianshou.md)::

    python bench/bench_tianshou.py [--total 1000000] [--repeats 7] [--parts add,sample,per] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import tianshou.data as tsd
from tianshou.data import Batch

import replaystore.compat.tianshou as rs

ROWS = (1, 8, 64, 256, 1000)
CLOCK = time.process_time  # CPU time of this process: the machine is shared (``--wall`` for wall time)


def rows(n: int, t: int = 0) -> Batch:
    rng = np.random.default_rng(t)
    return Batch(
        obs=rng.standard_normal((n, 4)).astype(np.float32),
        act=rng.integers(0, 2, n),
        rew=np.ones(n),
        terminated=rng.random(n) < 0.01,
        truncated=np.zeros(n, bool),
        obs_next=rng.standard_normal((n, 4)).astype(np.float32),
        info=Batch(env_id=np.arange(n)),
    )


def one_row(t: int = 0) -> Batch:
    b = rows(1, t)
    return Batch({k: (v[0] if isinstance(v, np.ndarray) else v[0]) for k, v in b.items()})


def medians(fns: dict, calls: int, repeats: int) -> dict:
    """Median seconds per call of each function; the functions take turns in every repeat (fair under load)."""
    out: dict = {name: [] for name in fns}
    for fn in fns.values():  # warm-up (compiles, caches)
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t = CLOCK()
            for _ in range(calls):
                fn()
            out[name].append((CLOCK() - t) / calls)
    return {name: float(np.median(v)) for name, v in out.items()}


def fill(buf, total: int, width: int) -> None:
    batch = rows(width, 1)
    for _ in range(total // width + 1):
        buf.add(batch)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--total", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json")
    p.add_argument("--wall", action="store_true", help="time with the wall clock instead of CPU time")
    p.add_argument("--parts", default="add,sample,per", help="which of add, sample, per to run")
    a = p.parse_args()
    parts = set(a.parts.split(","))
    global CLOCK
    if a.wall:
        CLOCK = time.perf_counter
    res: dict = {"add": {}, "sample": {}, "sample_indices": {}, "per_sample_update": {}}
    libs = {"tianshou": tsd, "replaystore": rs}
    for n in ROWS if "add" in parts else ():
        fns = {}
        for name, lib in libs.items():
            buf = lib.VectorReplayBuffer(max(200_000, n * 200), n)
            batch = rows(n, 2)
            fns[name] = lambda b=buf, x=batch: b.add(x)
        res["add"][n] = medians(fns, max(20, 4000 // n), a.repeats)
        print("add", n, {k: f"{v * 1e6:.1f} us" for k, v in res["add"][n].items()}, flush=True)
    fns = {}
    single = one_row(3)
    for name, lib in libs.items():
        buf = lib.ReplayBuffer(200_000)
        fns[name] = lambda b=buf, x=single: b.add(x)
    if "add" in parts:
        res["add"]["single"] = medians(fns, 4000, a.repeats)
        print("add single", {k: f"{v * 1e6:.1f} us" for k, v in res["add"]["single"].items()}, flush=True)
    bufs, pers = {}, {}
    for name, lib in libs.items():
        t = time.perf_counter()
        if "sample" in parts:
            bufs[name] = lib.VectorReplayBuffer(a.total, 10)
            fill(bufs[name], a.total, 10)
        if "per" in parts:
            pers[name] = lib.PrioritizedVectorReplayBuffer(a.total, 10, alpha=0.6, beta=0.4)
            fill(pers[name], a.total, 10)
        print(f"filled {name} in {time.perf_counter() - t:.1f} s", flush=True)
    rng = np.random.default_rng(0)

    def per_step(b, n):
        batch, idx = b.sample(n)
        b.update_weight(idx, rng.random(len(idx)))

    for n in ROWS:
        calls = max(20, 2000 // n)
        if bufs:
            res["sample"][n] = medians({k: (lambda b=b, n=n: b.sample(n)) for k, b in bufs.items()}, calls, a.repeats)
            res["sample_indices"][n] = medians(
                {k: (lambda b=b, n=n: b.sample_indices(n)) for k, b in bufs.items()}, calls, a.repeats
            )
        if pers:
            res["per_sample_update"][n] = medians(
                {k: (lambda b=b, n=n: per_step(b, n)) for k, b in pers.items()}, calls, a.repeats
            )
        done = {op: {k: f"{v * 1e6:.1f} us" for k, v in res[op][n].items()} for op in res if n in res[op]}
        print(n, done, flush=True)
    print("\n| op | rows | Tianshou 2.0.1 (us) | replaystore (us) | speed-up |\n|---|---|---|---|---|")
    for op, table in res.items():
        for n, v in table.items():
            print(f"| {op} | {n} | {v['tianshou'] * 1e6:.1f} | {v['replaystore'] * 1e6:.1f} | "
                  f"{v['tianshou'] / v['replaystore']:.1f}x |")  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump({op: {str(k): v for k, v in t.items()} for op, t in res.items()}, f, indent=1)


if __name__ == "__main__":
    main()
