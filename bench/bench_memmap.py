"""A table larger than RAM: a memory-mapped 20 GB table sampled by a process limited to 4 GB.

The performance issue's item 4. The script puts itself into a cgroup-v1 memory cgroup with
``memory.limit_in_bytes`` = ``--limit`` (needs root and /sys/fs/cgroup/memory; otherwise it says so
and runs unlimited), builds a ``MemmapColumnStorage`` table of ``--gigabytes`` on disk (items of
``--item-kb`` KB of uint8 plus a float32 reward), checks that sampled rows hold the values written
for their keys, and reports sample throughput (batch 32 and 256) cold (page cache dropped) and warm
(a second pass, with whatever the page cache kept under the limit), next to an in-RAM table of the same item
shape holding as many items as fit in ``--ram-gigabytes``.

Usage (root)::

    python bench/bench_memmap.py --dir /var/tmp/rs-memmap --gigabytes 20 --limit 4G
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

import numpy as np

import replaystore as rs

CGROUP = Path("/sys/fs/cgroup/memory/replaystore-bench")


def limit_memory(limit: str) -> str:
    try:
        CGROUP.mkdir(exist_ok=True)
        (CGROUP / "memory.limit_in_bytes").write_text(limit)
        (CGROUP / "tasks").write_text(str(os.getpid()))
        return f"cgroup {CGROUP} memory.limit_in_bytes={(CGROUP / 'memory.limit_in_bytes').read_text().strip()}"
    except OSError as e:
        return f"no memory limit applied ({e})"


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e9


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3")
        return True
    except OSError:
        return False


def fill(table: rs.Table, n: int, item: int, chunk: int = 2048) -> float:
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        ids = np.arange(start, start + k)
        frames = np.empty((k, item), np.uint8)
        frames[:] = (ids % 251).astype(np.uint8)[:, None]  # row content derived from its position
        table.extend({"frame": frames, "reward": ids.astype(np.float32)})
    if isinstance(table.storage, rs.MemmapColumnStorage):
        table.storage.flush()
    return time.perf_counter() - t0


def check(table: rs.Table, batches: int = 20) -> None:
    for _ in range(batches):
        s = table.sample(64)
        ids = s.keys  # keys were assigned 0..n-1 in insertion order
        assert np.array_equal(s.data["reward"], ids.astype(np.float32)), "reward does not match its key"
        assert np.all(s.data["frame"][:, 0] == (ids % 251).astype(np.uint8)), "frame does not match its key"
        assert np.all(s.data["frame"][:, -1] == (ids % 251).astype(np.uint8))


def rate(table: rs.Table, batch: int, seconds: float) -> float:
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        table.sample(batch)
        n += 1
    return n / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp/replaystore-memmap-bench")
    ap.add_argument("--gigabytes", type=float, default=20.0)
    ap.add_argument("--ram-gigabytes", type=float, default=1.0)
    ap.add_argument("--item-kb", type=int, default=20)
    ap.add_argument("--limit", default="4G")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--keep", action="store_true", help="keep the files afterwards")
    args = ap.parse_args()
    item = args.item_kb * 1024

    # the in-RAM reference first, before the limit applies to this process
    n_ram = int(args.ram_gigabytes * 1e9 / item)
    ram = rs.Table(n_ram, seed=0)
    fill(ram, n_ram, item)
    ram_rates = {b: rate(ram, b, args.seconds) for b in (32, 256)}
    del ram

    print(limit_memory(args.limit))
    n = int(args.gigabytes * 1e9 / item)
    d = Path(args.dir)
    shutil.rmtree(d, ignore_errors=True)
    table = rs.Table(n, storage=f"memmap:{d}", seed=0)
    fill_s = fill(table, n, item)
    size_gb = sum(f.stat().st_size for f in d.iterdir()) / 1e9
    print(f"filled {n:,} items, {size_gb:.1f} GB on disk, in {fill_s:.0f} s ({size_gb / fill_s * 1e3:.0f} MB/s); "
          f"RSS now {rss_gb():.2f} GB")
    check(table)
    dropped = drop_caches()
    cold = {b: rate(table, b, args.seconds) for b in (32, 256)}
    warm = {b: rate(table, b, args.seconds) for b in (32, 256)}  # the page cache now holds what fits
    check(table)
    print(f"sampling checked against the values written (RSS {rss_gb():.2f} GB; caches dropped: {dropped})\n")
    print("| table | sample 32 /s | sample 256 /s |")
    print("|---|---:|---:|")
    print(f"| in RAM ({args.ram_gigabytes:g} GB) | {ram_rates[32]:,.0f} | {ram_rates[256]:,.0f} |")
    cold_label = f"memmap {size_gb:.0f} GB, cold (page cache dropped, limit {args.limit})"
    print(f"| {cold_label} | {cold[32]:,.0f} | {cold[256]:,.0f} |")
    print(f"| memmap {size_gb:.0f} GB, after the first pass | {warm[32]:,.0f} | {warm[256]:,.0f} |")
    table.storage.close()
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
