"""Shared memory a full multi-process buffer holds: a SharedTable against cpprb and TorchRL.

What each buffer of ``--capacity`` small transitions (obs f32[4], action i64, reward f32, next_obs
f32[4], done: 45 bytes) takes once every slot was written, measured as the growth of ``Shmem``
in ``/proc/meminfo`` (every tmpfs file, ``/dev/shm`` segment, memfd and shared anonymous map of
the machine), each buffer built and filled in a child process of its own (freed when it exits):
run it on a quiet machine. Rows:

- ``SharedTable`` in ring mode (the ``Fifo`` remover, nothing deleted out of order: its
  out-of-ring structures are a hole in the segment), after a ``delete`` out of insertion order
  (they are reserved then), and with ``reserve_all=True``; uniform and prioritized (and a
  prioritized one in ring mode with float32 trees: ``Prioritized(tree_dtype=np.float32)``);
- cpprb ``MPReplayBuffer`` / ``MPPrioritizedReplayBuffer`` (its shared arrays);
- TorchRL ``LazyMemmapStorage`` with its scratch directory in ``/dev/shm`` (uniform; its sampler
  state is per process);
- the payload alone (capacity x 45 bytes), the floor.

``Shmem`` counts every process's shared memory, so on a busy machine other work moves it; for the
``SharedTable`` rows the last column also gives the blocks its segment file holds (``st_blocks``:
what the table itself takes, whatever else runs).

Usage (the bench venv has cpprb and TorchRL)::

    PYTHONPATH=src bench/.venv/bin/python bench/bench_shared_memory.py [--capacity 1000000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from bench_shared import batch_of, spec_of  # noqa: E402 - the small transitions of bench_shared.py

import replaystore as rs
from replaystore.shared import SharedTable

SPEC = spec_of("small")
ROW_BYTES = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in SPEC.values())


def shmem() -> int:
    """Bytes of shared memory the machine holds now (``Shmem`` of ``/proc/meminfo``)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Shmem line in /proc/meminfo")


def fill(extend, capacity: int, step: int = 4096) -> None:
    for i in range(0, capacity, step):
        extend(batch_of("small", min(step, capacity - i), i))


def shared(
    capacity: int, prioritized: bool, reserve_all: bool, delete: bool, trees: str = "float64"
) -> tuple[int, int]:
    before = shmem()
    sampler = rs.Prioritized(0.6, 0.4, tree_dtype=trees) if prioritized else rs.Uniform()
    t = SharedTable.create(f"mem-{mp.current_process().pid}", capacity, SPEC, sampler=sampler, reserve_all=reserve_all)
    try:
        fill(t.extend, capacity)
        if delete:
            t.delete([int(t.keys()[capacity // 2])])  # out of insertion order: ring mode ends
        t.sample(256)
        held = sum(os.stat(f).st_blocks * 512 for f in Path(t.path).iterdir() if f.is_file())
        return shmem() - before, held
    finally:
        t.close()


def cpprb(capacity: int, prioritized: bool) -> int:
    import cpprb as c

    before = shmem()
    env = {k: {"shape": shape or 1, "dtype": dtype} for k, (shape, dtype) in SPEC.items()}
    cls = c.MPPrioritizedReplayBuffer if prioritized else c.MPReplayBuffer
    rb = cls(capacity, env, ctx=mp.get_context("fork"))
    fill(lambda b: rb.add(**b), capacity)
    rb.sample(256)
    return shmem() - before


def torchrl(capacity: int) -> int:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    scratch = tempfile.mkdtemp(dir="/dev/shm")
    before = shmem()
    try:
        rb = ReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=scratch), shared=True, batch_size=256)

        def extend(b):
            rb.extend(TensorDict({k: torch.from_numpy(v) for k, v in b.items()}, batch_size=[len(b["obs"])]))

        fill(extend, capacity)
        rb.sample()
        return shmem() - before
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(queue, fn, args) -> None:
    queue.put(fn(*args))


def isolated(fn, *args) -> Any:
    """``fn(*args)`` in a forked child: what it maps is unmapped (and freed) when the child exits."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_run, args=(queue, fn, args))
    p.start()
    try:
        return queue.get(timeout=600)
    finally:
        p.join(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacity", type=int, default=1_000_000)
    args = ap.parse_args()
    cap = args.capacity
    rows: list[tuple[str, str, Any]] = []
    for prio in (False, True):
        sampler = "prioritized" if prio else "uniform"
        rows.append((sampler, "SharedTable, ring mode", isolated(shared, cap, prio, False, False)))
        if prio:
            rows.append(
                (sampler, "SharedTable, ring mode, float32 trees", isolated(shared, cap, prio, False, False, "float32"))
            )
        rows.append((sampler, "SharedTable, after a delete out of order", isolated(shared, cap, prio, False, True)))
        rows.append((sampler, "SharedTable, reserve_all=True", isolated(shared, cap, prio, True, False)))
        try:
            rows.append((sampler, "cpprb MP", isolated(cpprb, cap, prio)))
        except ImportError:
            rows.append((sampler, "cpprb MP (not installed)", None))
        if not prio:
            try:
                rows.append((sampler, "TorchRL LazyMemmapStorage in /dev/shm", isolated(torchrl, cap)))
            except ImportError:
                rows.append((sampler, "TorchRL (not installed)", None))
    print(f"# bench_shared_memory: {cap:,} small transitions ({ROW_BYTES} B each: {cap * ROW_BYTES / 2**20:.1f} MiB)")
    print("| sampler | buffer | shared memory MiB | B per slot | x payload | segment file B per slot |")
    print("|---|---|---|---|---|---|")
    for sampler, name, used in rows:
        if used is None:
            print(f"| {sampler} | {name} | - | - | - | - |")
            continue
        used, held = used if isinstance(used, tuple) else (used, None)
        file = "-" if held is None else f"{held / cap:.1f}"
        print(f"| {sampler} | {name} | {used / 2**20:.1f} | {used / cap:.1f} | {used / cap / ROW_BYTES:.2f} | {file} |")


if __name__ == "__main__":
    main()
