"""The cost of durable served Tables: insert rate of the Ray service without a log and with a
write-ahead log (``fsync="always"``: one fsync per group commit; ``"interval"``; ``"never"``).

Workload: ``--writers`` writer actors (1, 2, 4) each call ``client.extend`` with batches of
``--batches`` items (1, 8, 64, 256) of ~1 KB (obs f32[17], action f32[6], reward, next_obs
f32[17], done, padding), one call at a time (``--inflight 1``, a blocking writer) or with several
``extend_async`` calls in flight. One served table: capacity 1M, ``Uniform``, FIFO eviction. Each
cell runs ``--seconds`` after a warm-up; the table is fresh for every mode. The log goes to
``--dir`` (default: a temporary directory; it must be a real disk for fsync to mean anything, not
a tmpfs). Prints items/s, the ratio to the non-durable rate in the same run, and records per
group commit (how many calls shared one write + fsync).

Usage::

    nice -n 5 python bench/bench_wal.py [--writers 1,2,4] [--batches 1,8,64,256] [--seconds 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import tempfile
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402

import replaystore as rs  # noqa: E402
from replaystore import ray as rsr  # noqa: E402

ITEM_BYTES = 1024
FIELDS_BYTES = 4 * (17 + 6 + 1 + 17 + 1)


def make_batch(n: int, rng: np.random.Generator) -> dict:
    return {
        "obs": rng.random((n, 17), dtype=np.float32),
        "action": rng.random((n, 6), dtype=np.float32),
        "reward": rng.random(n, dtype=np.float32),
        "next_obs": rng.random((n, 17), dtype=np.float32),
        "done": np.zeros(n, np.float32),
        "pad": np.zeros((n, ITEM_BYTES - FIELDS_BYTES), np.uint8),
    }


def measure(ray, name: str, writers: int, batch: int, seconds: float, inflight: int) -> float:
    """Items per second inserted by ``writers`` actors together."""

    @ray.remote(num_cpus=0)
    class Writer:
        def __init__(self, seed: int) -> None:
            self.c = rsr.connect(name, table="t", rpc_grace=120)
            self.batch = make_batch(batch, np.random.default_rng(seed))

        def run(self, start_at: float, seconds: float) -> int:
            while time.time() < start_at:
                time.sleep(0.001)
            end = start_at + seconds
            n = 0
            if inflight <= 1:
                while time.time() < end:
                    self.c.extend(self.batch, timeout=60)
                    n += batch
                return n
            refs = []
            while time.time() < end:
                refs.append(self.c.extend_async(self.batch, timeout=60))
                if len(refs) >= inflight:
                    ray.get(refs.pop(0))
                    n += batch
            ray.get(refs)
            return n + batch * len(refs)

    actors = [Writer.remote(i) for i in range(writers)]
    ray.get([a.run.remote(time.time() + 0.5, 0.5) for a in actors])  # warm-up
    start = time.time() + 0.5
    counts = ray.get([a.run.remote(start, seconds) for a in actors])
    elapsed = max(seconds, time.time() - start)
    for a in actors:
        ray.kill(a)
    return sum(counts) / elapsed


def fsync_us(root: str) -> float:
    """Median latency of write(64 KiB) + fsync in ``root``: the floor of a durable call."""
    path = os.path.join(root, "fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    times = []
    try:
        for _ in range(50):
            t = time.perf_counter()
            os.write(fd, b"x" * 65536)
            os.fsync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    return float(np.median(times) * 1e6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writers", default="1,2,4")
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--modes", default="none,always,interval",
                    help="none (no log), always, interval, never (fsync policies)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--inflight", type=int, default=1, help="extend calls in flight per writer (1: blocking)")
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between fsyncs with 'interval'")
    ap.add_argument("--dir", default=None, help="where the logs go (default: a temporary directory)")
    args = ap.parse_args()
    writers = [int(x) for x in args.writers.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    modes = args.modes.split(",")
    ray = rsr.init_local(num_cpus=2, include_dashboard=False, log_to_driver=False)
    root = tempfile.mkdtemp(prefix="bench-wal-", dir=args.dir)
    print(f"replaystore bench_wal: ray {ray.__version__}, numpy {np.__version__}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}, log dir {root}, {args.seconds}s per cell, "
          f"inflight {args.inflight}")
    print(f"fsync of a 64 KiB append in the log directory: {fsync_us(root):.0f} us (median of 50)")
    results: dict[tuple, float] = {}
    stats: dict[tuple, dict] = {}
    try:
        for mode in modes:
            for w in writers:
                for b in batches:
                    name = f"bench-wal-{mode}-{w}-{b}-{os.getpid()}"
                    wal = None if mode == "none" else rsr.WalConfig(
                        dir=os.path.join(root, name), fsync=mode, interval=args.interval, max_log_bytes=None)
                    client = rsr.serve({"t": functools.partial(rs.Table, 1_000_000, seed=0)}, name=name, wal=wal)
                    try:
                        rate = measure(ray, name, w, b, args.seconds, args.inflight)
                        st = client.stats()["t"]
                        stats[mode, w, b] = st.get("wal", {})
                    finally:
                        client.shutdown()
                        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                    results[mode, w, b] = rate
                    base = results.get(("none", w, b))
                    ratio = f"{rate / base:5.2f}x" if base else "   - "
                    ws = stats[mode, w, b]
                    per_group = ws["records"] / ws["groups"] if ws.get("groups") else float("nan")
                    print(f"{mode:>8}  writers {w}  batch {b:4d}: {rate:10.0f} items/s  {ratio}  "
                          f"records/group {per_group:5.2f}", flush=True)
        print(f"fsync probe at the end: {fsync_us(root):.0f} us; load average {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\n| writers | batch | " + " | ".join(f"{m} items/s" for m in modes) + " | "
          + " | ".join(f"{m}/none" for m in modes if m != "none") + " |")
    print("|" + "---|" * (2 + len(modes) + len([m for m in modes if m != "none"])))
    for w in writers:
        for b in batches:
            cells = [f"{results[m, w, b]:,.0f}" for m in modes]
            base = results.get(("none", w, b))
            ratios = [f"{results[m, w, b] / base:.2f}" if base else "-" for m in modes if m != "none"]
            print(f"| {w} | {b} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
