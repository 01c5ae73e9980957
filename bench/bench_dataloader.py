"""Feeding a training loop: batches per second through ReplayDataset/DataLoader against TorchRL.

Workload: a uniform table of ``--capacity`` transitions, each ``obs``/``next_obs`` float32[17]
plus action/reward/done (a MuJoCo-sized D4RL transition) or, with ``--atari``, uint8[4, 84, 84]
stacks; batches of 256 turned into torch tensors. The consumer either does nothing (``step 0 ms``:
pure feeding cost) or simulates an accelerator step of 5 ms that releases the GIL
(``time.sleep``), which is where prefetching should hide the sampling cost.

Implementations (those whose packages are installed in this interpreter):

- ``Table.sample(as_tensor=True)`` in the loop: no prefetch (the reference);
- ``ReplayDataset`` + ``DataLoader(num_workers=0)``: the prefetch thread (``prefetch=4``);
- ``ReplayDataset`` over the Ray service, ``num_workers=0`` (4 calls in flight) and 2 spawned
  workers (needs ``ray``);
- TorchRL 0.14 ``ReplayBuffer(LazyTensorStorage, prefetch=4)``: its own prefetch threads (needs
  ``torchrl``).

Usage: ``PYTHONPATH=src nice -n 5 python bench/bench_dataloader.py [--atari] [--batches 400]``
(run it with the bench venv for TorchRL and with an interpreter that has Ray for the Ray rows).
"""

from __future__ import annotations

import argparse
import functools
import os
import time

import numpy as np
import torch

import replaystore as rs
from replaystore.integrations.dataloader import ReplayDataset, replay_loader

BATCH = 256


def make_data(n: int, atari: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shape, dtype = ((4, 84, 84), np.uint8) if atari else ((17,), np.float32)
    if atari:
        obs = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    else:
        obs = rng.normal(size=(n, *shape)).astype(dtype)
    return {"obs": obs, "next_obs": obs.copy(), "action": rng.integers(0, 6, n),
            "reward": rng.random(n).astype(np.float32), "done": rng.random(n) < 0.01}


def consume(batches, count: int, step_ms: float) -> float:
    """Iterate ``count`` batches, touching each and 'training' ``step_ms``; return batches/s."""
    it = iter(batches)
    next(it)  # warm-up (worker start, first round trip) is not timed
    t0 = time.perf_counter()
    for _ in range(count):
        b = next(it)
        obs = b["data"]["obs"] if "data" in b else b["obs"]
        float(obs[0].float().sum())
        if step_ms:
            time.sleep(step_ms / 1000)
    return count / (time.perf_counter() - t0)


def table_loop(table: rs.Table):
    while True:
        s = table.sample(BATCH, as_tensor=True)
        yield {"data": s.data, "keys": s.keys}


def torchrl_loop(data: dict, capacity: int):
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, RandomSampler, ReplayBuffer

    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=RandomSampler(), batch_size=BATCH, prefetch=4)
    rb.extend(TensorDict({k: torch.from_numpy(v) for k, v in data.items()}, batch_size=[capacity]))
    while True:
        yield rb.sample()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--atari", action="store_true")
    args = ap.parse_args()
    if args.atari:
        args.capacity = min(args.capacity, 20_000)
    data = make_data(args.capacity, args.atari)

    def table() -> rs.Table:
        t = rs.Table(args.capacity, seed=0)
        t.extend(data)
        return t

    rows = []
    for step_ms in (0.0, 5.0):
        t = table()
        rows.append(("Table.sample loop (no prefetch)", step_ms, consume(table_loop(t), args.batches, step_ms)))
        ds = ReplayDataset(t, BATCH, prefetch=4)
        rows.append(("ReplayDataset, Table, 0 workers", step_ms, consume(replay_loader(ds), args.batches, step_ms)))
        try:
            import torchrl  # noqa: F401

            rows.append(("TorchRL ReplayBuffer(prefetch=4)", step_ms,
                         consume(torchrl_loop(data, args.capacity), args.batches, step_ms)))
        except ImportError:
            pass
    try:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        from replaystore import ray as rsr

        client = rsr.serve({"replay": functools.partial(rs.Table, args.capacity, seed=0)}, name="bench-dataloader")
        for i in range(0, args.capacity, 10_000):
            client.extend({k: v[i: i + 10_000] for k, v in data.items()})
        for step_ms in (0.0, 5.0):
            ds = ReplayDataset(client, BATCH, prefetch=4)
            rows.append(("ReplayDataset, Ray service, 0 workers", step_ms,
                         consume(replay_loader(ds), args.batches, step_ms)))
            loader = replay_loader(ds, num_workers=2, prefetch_factor=2)
            rows.append(("ReplayDataset, Ray service, 2 workers", step_ms, consume(loader, args.batches, step_ms)))
            del loader
        client.shutdown()
    except ImportError:
        print("ray not installed: Ray rows skipped")

    what = "uint8[4,84,84] obs/next_obs" if args.atari else "float32[17] obs/next_obs"
    print(f"\nbatches of {BATCH} ({what}), table of {args.capacity:,}, {args.batches} batches timed\n")
    print("| implementation | training step | batches/s | items/s |")
    print("|---|---|---|---|")
    for name, step_ms, rate in rows:
        print(f"| {name} | {step_ms:.0f} ms | {rate:,.0f} | {rate * BATCH:,.0f} |")


if __name__ == "__main__":
    main()
