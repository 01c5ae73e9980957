"""A table larger than RAM: a memory-mapped 20 GB table sampled by a process limited to 4 GB.

The performance issue's item 4. The script puts itself into a cgroup-v1 memory cgroup with
``memory.limit_in_bytes`` = ``--limit`` (needs root and /sys/fs/cgroup/memory; otherwise it says so
and runs unlimited), builds a ``MemmapColumnStorage`` table of ``--gigabytes`` on disk (items of
``--item-kb`` KB of uint8 plus a float32 reward), checks that sampled rows hold the values written
for their keys, and reports sample throughput (batch 32 and 256) cold (page cache dropped) and warm
(a second pass, with whatever the page cache kept under the limit), next to an in-RAM table of the same item
shape holding as many items as fit in ``--ram-gigabytes``.

Then, in the same process and under the same limit (``--no-rlox`` leaves it out), rlox 1.2's
``MmapReplayBuffer`` with the same number of items of the same size: rlox stores fixed float32
fields ``obs`` and ``next_obs`` (``obs_dim`` each) plus ``action``, ``reward`` and two flag bytes,
so an item's ``--item-kb`` KB are split into ``obs`` and ``next_obs`` of ``item / 8`` float32 each
(same bytes per item; values are float32 instead of uint8), ``action`` is one float. It keeps
``--rlox-hot`` items in RAM and spills older ones to its memory-mapped cold file; it is filled
with ``push_batch`` and sampled with ``sample(n, seed)`` (a new seed per call). Its sample returns
no keys, so its check is internal: a row's ``obs``, ``next_obs`` and ``reward`` must all hold the
index it was written with. Our table is closed and deleted before rlox's is filled.

Usage (root)::

    python bench/bench_memmap.py --dir /var/tmp/rs-memmap --gigabytes 20 --limit 4G
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from importlib import metadata
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


def per_s(x: float) -> str:
    """A rate for the table: one decimal below 100 per second (cold disk reads are that slow)."""
    return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"


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


class RloxMmap:
    """rlox's ``MmapReplayBuffer`` holding ``n`` items of ``item`` bytes (see the module doc)."""

    def __init__(self, n: int, item: int, hot: int, path: Path) -> None:
        import rlox

        if item % 8:
            raise ValueError(f"rlox needs the item size in bytes divisible by 8, got {item}")
        self.dim = item // 8  # float32 per obs and per next_obs
        self.path = path
        self.rb = rlox.MmapReplayBuffer(min(hot, n), n, self.dim, 1, str(path))
        self.seed = 0

    def fill(self, n: int, chunk: int = 2048) -> float:
        """Push ``n`` items with ``push_batch``; seconds taken, including the first sample, which
        flushes rlox's writable mapping (as our ``fill`` includes ``storage.flush()``)."""
        t0 = time.perf_counter()
        for start in range(0, n, chunk):
            k = min(chunk, n - start)
            ids = np.arange(start, start + k)
            obs = np.empty((k, self.dim), np.float32)
            obs[:] = (ids % 251).astype(np.float32)[:, None]
            zeros = np.zeros(k, np.float32)
            self.rb.push_batch(obs.ravel(), obs.ravel(), zeros, ids.astype(np.float32), zeros, zeros)
        self.sample(1)
        return time.perf_counter() - t0

    def sample(self, batch: int) -> dict[str, np.ndarray]:
        self.seed += 1
        return self.rb.sample(batch, self.seed)

    def check(self, batches: int = 20) -> None:
        for _ in range(batches):
            s = self.sample(64)
            ids = s["rewards"].astype(np.int64)
            assert np.array_equal(ids.astype(np.float32), s["rewards"]), "reward is not an item index"
            want = (ids % 251).astype(np.float32)
            assert np.all(s["obs"][:, 0] == want), "obs does not match its reward"
            assert np.all(s["obs"][:, -1] == want)
            assert np.all(s["next_obs"][:, -1] == want), "next_obs does not match its reward"

    def rate(self, batch: int, seconds: float) -> float:
        n = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.sample(batch)
            n += 1
        return n / seconds


def run_rlox(args, n: int, item: int, d: Path) -> list[str]:
    """Fill, check and sample rlox's buffer (the limit already applies); its table rows."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / "rlox-cold.bin"
    buf = RloxMmap(n, item, args.rlox_hot, path)
    fill_s = buf.fill(n)
    size_gb = path.stat().st_size / 1e9
    print(f"rlox: filled {n:,} items ({args.rlox_hot:,} in RAM), {size_gb:.1f} GB on disk, in {fill_s:.0f} s "
          f"({size_gb / fill_s * 1e3:.0f} MB/s); RSS now {rss_gb():.2f} GB")
    buf.check()
    dropped = drop_caches()
    cold = {b: buf.rate(b, args.seconds) for b in (32, 256)}
    rss_cold = rss_gb()
    warm = {b: buf.rate(b, args.seconds) for b in (32, 256)}
    rss_warm = rss_gb()
    buf.check()
    print(f"rlox: sampling checked (RSS {rss_gb():.2f} GB; caches dropped: {dropped})")
    buf.rb.close()  # unmaps and deletes the cold file
    return [f"| rlox MmapReplayBuffer {size_gb:.1f} GB, cold (page cache dropped, limit {args.limit}) | "
            f"{per_s(cold[32])} | {per_s(cold[256])} | {rss_cold:.2f} |",
            f"| rlox MmapReplayBuffer {size_gb:.1f} GB, after the first pass | {per_s(warm[32])} | "
            f"{per_s(warm[256])} | {rss_warm:.2f} |"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp/replaystore-memmap-bench")
    ap.add_argument("--gigabytes", type=float, default=20.0)
    ap.add_argument("--ram-gigabytes", type=float, default=1.0)
    ap.add_argument("--item-kb", type=int, default=20)
    ap.add_argument("--limit", default="4G")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--keep", action="store_true", help="keep the files afterwards")
    ap.add_argument("--no-rlox", action="store_true", help="leave rlox's MmapReplayBuffer out")
    ap.add_argument("--rlox-hot", type=int, default=1024, help="items rlox keeps in RAM (its hot_capacity)")
    args = ap.parse_args()
    item = args.item_kb * 1024
    rlox_version, use_rlox = "not run", False
    if not args.no_rlox:
        try:
            import rlox  # noqa: F401

            rlox_version, use_rlox = metadata.version("rlox"), True
        except ImportError as e:
            rlox_version = f"not installed ({e})"
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"replaystore {rs.__version__}, numpy {np.__version__}, rlox {rlox_version}; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load {load}")

    # the in-RAM reference first, before the limit applies to this process
    n_ram = int(args.ram_gigabytes * 1e9 / item)
    ram = rs.Table(n_ram, seed=0)
    fill(ram, n_ram, item)
    ram_rates = {b: rate(ram, b, args.seconds) for b in (32, 256)}
    rss_ram = rss_gb()
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
    rss_cold = rss_gb()
    warm = {b: rate(table, b, args.seconds) for b in (32, 256)}  # the page cache now holds what fits
    rss_warm = rss_gb()
    check(table)
    print(f"sampling checked against the values written (RSS {rss_gb():.2f} GB; caches dropped: {dropped})")
    table.storage.close()
    del table
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)
    rlox_rows = run_rlox(args, n, item, d / "rlox") if use_rlox else []
    print()
    print("| table | sample 32 /s | sample 256 /s | RSS GB after |")
    print("|---|---:|---:|---:|")
    print(f"| in RAM ({args.ram_gigabytes:g} GB, before the limit) | {per_s(ram_rates[32])} | {per_s(ram_rates[256])} "
          f"| {rss_ram:.2f} |")
    cold_label = f"memmap {size_gb:.1f} GB, cold (page cache dropped, limit {args.limit})"
    print(f"| {cold_label} | {per_s(cold[32])} | {per_s(cold[256])} | {rss_cold:.2f} |")
    warm_label = f"memmap {size_gb:.1f} GB, after the first pass"
    print(f"| {warm_label} | {per_s(warm[32])} | {per_s(warm[256])} | {rss_warm:.2f} |")
    for row in rlox_rows:
        print(row)
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
