"""MineStudio's online replay buffer vs replaystore's re-creation, on the same workload, side by side.

Runs in ``bench/.venv-minestudio`` (the original's modules need ray, diskcache, omegaconf, torchmetrics
and torch; its wandb logger is replaced by a no-op in every Ray worker)::

    python3 -m venv bench/.venv-minestudio
    bench/.venv-minestudio/bin/pip install torch==2.13.0          # the local CPU wheel, first
    bench/.venv-minestudio/bin/pip install ray lmdb diskcache omegaconf torchmetrics
    bench/.venv-minestudio/bin/pip install --no-deps minestudio
    bench/.venv-minestudio/bin/pip install --no-deps -e .
    nice bench/.venv-minestudio/bin/python bench/bench_minestudio.py --micro    # ~4 min

Workload (MineStudio's data path): ``--producers`` Ray actors, each with ``--envs`` environment
streams, write fragments of ``--steps`` steps of 128x128x3 uint8 images plus a VPT-like recurrent
state (``--state-mb``) through ``ReplayBufferInterface.add_fragment`` (store write + one actor call
per fragment, as the original's sender thread). Then a trainer ``fetch_fragments`` and reads the
records through ``data_iter`` over ``create_loader_pool(--readers, 0.1)``, ``--fetches`` times.
Fragments are built before the clock starts. Both systems run in the same Ray instance, one after
the other, in alternating order over ``--repeats`` rounds after ``--warmup`` untimed rounds of the
same workload (the first full-size round was ~2x slower here, whichever system ran it); the table
shows medians. Sizes are in MiB (2**20 bytes), rates in MiB/s.

"in" stops when the last producer's ``add_fragment`` returns: the payloads are in the page cache (neither
store syncs). "synced" also counts an ``os.sync()`` right after, i.e. the rate at which the payloads
reach the disk (system-wide: other processes' dirty pages count too).

The disk (``--dd``, on by default): before the first and after the last round, ``dd`` writes
``--dd-mb`` MiB of zeros to a file in the stores' directory with ``conv=fdatasync`` (the device's
sequential write bandwidth), reads it back with ``iflag=direct`` (the device's read bandwidth; skipped
where O_DIRECT is refused), then writes it again without a sync (the page cache's bandwidth); the
file is removed. "in/dd" is a system's "in" MiB/s over the mean fdatasync figure.

The performance issue's workload (21 MB fragments: 256 steps plus an 8 MiB state; ~3.5 min; 4 GiB
for dd, as 1 GiB gave 300 to 2000 MiB/s with fdatasync on the benchmark VM)::

    nice -n 5 bench/.venv-minestudio/bin/python bench/bench_minestudio.py --steps 256 --state-mb 8 \
        --per-env 16 --fetch 32 --repeats 3 --dd-mb 4096

Also (``--micro``): the raw stores, replaystore's ``FragmentStore`` (LMDB) against diskcache's
``FanoutCache`` (the original's store), writing and reading 1 MB and 30 MB values.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SESSION = "bench-session"


def quiet_wandb() -> None:
    """Ray worker setup hook: MineStudio's wandb logger becomes a no-op (no training session here)."""
    try:
        import minestudio.online.utils.train.wandb_logger as wl

        wl.log = lambda *a, **k: None
        wl.define_metric = lambda *a, **k: None
    except ImportError:
        pass


def system_modules(system: str):
    """``(interface_cls, metadata_cls, fragment_cls, create_loader_pool, data_iter)`` of a system."""
    if system == "minestudio":
        from minestudio.online.rollout.replay_buffer import ReplayBufferInterface
        from minestudio.online.utils.rollout.datatypes import FragmentMetadata, SampleFragment
        from minestudio.online.utils.train.data import create_loader_pool, data_iter
    else:
        from replaystore.compat.minestudio import (
            FragmentMetadata,
            ReplayBufferInterface,
            SampleFragment,
            create_loader_pool,
            data_iter,
        )
    return ReplayBufferInterface, FragmentMetadata, SampleFragment, create_loader_pool, data_iter


def make_fragment(cls, worker: str, fid: int, steps: int, state_mb: float, rng):
    """A fragment of MineStudio's layout (obs image, actions, flags, recurrent state, next obs)."""
    width = max(1, int(state_mb * 2**20 / 4 / 2 / 128 / 4))  # 4 blocks x (K, V) float32 (1, 128, width)
    state = []
    for _ in range(4):
        state += [np.zeros((1, 1, 128), bool), rng.standard_normal((1, 128, width), np.float32),
                  rng.standard_normal((1, 128, width), np.float32)]
    first = np.zeros(steps, bool)
    first[0] = True
    return cls(
        obs={"image": rng.integers(0, 255, (steps, 128, 128, 3), dtype=np.uint8)},
        action={"buttons": rng.integers(0, 8000, (steps, 1)), "camera": rng.integers(0, 121, (steps, 1))},
        next_done=np.zeros(steps, bool),
        reward=rng.standard_normal(steps).astype(np.float32),
        first=first,
        in_state=state,
        worker_uuid=worker,
        fid_in_worker=fid,
        next_obs={"image": rng.integers(0, 255, (128, 128, 3), dtype=np.uint8)},
        episode_uuids=[str(uuid.uuid4()) for _ in range(steps)],
    )


_DD_RATE = re.compile(r"^(\d+) bytes .* copied, ([0-9.e+-]+) s", re.M)


def run_dd(*operands: str) -> float:
    """Run ``dd`` with ``operands``; its rate in MiB/s (``RuntimeError`` if it fails)."""
    out = subprocess.run(["dd", *operands], capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    m = _DD_RATE.search(out.stderr)
    if out.returncode or m is None:
        raise RuntimeError(f"dd {' '.join(operands)} failed: {out.stderr.strip()}")
    return int(m[1]) / 2**20 / float(m[2])


def disk_bandwidth(directory: str, mb: int) -> dict[str, float | None]:
    """The disk under ``directory`` by ``dd`` with ``mb`` MiB, in MiB/s (see the module doc).

    Keys: ``write`` (``conv=fdatasync``), ``read`` (``iflag=direct``; ``None`` if refused) and
    ``write_cached`` (no sync).
    """
    path = os.path.join(directory, f"ddtest-{uuid.uuid4().hex[:8]}")
    res: dict[str, float | None] = {}
    try:
        res["write"] = run_dd("if=/dev/zero", f"of={path}", "bs=1M", f"count={mb}", "conv=fdatasync")
        try:
            res["read"] = run_dd(f"if={path}", "of=/dev/null", "bs=1M", "iflag=direct")
        except RuntimeError:
            res["read"] = None
        os.remove(path)
        res["write_cached"] = run_dd("if=/dev/zero", f"of={path}", "bs=1M", f"count={mb}")
    finally:
        if os.path.exists(path):
            os.remove(path)  # its dirty pages are dropped, not written back
    return res


def fragment_bytes(f) -> int:
    """Bytes of array data in a fragment."""
    n = f.obs["image"].nbytes + f.next_obs["image"].nbytes + sum(a.nbytes for a in f.in_state)
    return n + f.reward.nbytes + f.first.nbytes + f.next_done.nbytes + sum(v.nbytes for v in f.action.values())


class Producer:
    """A rollout worker stand-in: builds its fragments first, then sends them one by one."""

    def __init__(self, system: str, envs: int, per_env: int, steps: int, state_mb: float, seed: int):
        iface, meta_cls, frag_cls, _, _ = system_modules(system)
        self.buffer = iface()
        rng = np.random.default_rng(seed)
        workers = [str(uuid.uuid4()) for _ in range(envs)]
        self.items = []
        for fid in range(per_env):
            for w in workers:
                self.items.append((make_fragment(frag_cls, w, fid, steps, state_mb, rng),
                                   meta_cls(model_version=0, session_id=SESSION, worker_uuid=w, fid_in_worker=fid)))
        self.nbytes = fragment_bytes(self.items[0][0])

    def ready(self) -> int:
        return self.nbytes

    def run(self) -> float:
        t0 = time.perf_counter()
        for frag, meta in self.items:
            self.buffer.add_fragment(frag, meta)
        return time.perf_counter() - t0


def run_system(ray, system: str, args, path: str) -> dict:
    local = system == "replaystore-local"  # the trainer reads the store itself (no loader actors)
    iface_cls, _, _, create_loader_pool, data_iter = system_modules("replaystore" if local else system)
    shutil.rmtree(path, ignore_errors=True)
    n_in = args.producers * args.envs * args.per_env
    cfg = {"max_chunks": n_in + 10, "max_staleness": 2, "max_reuse": 1000, "fragments_per_chunk": 1,
           "fragments_per_report": 40, "database_config": {"path": path, "num_shards": args.shards}}
    buf = iface_cls(cfg)
    buf.update_model_version(SESSION, 0)
    producers = [ray.remote(num_cpus=0)(Producer).remote(system, args.envs, args.per_env, args.steps,
                                                        args.state_mb, seed=i) for i in range(args.producers)]
    nbytes = ray.get([p.ready.remote() for p in producers], timeout=600)[0]
    t0 = time.perf_counter()
    ray.get([p.run.remote() for p in producers], timeout=1800)
    t_in = time.perf_counter() - t0
    os.sync()  # the payloads reach the disk (this also keeps write-back out of what follows)
    t_synced = time.perf_counter() - t0

    pool = create_loader_pool(args.readers, 0.1, local=True) if local else create_loader_pool(args.readers, 0.1)
    # warm every loader up (actor start-up is not what we measure)
    records = buf.fetch_fragments(max(args.batch_size, 2 * args.readers))
    for _ in data_iter(pool, records, args.batch_size, args.prefetch):
        pass
    t_out, n_out = 0.0, 0
    for _ in range(args.fetches):
        records = buf.fetch_fragments(args.fetch)
        t0 = time.perf_counter()
        for batch in data_iter(pool, records, args.batch_size, args.prefetch):
            n_out += len(batch["fragment"])
            del batch
        t_out += time.perf_counter() - t0
    if local:
        pool.close()
    else:
        for a in list(pool._idle_actors):
            ray.kill(a)
    for p in producers:
        ray.kill(p)
    ray.kill(buf.actor)
    time.sleep(1.0)
    shutil.rmtree(path, ignore_errors=True)
    mb = nbytes / 2**20
    return {"system": system, "fragment_mb": mb, "in_fps": n_in / t_in, "in_mbs": n_in * mb / t_in,
            "synced_fps": n_in / t_synced, "synced_mbs": n_in * mb / t_synced,
            "out_fps": n_out / t_out, "out_mbs": n_out * mb / t_out, "n_in": n_in, "n_out": n_out}


def micro(sizes_mb=(1, 30), n=(40, 8), shards=8) -> list[dict]:
    """Raw store put/get: replaystore FragmentStore (LMDB) vs diskcache FanoutCache."""
    from diskcache import FanoutCache

    from replaystore.storage.fragments import FragmentStore

    rows = []
    for size, count in zip(sizes_mb, n):
        value = {"x": np.random.default_rng(0).integers(0, 255, size * 2**20, dtype=np.uint8)}
        for name in ("lmdb", "diskcache"):
            d = tempfile.mkdtemp(prefix=f"bench-{name}-")
            if name == "lmdb":
                store = FragmentStore(d, shards)
                put, get = store.put, store.get
            else:
                store = FanoutCache(d, shards=shards, eviction_policy="none")

                def put(v, store=store):
                    k = str(uuid.uuid4())
                    store[k] = v
                    return k

                get = store.__getitem__
            t0 = time.perf_counter()
            keys = [put(value) for _ in range(count)]
            t_put = time.perf_counter() - t0
            t0 = time.perf_counter()
            for k in keys:
                get(k)
            t_get = time.perf_counter() - t0
            store.close()
            shutil.rmtree(d, ignore_errors=True)
            rows.append({"store": name, "value_mb": size, "put_mbs": count * size / t_put,
                         "get_mbs": count * size / t_get})
    return rows


def print_disk(root: str, mb: int, disk: dict[str, dict]) -> None:
    """The dd lines of the report."""
    def fmt(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.0f}"

    print(f"dd in {root} ({mb} MiB, MiB/s): " + "; ".join(
        f"{when}: write {fmt(d['write'])} (fdatasync), read {fmt(d['read'])} (O_DIRECT), "
        f"write {fmt(d['write_cached'])} (no sync)" for when, d in disk.items()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--systems", default="replaystore,minestudio",
                   help="comma-separated: replaystore, replaystore-local (data_iter over "
                        "create_loader_pool(local=True): threads reading the store), minestudio")
    p.add_argument("--producers", type=int, default=2)
    p.add_argument("--envs", type=int, default=2)
    p.add_argument("--per-env", type=int, default=8, help="fragments per environment stream")
    p.add_argument("--steps", type=int, default=64, help="steps per fragment (MineStudio's default: 256)")
    p.add_argument("--state-mb", type=float, default=2.0, help="recurrent state size (VPT 2x: ~8 MB)")
    p.add_argument("--fetch", type=int, default=16, help="fragments per fetch_fragments")
    p.add_argument("--fetches", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--readers", type=int, default=4)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed full-size rounds first (worker start-up, first touch of memory, file growth)")
    p.add_argument("--dir", default=None, help="where the stores go (default: a temporary directory)")
    p.add_argument("--dd", action=argparse.BooleanOptionalAction, default=True,
                   help="measure the disk with dd before and after the rounds, in the stores' directory")
    p.add_argument("--dd-mb", type=int, default=1024, help="MiB dd writes and reads")
    p.add_argument("--micro", action="store_true", help="also time the raw stores")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import ray

    root = args.dir or tempfile.mkdtemp(prefix="bench-minestudio-")
    env = {"PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    ray.init(address="local", num_cpus=2, resources={"database": 1}, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env, "worker_process_setup_hook": "bench_minestudio.quiet_wandb"})
    quiet_wandb()
    systems = args.systems.split(",")
    results: dict[str, list[dict]] = {s: [] for s in systems}
    disk: dict[str, dict] = {}
    try:
        if args.dd:
            disk["before"] = disk_bandwidth(root, args.dd_mb)
            print_disk(root, args.dd_mb, disk)
        # Warm-up rounds run the whole workload: on the benchmark VM the first full-size round was ~2x
        # slower whichever system ran it (first touch of memory, most likely); a small warm-up did not help.
        rounds = [(f"warmup {w}", False) for w in range(args.warmup)]
        rounds += [(f"round {r}", True) for r in range(args.repeats)]
        for i, (label, timed) in enumerate(rounds):
            for s in systems if i % 2 == 0 else systems[::-1]:
                res = run_system(ray, s, args, os.path.join(root, s))
                if timed:
                    results[s].append(res)
                print(f"{label} {s}: in {res['in_fps']:.1f} frag/s ({res['in_mbs']:.0f} MiB/s), "
                      f"synced {res['synced_fps']:.1f} frag/s ({res['synced_mbs']:.0f} MiB/s), "
                      f"out {res['out_fps']:.1f} frag/s ({res['out_mbs']:.0f} MiB/s)", flush=True)
    finally:
        ray.shutdown()
        if args.dd and len(results[systems[-1]]) == args.repeats:  # the rounds completed
            disk["after"] = disk_bandwidth(root, args.dd_mb)
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)

    mb = next(iter(results.values()))[0]["fragment_mb"]
    dd_write = statistics.mean(d["write"] for d in disk.values()) if disk else None
    print(f"\nfragment: {args.steps} steps x 128x128x3 uint8 + {args.state_mb:g} MiB state = {mb:.2f} MiB "
          f"({mb * 2**20 / 1e6:.1f} MB); {args.producers} producers x {args.envs} envs x {args.per_env}; "
          f"fetch {args.fetch} x {args.fetches}, batch {args.batch_size}, prefetch {args.prefetch}, "
          f"{args.readers} readers; median of {args.repeats}")
    cols = ("in frag/s", "in MiB/s", "in/dd", "synced frag/s", "synced MiB/s", "out frag/s", "out MiB/s")
    print(f"{'system':<17} " + " ".join(f"{c:>{max(len(c), 8)}}" for c in cols))
    summary = {}
    keys = ("in_fps", "in_mbs", "synced_fps", "synced_mbs", "out_fps", "out_mbs")
    for s, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in keys}
        med["in_over_dd"] = med["in_mbs"] / dd_write if dd_write else None
        summary[s] = med
        over = "n/a" if dd_write is None else f"{med['in_over_dd']:.2f}"
        print(f"{s:<17} {med['in_fps']:>9.1f} {med['in_mbs']:>8.0f} {over:>8} {med['synced_fps']:>13.1f} "
              f"{med['synced_mbs']:>12.0f} {med['out_fps']:>10.1f} {med['out_mbs']:>9.0f}")
    for ours in ("replaystore", "replaystore-local"):
        if ours in summary and "minestudio" in summary:
            a, b = summary[ours], summary["minestudio"]
            ratio = {k: f"{a[k] / b[k]:.2f}x" for k in ("in_fps", "synced_fps", "out_fps")}
            label = "ratio" if ours == "replaystore" else "ratio local"
            print(f"{label:<17} {ratio['in_fps']:>9} {'':>8} {'':>8} {ratio['synced_fps']:>13} {'':>12} "
                  f"{ratio['out_fps']:>10}")
    if disk:
        print_disk(root, args.dd_mb, disk)
        print(f"in/dd: in MiB/s over the mean dd fdatasync write ({dd_write:.0f} MiB/s)")
    micro_rows = []
    if args.micro:
        micro_rows = micro(shards=args.shards)
        print(f"\n{'store':<10} {'value':>6} {'put MB/s':>9} {'get MB/s':>9}")
        for r in micro_rows:
            print(f"{r['store']:<10} {r['value_mb']:>4} MB {r['put_mbs']:>9.0f} {r['get_mbs']:>9.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "summary": summary, "disk": disk,
                       "micro": micro_rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
