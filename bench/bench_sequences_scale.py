"""Sequences and n-step returns as the data grows: 1M, 10M and 100M stored steps in one run (issue 36 item 5).

One worker process per table (so the tables live side by side and the rounds interleave), each a
FIFO ``Table`` with ``Episodes()`` filled with ``n`` small steps (obs uint8[4], action uint8,
reward float16: 7 B of payload a step, so 100M steps fit the disk and the bookkeeping fits RAM),
episodes of 150..1499 steps (90% terminated, 10% truncated), one stream. Tables:

- ``1M-ram``, ``10M-ram``: the payload in RAM (``ColumnStorage``);
- ``1M-memmap``, ``100M-memmap``: the payload in ``MemmapColumnStorage`` files under ``--dir``
  (warm: the files were just written, so the page cache holds them unless memory is short).

Workloads: ``seq``: ``sample_sequences(32, 80, burn_in=40)`` (32 x 120 steps, strict, uniform);
``nstep``: ``sample_nstep(256, 3, 0.99)``.

Per call: CPU µs (``time.process_time`` inside the worker: steadier than wall on a shared
machine), wall µs, and page faults (minor/major from ``getrusage``). Rounds interleave the tables
(rotating the order), ``--repeats`` rounds, medians reported. ``--profile`` adds, per table and
workload, the functions with the most own time (cProfile), to say where the cost grows.

Usage::

    PYTHONPATH=src nice -n 5 /work/venv/bin/python bench/bench_sequences_scale.py \\
        --dir /work/tmp/rs-scale [--scales 1M-ram,1M-memmap,10M-ram,100M-memmap] \\
        [--repeats 5] [--seconds 1.0] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

CHUNK = 1 << 20
BURN_IN, LENGTH, B_SEQ = 40, 80, 32
N_STEP, GAMMA, B_NSTEP = 3, 0.99, 256
WORKLOADS = ("seq", "nstep")
PARTS = (
    "seq.limit",
    "nstep.limit",
    "seq.starts",
    "seq.payload",
    "seq.meta",
    "nstep.plan",
    "nstep.payload",
    "nstep.meta",
    "nstep.draw",
    "nstep.count",
)


def parse_scale(name: str) -> tuple[int, bool]:
    """``"100M-memmap"`` -> ``(100_000_000, True)``."""
    size, _, kind = name.partition("-")
    mult = {"k": 10**3, "M": 10**6, "G": 10**9}[size[-1]]
    if kind not in ("ram", "memmap"):
        raise SystemExit(f"scale {name!r}: kind must be ram or memmap")
    return int(float(size[:-1]) * mult), kind == "memmap"


def memory() -> dict[str, float]:
    """Resident anonymous and file-backed memory of this process, in MB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1e3
    return out


class Ends:
    """Episode ends of one endless stream: lengths 150..1499, 10% truncated, drawn chunk by chunk."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.next_end = int(self.rng.integers(150, 1500)) - 1  # absolute position of the next end

    def chunk(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        term = np.zeros(hi - lo, bool)
        trunc = np.zeros(hi - lo, bool)
        while self.next_end < hi:
            (trunc if self.rng.random() < 0.1 else term)[self.next_end - lo] = True
            self.next_end += int(self.rng.integers(150, 1500))
        return term, trunc


def build(n: int, memmap: bool, directory: Path | None) -> Any:
    import replaystore as rs

    kw: dict[str, Any] = {}
    if memmap:
        kw["storage"] = rs.MemmapColumnStorage(n, directory)
    table = rs.Table(n, sampler=rs.Uniform(), remover=rs.Fifo(), episodes=rs.Episodes(), seed=0, **kw)
    ends = Ends(0)
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        pos = np.arange(lo, hi, dtype=np.int64)
        cols = {
            "obs": (pos[:, None] + np.arange(4)).astype(np.uint8),
            "action": (pos % 7).astype(np.uint8),
            "reward": (pos % 1000).astype(np.float16),
        }
        term, trunc = ends.chunk(lo, hi)
        table.extend_steps(cols, streams=0, terminated=term, truncated=trunc)
        del cols, pos
    return table


def calls(table: Any) -> dict[str, Any]:
    return {
        "seq": lambda: table.sample_sequences(B_SEQ, LENGTH, burn_in=BURN_IN),
        "nstep": lambda: table.sample_nstep(B_NSTEP, N_STEP, GAMMA),
    }


def parts(table: Any) -> dict[str, Any]:
    """The parts of the two calls, each alone on fresh random inputs (``--split``): where the cost grows."""
    from replaystore.episodes import nstep as _nstep
    from replaystore.episodes import sequences as _seq
    from replaystore.rows import meta_columns

    index, storage, meta = table._require_episodes(), table.storage, table._meta  # noqa: SLF001 - a bench
    rng = np.random.default_rng(1)
    width = BURN_IN + LENGTH
    # a pool of valid windows' first slots, drawn as the call draws them (no O(n) valid set: at
    # 100M steps its sort would take GBs); one stream written in order: a window is consecutive slots
    pool = np.concatenate([_seq.uniform_strict_starts(index, rng, 1024, width, BURN_IN)[1][:, 0] for _ in range(64)])
    firsts = pool[pool + width <= len(meta)]
    live = len(meta)

    def pick(k: int) -> np.ndarray:
        return firsts[rng.integers(0, len(firsts), k)]

    times_sampled = meta_columns(meta)[0]

    def count(slots: np.ndarray) -> np.ndarray:
        np.add.at(times_sampled, slots, 1)
        return times_sampled[slots]

    cols = list(storage.columns.values())
    obs, reward = storage.columns["obs"], storage.columns["reward"]
    offs, steps = np.arange(width), np.arange(N_STEP)

    def limit_seq() -> list[np.ndarray]:  # NumPy's gather of the same windows: no bookkeeping at all
        idx = (pick(B_SEQ)[:, None] + offs).ravel()
        return [np.take(c, idx, axis=0) for c in cols]

    def limit_nstep() -> list[np.ndarray]:  # rows, the rewards of n steps, the observation n steps on
        s = rng.integers(0, live - N_STEP, B_NSTEP)
        return [np.take(c, s, axis=0) for c in cols] + [
            np.take(reward, (s[:, None] + steps).ravel()),
            np.take(obs, s + N_STEP, axis=0),
        ]

    return {
        "seq.limit": limit_seq,
        "nstep.limit": limit_nstep,
        "seq.starts": lambda: _seq.uniform_strict_starts(index, rng, B_SEQ, width, BURN_IN),
        "seq.payload": lambda: storage.read_runs(pick(B_SEQ), width),
        # the windows' keys (the table's index: implicit in ring mode) and the start rows
        "seq.meta": lambda: (table._index.run_keys(pick(B_SEQ), width), meta.take(pick(B_SEQ), axis=0)),
        "nstep.plan": lambda: _nstep.plan_nstep(index, rng.integers(0, live - 8, B_NSTEP), N_STEP, False),
        "nstep.payload": lambda: storage.read(rng.integers(0, live, B_NSTEP)),
        "nstep.meta": lambda: meta.take(rng.integers(0, live, B_NSTEP), axis=0),
        # the whole draw without the table's lock and count; then the count alone (as the table
        # counts a sample: np.add.at on the times-sampled column, then a gather of it)
        "nstep.draw": lambda: _nstep.draw_nstep(
            index, table.sampler, storage, meta, table._index, B_NSTEP, N_STEP, GAMMA
        ),
        "nstep.count": lambda: count(rng.integers(0, live, B_NSTEP)),
    }


def check(table: Any) -> None:
    """The samples hold what was written: obs[:, 0] is the step's position mod 256 along a window."""
    s = table.sample_sequences(B_SEQ, LENGTH, burn_in=BURN_IN)
    obs = s.data["obs"].astype(np.int64)
    if not (np.diff(obs[:, :, 0], axis=1) % 256 == 1).all() or not ((obs[:, :, 1] - obs[:, :, 0]) % 256 == 1).all():
        raise RuntimeError("a sampled window is not the consecutive steps written")
    nst = table.sample_nstep(B_NSTEP, N_STEP, GAMMA)
    if len(nst.keys) != B_NSTEP or not (nst.steps >= 1).all():
        raise RuntimeError("sample_nstep returned a short batch or an empty transition")


def worker(name: str, directory: str, conn: Any) -> None:
    n, memmap = parse_scale(name)
    d = Path(directory) / name if memmap else None
    if d is not None:
        shutil.rmtree(d, ignore_errors=True)
    t0, c0 = time.perf_counter(), time.process_time()
    table = build(n, memmap, d)
    fill = (time.perf_counter() - t0, time.process_time() - c0)
    check(table)
    fns = calls(table)
    fns.update(parts(table))
    for fn in fns.values():
        fn()
    conn.send({"fill": fill, "mem": memory()})
    while True:
        cmd = conn.recv()
        if cmd[0] == "stop":
            break
        if cmd[0] == "time":
            fn, seconds = fns[cmd[1]], cmd[2]
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            k = 0
            t0, c0 = time.perf_counter(), time.process_time()
            while True:
                fn()
                k += 1
                if time.perf_counter() - t0 >= seconds and k >= 3:
                    break
            wall, cpu = (time.perf_counter() - t0) / k * 1e6, (time.process_time() - c0) / k * 1e6
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            conn.send((cpu, wall, (r1.ru_minflt - r0.ru_minflt) / k, (r1.ru_majflt - r0.ru_majflt) / k))
        elif cmd[0] == "profile":
            fn, k = fns[cmd[1]], cmd[2]
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(k):
                fn()
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(8)
            conn.send(buf.getvalue())
    table.close()
    if d is not None:
        shutil.rmtree(d, ignore_errors=True)
    conn.send("done")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/tmp/rs-scale", help="where memmap tables write their columns")
    ap.add_argument("--scales", default="1M-ram,1M-memmap,10M-ram,100M-memmap")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--split", action="store_true", help="also time the parts of each call (see parts())")
    ap.add_argument("--only", default="", help="comma-separated workloads/parts to time (default: all)")
    args = ap.parse_args()
    names = args.scales.split(",")
    for nm in names:
        parse_scale(nm)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    procs: dict[str, tuple[Any, Any]] = {}
    print(
        f"# bench_sequences_scale: python {sys.version.split()[0]}, numpy {np.__version__}, "
        f"load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    try:
        for nm in names:  # one at a time: fills do not compete for the cores
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker, args=(nm, args.dir, child), daemon=True)
            p.start()
            procs[nm] = (p, parent)
            if not parent.poll(3600):
                raise SystemExit(f"{nm}: no answer from its worker within an hour")
            info = parent.recv()
            wall, cpu = info["fill"]
            print(
                f"{nm}: filled in {wall:.1f} s wall ({cpu:.1f} s CPU), RssAnon "
                f"{info['mem'].get('RssAnon', 0):,.0f} MB, RssFile {info['mem'].get('RssFile', 0):,.0f} MB",
                flush=True,
            )
        res: dict[tuple[str, str], list[tuple[float, ...]]] = {}
        timed = WORKLOADS + (PARTS if args.split else ())
        if args.only:
            timed = tuple(w for w in timed if w in args.only.split(","))
        for r in range(args.repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            for wl in timed:
                for nm in order:
                    conn = procs[nm][1]
                    conn.send(("time", wl, args.seconds))
                    res.setdefault((nm, wl), []).append(conn.recv())
        print(f"\nload after: {os.getloadavg()[0]:.1f} (1 min)\n")
        for wl in timed:
            base = statistics.median(x[0] for x in res[(names[0], wl)])
            print(f"## {wl}: medians of {args.repeats} interleaved rounds of {args.seconds} s")
            print(
                "| table | CPU µs (min-max) | wall µs | vs "
                + names[0]
                + " (CPU) | minor faults/call | major faults/call |"
            )
            print("|---|---:|---:|---:|---:|---:|")
            for nm in names:
                xs = res[(nm, wl)]
                cpu = [x[0] for x in xs]
                print(
                    f"| {nm} | {statistics.median(cpu):.1f} ({min(cpu):.1f}-{max(cpu):.1f}) | "
                    f"{statistics.median(x[1] for x in xs):.1f} | {statistics.median(cpu) / base:.2f}x | "
                    f"{statistics.median(x[2] for x in xs):.2f} | {statistics.median(x[3] for x in xs):.3f} |"
                )
            print()
        if args.profile:
            for wl in WORKLOADS:
                for nm in names:
                    conn = procs[nm][1]
                    conn.send(("profile", wl, 2000))
                    print(f"### profile {nm} {wl} (2000 calls)\n{conn.recv()}")
    finally:
        for p, conn in procs.values():
            try:
                conn.send(("stop",))
                conn.poll(120) and conn.recv()
            except (OSError, EOFError, BrokenPipeError):
                pass
            p.join(30)
            if p.is_alive():
                p.kill()


if __name__ == "__main__":
    main()
