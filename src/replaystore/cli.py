"""The ``replaystore`` command: ``demo`` and ``inspect``.

``replaystore demo`` walks through the core on synthetic data: fill a prioritized table, sample
with importance weights, update priorities, checkpoint, reload, and print the stats.
``replaystore inspect PATH`` summarises a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _demo(args: argparse.Namespace) -> int:
    import replaystore as rs

    rng = np.random.default_rng(args.seed)
    table = rs.Table(
        capacity=args.capacity,
        sampler=rs.Prioritized(alpha=0.6, beta=0.4),
        remover=rs.Fifo(),
        rate_limiter=rs.MinSize(1_000),
        seed=args.seed,
    )
    print(f"replaystore {rs.__version__}: {table!r}")
    n = args.inserts
    batch = {
        "obs": rng.standard_normal((n, 17)).astype(np.float32),
        "action": rng.standard_normal((n, 6)).astype(np.float32),
        "reward": rng.standard_normal(n).astype(np.float32),
        "next_obs": rng.standard_normal((n, 17)).astype(np.float32),
        "done": rng.random(n) < 0.01,
    }
    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        table.extend({k: v[start : start + 1000] for k, v in batch.items()}, version=start // 10_000)
    t_insert = time.perf_counter() - t0
    print(f"inserted {n:,} transitions in batches of 1000: {n / t_insert / 1e6:.2f} M/s")

    t0 = time.perf_counter()
    for _ in range(args.iterations):
        s = table.sample(256, timeout=5.0)
        td_error = np.abs(s.data["reward"] - 0.1 * s.data["obs"].sum(axis=1)) + 1e-3
        table.update_priorities(s.keys, td_error)
    dt = time.perf_counter() - t0
    print(f"{args.iterations} x (sample 256 with IS weights + update 256 priorities): "
          f"{args.iterations / dt:,.0f} iterations/s")
    print(f"last batch: weights in [{s.weights.min():.3f}, {s.weights.max():.3f}], "
          f"probabilities in [{s.probabilities.min():.2e}, {s.probabilities.max():.2e}]")

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(args.checkpoint or tmp) / "demo-checkpoint"
        t0 = time.perf_counter()
        table.save(ckpt)
        restored = rs.Table.load(ckpt)
        dt = time.perf_counter() - t0
        same = np.array_equal(restored.keys(), table.keys())
        print(f"saved and reloaded {len(restored):,} items in {dt:.2f}s; keys identical: {same}")
    print("stats:")
    print(json.dumps(table.stats(), indent=1))
    return 0 if same else 1


def _inspect(args: argparse.Namespace) -> int:
    from .checkpoint import read_manifest
    from .errors import CheckpointError

    try:
        m = read_manifest(args.path)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t = m["table"]
    print(f"checkpoint {args.path}: table {t['name']!r}, {m['size']:,} / {t['capacity']:,} items")
    print(f"  storage: {m['storage']['kind']}")
    for path, f in (m["storage"].get("spec") or {}).items():
        print(f"    {path:<24} shape {tuple(f['shape'])!s:<16} dtype {np.dtype(f['dtype'])}")
    print(f"  sampler: {m['sampler']['config']}")
    print(f"  remover: {m['remover']['config']}")
    print(f"  rate limiter: {m['rate_limiter']['config']} counters {m['rate_limiter']['state']}")
    print(f"  model version: {t['model_version']}, next key: {t['next_key']}")
    print("  counters: " + ", ".join(f"{k}={v}" for k, v in t["counters"].items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``replaystore`` command."""
    parser = argparse.ArgumentParser(prog="replaystore", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="walk through the core on synthetic data")
    demo.add_argument("--capacity", type=int, default=1_000_000, help="table capacity (default 1M)")
    demo.add_argument("--inserts", type=int, default=200_000, help="transitions to insert (default 200k)")
    demo.add_argument("--iterations", type=int, default=2_000, help="sample+update iterations (default 2000)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--checkpoint", help="directory to keep the demo checkpoint in (default: temporary)")
    demo.set_defaults(func=_demo)
    insp = sub.add_parser("inspect", help="summarise a checkpoint directory")
    insp.add_argument("path", help="checkpoint directory written by Table.save")
    insp.set_defaults(func=_inspect)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
