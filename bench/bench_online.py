"""The cost of replaystore.online per rollout, against a bare Table doing the same inserts and samples.

Workload, one thread, repeated for ``--seconds``: a trainer step of ``--batch`` groups of
``--group`` rollouts (a small dict each). ``RolloutBuffer``: acquire the tickets, add every member,
sample the groups, ``set_version``; with ``--journal`` also through its LMDB journal (tmpfs or disk
as ``--dir`` says). The floor: a bare ``Table`` (object storage, ``Fifo`` sampler,
``max_times_sampled=1``) inserting the same rollouts one by one and sampling them. No peer library
offers pacing, groups and version ranges as a reusable part, so the comparison is with the machine
it is built on.

    python bench/bench_online.py [--batch 8] [--group 4] [--seconds 2] [--repeats 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import replaystore as rs
from replaystore.online import OnlineJournal, RolloutBuffer


def bench_buffer(args: argparse.Namespace, journal_dir: str | None) -> float:
    journal = OnlineJournal(journal_dir) if journal_dir else None
    buf = RolloutBuffer(4096, batch_size=args.batch, max_staleness=1, group_size=args.group, journal=journal)
    item = {"tokens": list(range(16)), "reward": 1.0}
    n, v, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        for t in buf.acquire(args.batch, timeout=5):
            for _ in range(args.group):
                buf.add(item, group=t, versions=(v, v), length=16)
        buf.sample(args.batch, timeout=5)
        v += 1
        buf.set_version(v)
        n += args.batch * args.group
    dt = time.perf_counter() - t0
    buf.close()
    return dt / n * 1e6


def bench_table(args: argparse.Namespace) -> float:
    table = rs.Table(4096, sampler=rs.Fifo(), remover=rs.Fifo(), max_times_sampled=1, storage="objects")
    item = {"tokens": list(range(16)), "reward": 1.0}
    n, t0 = 0, time.perf_counter()
    k = args.batch * args.group
    while time.perf_counter() - t0 < args.seconds:
        for _ in range(k):
            table.add(item)
        table.sample(k, timeout=5)
        n += k
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    """Print microseconds per rollout for each configuration (medians of the repeats)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the journal goes (default: a temporary directory)")
    args = ap.parse_args()
    rows = {"bare Table (add + sample)": [], "RolloutBuffer (pacing, groups)": [],
            "RolloutBuffer + journal": []}
    for _ in range(args.repeats):
        rows["bare Table (add + sample)"].append(bench_table(args))
        rows["RolloutBuffer (pacing, groups)"].append(bench_buffer(args, None))
        with tempfile.TemporaryDirectory(dir=args.dir) as d:
            rows["RolloutBuffer + journal"].append(bench_buffer(args, d))
    base = statistics.median(rows["bare Table (add + sample)"])
    print(f"batch {args.batch} groups x {args.group} rollouts per step; medians of {args.repeats}")
    print("| configuration | us per rollout | x bare Table |")
    print("| --- | ---: | ---: |")
    for name, vals in rows.items():
        m = statistics.median(vals)
        print(f"| {name} | {m:.1f} | {m / base:.1f} |")


if __name__ == "__main__":
    main()
