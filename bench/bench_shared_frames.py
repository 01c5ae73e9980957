"""Atari transitions through shared tables: frame stacks (each frame once) against columns, in-process and cpprb.

Workload: obs and next_obs are uint8[4, 84, 84] frame stacks (one transition: 56 KB as columns).
``W`` writer processes (forked) each play their own environment: they ``extend`` ``B`` consecutive
transitions of their episode at a time (a chunk continues the writer's previous one), while one
learner process samples 256 (uniform), for ``--seconds``; the table is prefilled to half first.

Buffers, all in this one run:

- ``shared frames``: ``SharedTable.create(..., storage=rs.FrameStackStorage(capacity))``.
- ``shared columns``: the same table with column storage (obs and next_obs stored whole).
- ``cpprb MP``: ``cpprb.MPReplayBuffer`` with obs and next_obs as separate fields. Its MP buffers
  have no ``next_of``/``stack_compress``: ``MPReplayBuffer(..., next_of=..., stack_compress=...)``
  accepts the keywords and ignores them (cpprb 11: ``next_obs`` is then not stored at all).
- ``in-process frames`` (the limit): an ``rs.Table`` with ``FrameStackStorage`` in this process,
  extend alone then sample alone (no lock round trip, no other process).

Reported per phase: rows inserted per second (all writers), the writers' CPU time per ``extend``,
the learner's batches per second and CPU time per batch, and frames written per item (frames
tables: ``1`` is a continuation every time, ``1 + S/B`` a segment start per chunk). Memory: the
segment a 100k-item table needs (frames vs columns), from a dry run of the placement (nothing is
allocated). The machine may be loaded: compare ratios within one run.

Usage::

    PYTHONPATH=src nice -n 10 bench/.venv/bin/python bench/bench_shared_frames.py [--seconds 1]
        [--writers 1,2] [--rows 1,8,64] [--capacity 4000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time

import numpy as np

import replaystore as rs
from replaystore.placement import placed
from replaystore.shared import SharedTable

S, H, W = 4, 84, 84
SAMPLE = 256
SPEC = {
    "obs": ((S, H, W), np.uint8),
    "action": ((), np.int64),
    "reward": ((), np.float32),
    "next_obs": ((S, H, W), np.uint8),
    "done": ((), np.bool_),
}
EPISODE = 500


def episode(seed: int) -> dict:
    """One episode of ``EPISODE`` transitions as batch arrays (stacks of a random frame sequence)."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (EPISODE + S, H, W), dtype=np.uint8)
    stacks = np.lib.stride_tricks.sliding_window_view(frames, S, axis=0).transpose(0, 3, 1, 2)
    return {
        "obs": np.ascontiguousarray(stacks[:EPISODE]),
        "action": np.arange(EPISODE) % 6,
        "reward": np.ones(EPISODE, np.float32),
        "next_obs": np.ascontiguousarray(stacks[1 : EPISODE + 1]),
        "done": np.arange(EPISODE) == EPISODE - 1,
    }


def chunks(ep: dict, rows: int):
    """Endless consecutive chunks of ``rows`` transitions of ``ep`` (views, no copies)."""
    while True:
        for i in range(0, EPISODE - rows + 1, rows):
            yield {k: v[i : i + rows] for k, v in ep.items()}


def segment_bytes(capacity: int, frames: bool) -> int:
    """The bytes a shared table's arrays take (a dry run of the placement: nothing allocated)."""
    total = 0

    def record(name, shape, dtype, fill):
        nonlocal total
        total += int(np.prod(shape)) * np.dtype(dtype).itemsize
        return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, (0,) * len(shape))

    with placed(record):
        storage = rs.FrameStackStorage(capacity, spec=SPEC) if frames else None
        rs.Table(capacity, storage=storage, spec=None if frames else SPEC)
    return total


# -- the buffers -------------------------------------------------------------------------------------
class SharedFrames:
    name = "shared frames"
    frames = True

    def __init__(self, capacity, directory):
        storage = rs.FrameStackStorage(capacity) if self.frames else None
        self.t = SharedTable.create(f"bench-frames-{os.getpid()}", capacity, SPEC, storage=storage, directory=directory)

    def writer(self, ep, rows):
        t, it = self.t, chunks(ep, rows)
        t.prefault()
        return lambda: t.extend(next(it))

    def learner(self):
        t = self.t
        t.prefault()
        return lambda: t.sample(SAMPLE)

    def frames_per_item(self):
        if not self.frames:
            return None
        n = self.t.stats()["inserts"]  # (enters the lock: this process's copy of the scalars is current)
        return self.t.storage.frames_written / n

    def close(self):
        self.t.close()


class SharedColumns(SharedFrames):
    name = "shared columns"
    frames = False


class Cpprb:
    name = "cpprb MPReplayBuffer"

    def __init__(self, capacity, directory):
        import cpprb

        env = {k: {"shape": shape or 1, "dtype": dtype} for k, (shape, dtype) in SPEC.items()}
        self.rb = cpprb.MPReplayBuffer(capacity, env, ctx=mp.get_context("fork"))

    def writer(self, ep, rows):
        rb, it = self.rb, chunks(ep, rows)
        return lambda: rb.add(**next(it))

    def learner(self):
        return lambda: self.rb.sample(SAMPLE)

    def frames_per_item(self):
        return None

    def close(self):
        pass


def _loop(fn, start_at, stop_at, queue, rows):
    fn()  # warm
    while time.time() < start_at:
        time.sleep(0.001)
    calls, c0 = 0, time.process_time()
    while time.time() < stop_at:
        fn()
        calls += 1
    queue.put((calls, calls * rows, time.process_time() - c0))


def _writer(buf, ep, rows, start_at, stop_at, q):
    _loop(buf.writer(ep, rows), start_at, stop_at, q, rows)


def _learner(buf, start_at, stop_at, q):
    _loop(buf.learner(), start_at, stop_at, q, 0)


def phase(cls, eps, writers, rows, seconds, capacity, directory) -> dict:
    buf = cls(capacity, directory)
    try:
        fill = buf.writer(eps[-1], 250)
        for _ in range(capacity // 2 // 250):
            fill()
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        start_at = time.time() + 1.0
        stop_at = start_at + seconds
        procs = [ctx.Process(target=_writer, args=(buf, eps[i], rows, start_at, stop_at, q)) for i in range(writers)]
        procs.append(ctx.Process(target=_learner, args=(buf, start_at, stop_at, q)))
        for p in procs:
            p.start()
        try:
            results = [q.get(timeout=seconds + 60) for _ in procs]
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join(10)
        fpi = buf.frames_per_item()
    finally:
        buf.close()
    learner = [r for r in results if r[1] == 0][0]
    ws = [r for r in results if r[1] != 0]
    calls = sum(r[0] for r in ws) or 1
    return {
        "inserts_s": sum(r[1] for r in ws) / seconds,
        "extend_cpu_us": sum(r[2] for r in ws) / calls * 1e6,
        "batches_s": learner[0] / seconds,
        "sample_cpu_us": learner[2] / max(1, learner[0]) * 1e6,
        "frames_per_item": fpi,
    }


def alone(ep, rows, capacity, seconds) -> dict:
    """The in-process frame-stack Table: extend alone, then sample alone, in this process."""
    t = rs.Table(capacity, storage=rs.FrameStackStorage(capacity, spec=SPEC))
    fill = chunks(ep, 250)
    for _ in range(-(-capacity // 250)):  # one full cycle: every page touched
        t.extend(next(fill))
    out = {}
    it = chunks(ep, rows)
    for key, fn, n in (("extend", lambda: t.extend(next(it)), rows), ("sample", lambda: t.sample(SAMPLE), 0)):
        calls, c0, stop = 0, time.process_time(), time.time() + seconds / 2
        while time.time() < stop:
            fn()
            calls += 1
        cpu = time.process_time() - c0
        out[key + "_cpu_us"] = cpu / calls * 1e6
        out[key + "_per_s"] = calls * (n or 1) / (seconds / 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--writers", default="1,2")
    ap.add_argument("--rows", default="1,8,64")
    ap.add_argument("--capacity", type=int, default=4_000)
    ap.add_argument("--directory", default=None, help="where the segments go (default /dev/shm)")
    args = ap.parse_args()
    root = args.directory or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    directory = tempfile.mkdtemp(prefix="bench-shared-frames-", dir=root)
    fr, co = segment_bytes(100_000, True), segment_bytes(100_000, False)
    print(
        f"# segment arrays for 100,000 Atari transitions: frames {fr / 2**30:.2f} GiB, columns {co / 2**30:.2f} GiB "
        f"({co / fr:.1f}x); cpprb MPReplayBuffer (obs + next_obs, no next_of in MP mode) "
        f"{100_000 * 2 * S * H * W / 2**30:.2f} GiB"
    )
    print(
        f"# {args.seconds}s per phase, capacity {args.capacity:,}, load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs (compare ratios within this run)"
    )
    print(
        "| W | B | buffer | rows/s in | extend CPU us | x in-proc | batches/s | sample CPU us | x in-proc "
        "| frames/item |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    eps = [episode(seed) for seed in range(max(int(w) for w in args.writers.split(",")) + 1)]
    for rows in [int(x) for x in args.rows.split(",")]:
        base = alone(eps[0], rows, args.capacity, args.seconds)
        print(
            f"| - | {rows} | in-process frames (alone) | {base['extend_per_s']:,.0f} | {base['extend_cpu_us']:.0f} "
            f"| 1.00 | {base['sample_per_s']:,.0f} | {base['sample_cpu_us']:.0f} | 1.00 | |",
            flush=True,
        )
        for w in [int(x) for x in args.writers.split(",")]:
            for cls in (SharedFrames, SharedColumns, Cpprb):
                try:
                    r = phase(cls, eps, w, rows, args.seconds, args.capacity, directory)
                except Exception as e:  # noqa: BLE001 - a peer that cannot run this row says why
                    print(f"| {w} | {rows} | {cls.name} | failed: {type(e).__name__}: {str(e)[:80]} |", flush=True)
                    continue
                fpi = "" if r["frames_per_item"] is None else f"{r['frames_per_item']:.2f}"
                print(
                    f"| {w} | {rows} | {cls.name} | {r['inserts_s']:,.0f} | {r['extend_cpu_us']:.0f} | "
                    f"{r['extend_cpu_us'] / base['extend_cpu_us']:.2f} | {r['batches_s']:,.0f} | "
                    f"{r['sample_cpu_us']:.0f} | {r['sample_cpu_us'] / base['sample_cpu_us']:.2f} | {fpi} |",
                    flush=True,
                )
    print("# one phase per row (no repeats): run twice to see the noise")
    os.rmdir(directory)


if __name__ == "__main__":
    main()
