"""Episodes in a shared table (R2D2 on one host): writer processes call ``extend_steps``, a learner
process calls ``sample_sequences`` or ``sample_nstep``; against the in-process Table doing the same
calls alone in one process (the limit: no lock round trip, no replay of other processes' steps).

Each phase: a table of ``--capacity`` steps prefilled to half, ``W`` writer processes (forked) each
calling ``extend_steps`` of ``B`` rows (one row per environment of its own: streams ``w * B ..
w * B + B - 1``, episodes of ~100 steps) in a loop while one learner process draws ``32``
sequences of ``20`` steps (``sequences``) or ``256`` n-step transitions, n = 3 (``nstep``) for
``--seconds``. Reported: rows inserted per second, the writers' CPU time per call, the learner's
batches per second and CPU time per batch, and the ratios to the in-process table's CPU per call
(alone: the in-process table has no concurrent writer, so its learner replays nothing). The
machine may be loaded: compare the ratios of one run.

Usage::

    PYTHONPATH=src /work/venv/bin/python bench/bench_shared_episodes.py [--seconds 2] [--writers 1,2]
        [--rows 1,8,64,256] [--reads sequences,nstep]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time

import numpy as np

import replaystore as rs
from replaystore.shared import SharedTable

SPEC = {"obs": ((16,), np.float32), "action": ((), np.int64), "reward": ((), np.float32)}
EPISODE = 100


def steps_of(rows: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.random((rows, 16), dtype=np.float32),
        "action": rng.integers(0, 4, rows),
        "reward": rng.random(rows, dtype=np.float32),
    }


def writer_fn(table, rows: int, first_stream: int, seed: int):
    data = steps_of(rows, seed)
    streams = np.arange(first_stream, first_stream + rows)
    rng = np.random.default_rng(seed)
    ends = [rng.random(rows) < 1 / EPISODE for _ in range(64)]
    i = [0]

    def fn():
        i[0] += 1
        table.extend_steps(data, streams, terminated=ends[i[0] % 64])

    return fn


def learner_fn(table, read: str):
    if read == "sequences":
        return lambda: table.sample_sequences(32, 20, timeout=10)
    return lambda: table.sample_nstep(256, 3, 0.99, timeout=10)


def _loop(fn, stop_at, queue, rows):
    fn()
    calls, c0 = 0, time.process_time()
    while time.time() < stop_at:
        fn()
        calls += 1
    queue.put((calls, calls * rows, time.process_time() - c0))


def _writer_proc(table, rows, w, start_at, stop_at, queue):
    fn = writer_fn(table, rows, w * rows, 10 + w)
    while time.time() < start_at:
        time.sleep(0.001)
    _loop(fn, stop_at, queue, rows)


def _learner_proc(table, read, start_at, stop_at, queue):
    fn = learner_fn(table, read)
    while time.time() < start_at:
        time.sleep(0.001)
    _loop(fn, stop_at, queue, 0)


def prefill(table, capacity: int) -> None:
    fill = writer_fn(table, 64, 0, 99)
    for _ in range(capacity // 2 // 64):
        fill()


def episodes(writers: int, rows: int) -> rs.Episodes:
    return rs.Episodes(max_streams=max(64, writers * rows))


def phase(read, writers, rows, seconds, capacity, directory) -> dict:
    table = SharedTable.create(
        f"bench-ep-{writers}-{rows}-{read}", capacity, SPEC, episodes=episodes(writers, rows), directory=directory
    )
    try:
        prefill(table, capacity)
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        start_at = time.time() + 0.5
        stop_at = start_at + seconds
        procs = [ctx.Process(target=_writer_proc, args=(table, rows, w, start_at, stop_at, q)) for w in range(writers)]
        procs.append(ctx.Process(target=_learner_proc, args=(table, read, start_at, stop_at, q)))
        for p in procs:
            p.start()
        results = [q.get(timeout=seconds + 60) for _ in procs]
        for p in procs:
            p.join(10)
    finally:
        table.close()
    learner = [r for r in results if r[1] == 0][0]
    ws = [r for r in results if r[1] != 0]
    calls = sum(r[0] for r in ws) or 1
    return {
        "inserts_s": sum(r[1] for r in ws) / seconds,
        "extend_cpu_us": sum(r[2] for r in ws) / calls * 1e6,
        "batches_s": learner[0] / seconds,
        "sample_cpu_us": learner[2] / max(1, learner[0]) * 1e6,
    }


class _ListQueue:
    def __init__(self):
        self.items = []

    def put(self, x):
        self.items.append(x)


def alone(read, rows, capacity, seconds) -> dict:
    """The in-process Table: extend_steps alone, then the read alone."""
    table = rs.Table(capacity, spec=SPEC, episodes=episodes(1, rows))
    prefill(table, capacity)
    out = {}
    for key, fn, n in (("extend", writer_fn(table, rows, 0, 1), rows), ("sample", learner_fn(table, read), 0)):
        q = _ListQueue()
        _loop(fn, time.time() + seconds / 2, q, n)
        calls, _, cpu = q.items[0]
        out[key + "_cpu_us"] = cpu / max(1, calls) * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--capacity", type=int, default=100_000)
    ap.add_argument("--writers", default="1,2")
    ap.add_argument("--rows", default="1,8,64,256")
    ap.add_argument("--reads", default="sequences,nstep")
    args = ap.parse_args()
    directory = tempfile.mkdtemp(prefix="bench-shared-ep-")
    print(f"capacity {args.capacity}, {args.seconds:g} s per phase; CPU per call in us; ratio = shared / in-process")
    print(
        f"{'read':10s} {'W':>2s} {'B':>4s} {'rows/s':>10s} {'extend us':>10s} {'x':>6s} "
        f"{'batch/s':>8s} {'sample us':>10s} {'x':>6s}"
    )
    for read in args.reads.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            base = alone(read, rows, args.capacity, args.seconds)
            for writers in (int(w) for w in args.writers.split(",")):
                r = phase(read, writers, rows, args.seconds, args.capacity, directory)
                print(
                    f"{read:10s} {writers:2d} {rows:4d} {r['inserts_s']:10.0f} {r['extend_cpu_us']:10.1f} "
                    f"{r['extend_cpu_us'] / base['extend_cpu_us']:6.2f} {r['batches_s']:8.0f} "
                    f"{r['sample_cpu_us']:10.1f} {r['sample_cpu_us'] / base['sample_cpu_us']:6.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
