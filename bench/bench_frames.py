"""Atari-sized frame stacks: memory, single-add rate and sample time, replaystore against peers.

Workload (the performance issue's item 3): obs and next_obs are uint8[4, 84, 84] frame stacks,
capacity 100k, episodes of 1000 steps; add one transition at a time, then sample 32 and 256.

Implementations, all measured in this one process run:

- ``numpy``: two preallocated stack arrays (obs, next_obs); add = item assignment; sample =
  ``rng.integers`` + ``np.take(..., out=...)``: the limit for a naive layout.
- ``cpprb next_of``: cpprb's ``next_of=("obs",)`` (obs and next_obs share a slot).
- ``cpprb stack_compress``: cpprb's ``next_of`` plus ``stack_compress="obs"`` (frame dedup).
- ``replaystore``: ``rs.FrameStackStorage`` (each frame once, stacks rebuilt on gather).

Memory is the RSS growth of building the buffer and filling it (the transitions fed in are
generated on the fly from a small pool of frames, so they add nothing).

Usage: ``bench/.venv/bin/python bench/bench_frames.py [--capacity 100000] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

import replaystore as rs

S, H, W = 4, 84, 84


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def make_episode(episode: int = 1000, seed: int = 0) -> list[dict]:
    """One episode of transitions, made once before any timing (its memory is not counted)."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (episode + S, H, W), dtype=np.uint8)
    stacks = np.lib.stride_tricks.sliding_window_view(frames, S, axis=0).transpose(0, 3, 1, 2)
    return [
        {
            "obs": np.ascontiguousarray(stacks[t]),
            "action": np.int64(t % 6),
            "reward": np.float32(1.0),
            "next_obs": np.ascontiguousarray(stacks[t + 1]),
            "done": t == episode - 1,
        }
        for t in range(episode)
    ]


EPISODE: list[dict] = []


def make_stream(n: int):
    """Yield ``n`` transitions, cycling through the pre-made episode."""
    for i in range(n):
        yield EPISODE[i % len(EPISODE)]


class NumpyNaive:
    name = "numpy (naive stacks)"

    def __init__(self, capacity: int) -> None:
        self.cap = capacity
        self.obs = np.zeros((capacity, S, H, W), np.uint8)
        self.next_obs = np.zeros((capacity, S, H, W), np.uint8)
        self.action = np.zeros(capacity, np.int64)
        self.reward = np.zeros(capacity, np.float32)
        self.done = np.zeros(capacity, bool)
        self.pos = 0
        self.rng = np.random.default_rng(0)
        self.out: dict[int, tuple[np.ndarray, ...]] = {}

    def add(self, tr: dict) -> None:
        p = self.pos % self.cap
        self.obs[p] = tr["obs"]
        self.next_obs[p] = tr["next_obs"]
        self.action[p] = tr["action"]
        self.reward[p] = tr["reward"]
        self.done[p] = tr["done"]
        self.pos += 1

    def sample(self, n: int) -> None:
        if n not in self.out:
            self.out[n] = (np.empty((n, S, H, W), np.uint8), np.empty((n, S, H, W), np.uint8))
        o, no = self.out[n]
        idx = self.rng.integers(0, min(self.pos, self.cap), n)
        np.take(self.obs, idx, axis=0, out=o)
        np.take(self.next_obs, idx, axis=0, out=no)
        self.action.take(idx)
        self.reward.take(idx)
        self.done.take(idx)


class Cpprb:
    def __init__(self, capacity: int, stack_compress: bool) -> None:
        import cpprb

        self.name = "cpprb next_of + stack_compress" if stack_compress else "cpprb next_of"
        kw = {"stack_compress": "obs"} if stack_compress else {}
        self.rb = cpprb.ReplayBuffer(
            capacity,
            {"obs": {"shape": (S, H, W), "dtype": np.uint8}, "action": {"dtype": np.int64},
             "reward": {}, "done": {}},
            next_of=("obs",), **kw,
        )

    def add(self, tr: dict) -> None:
        self.rb.add(obs=tr["obs"], next_obs=tr["next_obs"], action=tr["action"], reward=tr["reward"],
                    done=tr["done"])
        if tr["done"]:
            self.rb.on_episode_end()

    def sample(self, n: int) -> None:
        self.rb.sample(n)


class Replaystore:
    name = "replaystore FrameStackStorage"

    def __init__(self, capacity: int) -> None:
        self.t = rs.Table(capacity, sampler=rs.Uniform(), remover=rs.Fifo(),
                          storage=rs.FrameStackStorage(capacity), seed=0)

    def add(self, tr: dict) -> None:
        self.t.add(tr)

    def sample(self, n: int) -> None:
        self.t.sample(n)


def measure(make, capacity: int, repeats: int) -> dict:
    gc.collect()
    before = rss_bytes()
    buf = make(capacity)
    t0 = time.perf_counter()
    for tr in make_stream(capacity):
        buf.add(tr)
    fill_s = time.perf_counter() - t0
    mem = rss_bytes() - before
    adds = []
    for _ in range(repeats):
        n = 20_000
        t0 = time.perf_counter()
        for tr in make_stream(n):
            buf.add(tr)
        adds.append(n / (time.perf_counter() - t0))
    out = {"name": buf.name, "memory_gb": mem / 1e9, "fill_s": fill_s, "add_per_s": statistics.median(adds)}
    for n, iters in ((32, 2000), (256, 300)):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(iters):
                buf.sample(n)
            times.append((time.perf_counter() - t0) / iters * 1e6)
        out[f"sample_{n}_us"] = statistics.median(times)
    del buf
    gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    EPISODE.extend(make_episode())
    makers = [NumpyNaive, Replaystore]
    try:
        import cpprb  # noqa: F401

        makers += [lambda c: Cpprb(c, False), lambda c: Cpprb(c, True)]
    except ImportError:
        print("cpprb not installed: skipped")
    rows = [measure(m, args.capacity, args.repeats) for m in makers]
    limit = rows[0]
    print(f"\nAtari frames: capacity {args.capacity:,}, obs/next_obs uint8[4,84,84], medians of {args.repeats}\n")
    print("| implementation | memory GB | add/s | sample 32 µs | sample 256 µs "
          "| sample 32 vs limit | sample 256 vs limit |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['memory_gb']:.2f} | {r['add_per_s']:,.0f} | {r['sample_32_us']:.0f} | "
              f"{r['sample_256_us']:.0f} | {r['sample_32_us'] / limit['sample_32_us']:.2f}x | "
              f"{r['sample_256_us'] / limit['sample_256_us']:.2f}x |")


if __name__ == "__main__":
    main()
