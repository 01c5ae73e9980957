"""Compressed image replay: bytes per Atari frame and sample cost, replaystore against TorchRL.

Workload: Atari-style transitions, ``obs`` and ``next_obs`` uint8[4, 84, 84] frame stacks, plus
action/reward/done; episodes of 500 steps; the buffer is filled with ``--capacity`` transitions in
batches of 100 (``extend``), then sampled uniformly with batches of 32 and 256.

Frames: **synthetic, with Atari structure** (no ROM or renderer is installed here): a Breakout-like
84x84 grayscale screen (black playfield, grey walls, six rows of bricks in six grey levels that
disappear as the episode goes on, a paddle and a ball that move every frame, a score bar). Like
real Atari frames they are mostly flat, and consecutive frames differ in a few small regions.
Compression ratios on real games differ (busier games compress less), so read the ratios between
implementations, not the absolute bytes, as the result.

Implementations, all in this one process run:

- ``replaystore ColumnStorage``: raw stacks (the uncompressed reference).
- ``replaystore FrameStackStorage``: each frame stored once, raw; stacks rebuilt on gather.
- ``replaystore CompressedColumnStorage``: obs and next_obs zstd-compressed per item (level 3).
- ``torchrl CompressedListStorage``: TorchRL 0.14's compressed storage (zstd level 3, per item),
  in a ``ReplayBuffer`` with a ``RandomSampler``, fed ``TensorDict`` batches.

Bytes: ``payload`` is the bytes the storage holds (replaystore's ``storage.nbytes``: preallocated
columns/rings at full capacity plus compressed frames; TorchRL: the compressed tensors), ``RSS``
the resident-set growth of building and filling the buffer, each implementation in a fresh
subprocess (includes allocator and Python object overhead).

Usage (the machine was loaded when the figures in docs/benchmarks.md were taken):
``PYTHONPATH=src:/path/to/zstandard nice -n 5 bench/.venv/bin/python bench/bench_compressed.py``
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time

import numpy as np

import replaystore as rs

S, H, W = 4, 84, 84
FRAME = H * W


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def breakout_frames(n: int, episode: int = 500, seed: int = 0) -> np.ndarray:
    """``n`` synthetic Breakout-like uint8[84, 84] frames; a new episode every ``episode`` frames."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, H, W), dtype=np.uint8)
    for start in range(0, n, episode):
        bricks = np.ones((6, 18), dtype=bool)
        bx, by, vx, vy = 40.0, 50.0, 1.3, -1.1
        paddle = 36
        for t in range(start, min(n, start + episode)):
            f = out[t]
            f[8:10, 2:82] = 142  # top wall
            f[8:80, 2:4] = 142
            f[8:80, 80:82] = 142  # side walls
            score = (t - start) // 25
            f[1:6, 10:10 + min(60, 3 * score)] = 142  # score bar
            if rng.random() < 0.05 and bricks.any():  # a brick is hit
                rows, cols = np.nonzero(bricks)
                k = rng.integers(len(rows))
                bricks[rows[k], cols[k]] = False
            for r in range(6):
                for c in np.flatnonzero(bricks[r]):
                    f[18 + 3 * r: 20 + 3 * r, 4 + 4 * c: 7 + 4 * c] = 200 - 20 * r
            bx += vx
            by += vy
            if bx < 5 or bx > 77:
                vx = -vx
            if by < 11 or by > 76:
                vy = -vy
            f[int(by): int(by) + 2, int(bx): int(bx) + 2] = 200
            paddle = int(np.clip(paddle + rng.integers(-3, 4), 4, 70))
            f[77:79, paddle: paddle + 10] = 200
    return out


def make_transitions(n: int, episode: int = 500) -> dict[str, np.ndarray]:
    """``n`` transitions with stacked obs/next_obs (reset stacks repeat the first frame)."""
    frames = breakout_frames(n + n // episode + 1, episode + 1)
    obs = np.empty((n, S, H, W), np.uint8)
    nxt = np.empty((n, S, H, W), np.uint8)
    done = np.zeros(n, bool)
    i = 0
    f0 = 0
    while i < n:
        length = min(episode, n - i)
        ep = frames[f0: f0 + length + 1]
        padded = np.concatenate([np.repeat(ep[:1], S - 1, axis=0), ep])
        win = np.lib.stride_tricks.sliding_window_view(padded, S, axis=0).transpose(0, 3, 1, 2)
        obs[i: i + length] = win[:length]
        nxt[i: i + length] = win[1: length + 1]
        done[i + length - 1] = True
        i += length
        f0 += episode + 1
    rng = np.random.default_rng(1)
    return {"obs": obs, "action": rng.integers(0, 4, n), "reward": rng.random(n).astype(np.float32),
            "next_obs": nxt, "done": done}


class Replaystore:
    def __init__(self, capacity: int, kind: str) -> None:
        self.name = f"replaystore {kind}"
        if kind == "ColumnStorage":
            storage = rs.ColumnStorage(capacity)
        elif kind == "FrameStackStorage":
            storage = rs.FrameStackStorage(capacity)
        else:
            storage = rs.CompressedColumnStorage(capacity, compress=["obs", "next_obs"], level=3)
        self.t = rs.Table(capacity, sampler=rs.Uniform(), remover=rs.Fifo(), storage=storage, seed=0)

    def extend(self, batch: dict) -> None:
        self.t.extend(batch)

    def sample(self, n: int) -> None:
        self.t.sample(n)

    def payload_bytes(self) -> int:
        st = self.t.storage
        return int(st.nbytes)  # FrameStackStorage: its frame ring included


class TorchRL:
    name = "torchrl CompressedListStorage"

    def __init__(self, capacity: int) -> None:
        import torch
        from torchrl.data import CompressedListStorage, RandomSampler, ReplayBuffer

        torch.manual_seed(0)
        self.rb = ReplayBuffer(storage=CompressedListStorage(capacity, compression_level=3),
                               sampler=RandomSampler())

    def extend(self, batch: dict) -> None:
        import torch
        from tensordict import TensorDict

        td = TensorDict({k: torch.from_numpy(v) for k, v in batch.items()}, batch_size=[len(batch["action"])])
        self.rb.extend(td)

    def sample(self, n: int) -> None:
        self.rb.sample(n)

    def payload_bytes(self) -> int:
        """Compressed bytes of every field of every item (TorchRL compresses all fields)."""
        total = 0
        for item in self.rb._storage._storage:
            if item is not None:
                total += sum(int(v.numel()) for v in item.values())
        return total


def check_round_trip(buf, data: dict) -> None:
    """Every implementation must give back exactly what it was fed (one sample checked)."""
    if isinstance(buf, Replaystore):
        s = buf.t.sample(64)
        got, idx = s.data, s.keys % len(data["obs"])
    else:
        td, info = buf.rb.sample(64, return_info=True)
        got, idx = {k: td[k].numpy() for k in ("obs", "next_obs")}, np.asarray(info["index"])
    assert np.array_equal(got["obs"], data["obs"][idx]), buf.name
    assert np.array_equal(got["next_obs"], data["next_obs"][idx]), buf.name


def measure(make, data: dict, capacity: int, repeats: int) -> dict:
    gc.collect()
    before = rss_bytes()
    buf = make(capacity)
    t0 = time.perf_counter()
    for i in range(0, capacity, 100):
        buf.extend({k: v[i: i + 100] for k, v in data.items()})
    fill_s = time.perf_counter() - t0
    rss = rss_bytes() - before
    check_round_trip(buf, data)
    out = {"name": buf.name, "rss": rss, "payload": buf.payload_bytes(), "insert_per_s": capacity / fill_s}
    for n, iters in ((32, 300), (256, 40)):
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
    ap.add_argument("--capacity", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", type=int, default=None, help="measure one implementation (subprocess mode)")
    args = ap.parse_args()
    data = make_transitions(args.capacity)
    makers = [lambda c: Replaystore(c, "ColumnStorage"), lambda c: Replaystore(c, "FrameStackStorage"),
              lambda c: Replaystore(c, "CompressedColumnStorage")]
    try:
        import torchrl  # noqa: F401

        makers.append(TorchRL)
    except ImportError:
        print("torchrl not installed: skipped")
    if args.only is not None:
        print("ROW " + json.dumps(measure(makers[args.only], data, args.capacity, args.repeats)))
        return
    rows = []
    for i in range(len(makers)):
        cmd = [sys.executable, __file__, "--only", str(i), "--capacity", str(args.capacity),
               "--repeats", str(args.repeats)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(next(ln for ln in out.splitlines() if ln.startswith("ROW "))[4:]))
    frames_per_item = 2 * S  # obs and next_obs stacks as fed in
    ref = rows[0]
    print(f"\nAtari-style transitions (synthetic Breakout-like frames): capacity {args.capacity:,}, "
          f"obs/next_obs uint8[4,84,84] (raw frame {FRAME} B), medians of {args.repeats}\n")
    print("| implementation | payload B/transition | RSS B/transition | RSS B/frame fed | inserts/s "
          "| sample 32 µs | sample 256 µs | sample 256 vs raw columns |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        payload = "-" if r["payload"] is None else f"{r['payload'] / args.capacity:,.0f}"
        print(f"| {r['name']} | {payload} | {r['rss'] / args.capacity:,.0f} | "
              f"{r['rss'] / args.capacity / frames_per_item:,.0f} | {r['insert_per_s']:,.0f} | "
              f"{r['sample_32_us']:,.0f} | {r['sample_256_us']:,.0f} | "
              f"{r['sample_256_us'] / ref['sample_256_us']:.1f}x |")


if __name__ == "__main__":
    main()
