"""Fragment store write paths and disk space: pwrite (the default) vs writemap, against diskcache.

What the full-disk safety costs and what the space management gives back, in one process run:

- put and get throughput (MB/s) of 1 MB and 20 MB payloads into a fresh store and in the steady
  state (a full ring: every put also deletes the oldest payload, so LMDB reuses freed pages), for
  ``FragmentStore(writemap=False)`` (the default since full disks became errors),
  ``FragmentStore(writemap=True)`` (writes through the map after reserving their blocks), and
  diskcache's ``FanoutCache`` (MineStudio's store);
- disk use at the peak, after every payload was deleted, and after ``compact()`` of a store whose
  live data shrank to a tenth.

Run: ``python bench/bench_disk.py [--dir /path/on/the/disk/to/test] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid

import numpy as np

from replaystore.storage.diskspace import allocated_bytes
from replaystore.storage.fragments import FragmentStore


def du(path: str) -> int:
    return allocated_bytes(os.path.join(r, f) for r, _, files in os.walk(path) for f in files)


class Diskcache:
    """diskcache's FanoutCache with the store's put/get/delete interface."""

    def __init__(self, path: str, shards: int) -> None:
        from diskcache import FanoutCache

        self.cache = FanoutCache(path, shards=shards, eviction_policy="none")

    def put(self, value) -> str:
        key = uuid.uuid4().hex
        self.cache[key] = value
        return key

    def get(self, key: str):
        return self.cache[key]

    def delete(self, keys) -> None:
        for k in keys:
            del self.cache[k]

    def close(self) -> None:
        self.cache.close()


def open_store(kind: str, path: str, shards: int):
    if kind == "diskcache":
        return Diskcache(path, shards)
    return FragmentStore(path, shards, writemap=(kind == "lmdb-writemap"))


def throughput(kind: str, root: str, mb: int, count: int, ring: int, shards: int) -> dict:
    value = {"x": np.random.default_rng(0).integers(0, 255, mb << 20, dtype=np.uint8)}
    d = tempfile.mkdtemp(prefix=f"bench-{kind}-", dir=root)
    store = open_store(kind, d, shards)
    t0 = time.perf_counter()
    keys = [store.put(value) for _ in range(ring)]
    t_fresh = time.perf_counter() - t0
    t0 = time.perf_counter()
    for k in keys:
        store.get(k)
    t_get = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(count):  # steady state: one put and one delete per step
        keys.append(store.put(value))
        store.delete([keys.pop(0)])
    t_steady = time.perf_counter() - t0
    peak = du(d)
    store.delete(keys)
    after = du(d)
    store.close()
    shutil.rmtree(d, ignore_errors=True)
    return {"store": kind, "value_mb": mb, "fresh_put_mbs": ring * mb / t_fresh, "get_mbs": ring * mb / t_get,
            "steady_put_delete_mbs": count * mb / t_steady, "peak_mb": peak / 2**20,
            "after_delete_all_mb": after / 2**20, "live_mb": ring * mb}


def compaction(root: str, shards: int) -> dict:
    d = tempfile.mkdtemp(prefix="bench-compact-", dir=root)
    store = FragmentStore(d, shards)
    value = {"x": np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8)}
    keys = [store.put(value) for _ in range(200)]
    store.delete([k for i, k in enumerate(keys) if i % 10])  # keep every 10th
    before = store.disk_usage()
    t0 = time.perf_counter()
    store.compact()
    t = time.perf_counter() - t0
    after = store.disk_usage()
    live = store.live_bytes()
    store.close()
    shutil.rmtree(d, ignore_errors=True)
    return {"before_mb": before / 2**20, "after_mb": after / 2**20, "live_mb": live / 2**20, "seconds": t}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default=None, help="where the stores go (default: the system's temporary directory)")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    root = args.dir or tempfile.gettempdir()
    kinds = ["lmdb-pwrite", "lmdb-writemap"]
    try:
        import diskcache  # noqa: F401

        kinds.append("diskcache")
    except ImportError:
        print("diskcache not installed: peer skipped (pip install diskcache)")
    rows = []
    for mb, count, ring in ((1, 200, 50), (20, 30, 8)):
        for kind in kinds:
            rows.append(throughput(kind, root, mb, count, ring, args.shards))
    print(f"{'store':14s} {'MB':>4s} {'fresh put':>10s} {'get':>8s} {'steady':>8s} {'peak':>7s} {'live':>6s} "
          f"{'after delete':>13s}   (MB/s; MB)")
    for r in rows:
        print(f"{r['store']:14s} {r['value_mb']:4d} {r['fresh_put_mbs']:10.0f} {r['get_mbs']:8.0f} "
              f"{r['steady_put_delete_mbs']:8.0f} {r['peak_mb']:7.1f} {r['live_mb']:6d} "
              f"{r['after_delete_all_mb']:13.2f}")
    c = compaction(root, args.shards)
    print(f"compact(): {c['before_mb']:.1f} MB -> {c['after_mb']:.1f} MB (live {c['live_mb']:.1f} MB) "
          f"in {c['seconds']:.3f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "compaction": c}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
