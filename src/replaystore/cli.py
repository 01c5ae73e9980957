"""The ``replaystore`` command: ``demo``, ``tour``, ``inspect``, ``shm``, ``dashboard`` and ``bench``.

Each subcommand's help (``replaystore COMMAND --help``, :func:`build_parser`) says what it does;
docs/guide_demo.md describes demo, tour, inspect and bench, docs/metrics.md the dashboard, and
docs/shared.md ``shm``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .demo.command import add_parser as add_demo_parser
from .shared.command import add_parser as add_shm_parser


# -- tour -------------------------------------------------------------------------------------------
def _tour(args: argparse.Namespace) -> int:
    import replaystore as rs

    rng = np.random.default_rng(args.seed)
    table = rs.Table(
        capacity=args.capacity,
        sampler=rs.Prioritized(alpha=0.6, beta=0.4),
        remover=rs.Fifo(),
        rate_limiter=rs.MinSize(min(1_000, args.inserts)),
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
    print(
        f"{args.iterations} x (sample 256 with IS weights + update 256 priorities): "
        f"{args.iterations / dt:,.0f} iterations/s"
    )
    print(
        f"last batch: weights in [{s.weights.min():.3f}, {s.weights.max():.3f}], "
        f"probabilities in [{s.probabilities.min():.2e}, {s.probabilities.max():.2e}]"
    )

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


# -- inspect ----------------------------------------------------------------------------------------
def _inspect(args: argparse.Namespace) -> int:
    from .checkpoint import open_checkpoint
    from .errors import CheckpointError

    try:
        where, m = open_checkpoint(args.path)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plot = Path(args.plot) if args.plot else None
    if plot is not None and not plot.parent.is_dir():  # (none is made: a typo would)
        print(f"error: --plot {plot}: the folder {plot.parent} does not exist (create it first)", file=sys.stderr)
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
    if isinstance(m.get("episodes"), dict):
        ep, streams = m["episodes"].get("config", {}), m["episodes"].get("streams", {})
        print(f"  episodes: {ep}; {len(streams.get('ids', []))} streams, next episode id {streams.get('next_episode')}")
    print("  counters: " + ", ".join(f"{k}={v}" for k, v in t["counters"].items()))
    return 0 if plot is None else _inspect_plot(where, m, plot)


def _inspect_plot(path: Path, manifest: dict, out: Path) -> int:
    """Draw the checkpoint's priority and times-sampled histograms (files listed in the manifest)."""
    arrays = {}
    for name in ("priorities", "times_sampled"):
        fname = f"meta_{name}.npy"
        if fname not in manifest.get("files", {}):
            print(f"error: the manifest of {path} lists no {fname}", file=sys.stderr)
            return 2
        arrays[name] = np.load(path / fname, allow_pickle=False)
    try:
        from .demo.plot import plot_checkpoint
    except ImportError as e:  # pragma: no cover - matplotlib missing
        print(f"--plot needs matplotlib ({e}): pip install matplotlib", file=sys.stderr)
        return 2
    pr, ts = arrays["priorities"], arrays["times_sampled"]
    if len(pr):
        print(
            f"  priorities: min {pr.min():.4g}, mean {pr.mean():.4g}, max {pr.max():.4g}; "
            f"times sampled: mean {ts.mean():.2f}, max {ts.max()}"
        )
    plot_checkpoint(pr, ts, out, title=f"{path} (table {manifest['table']['name']!r}, {len(pr):,} items)")
    print(f"  figure: {out}")
    return 0


# -- bench ------------------------------------------------------------------------------------------
def bench_script() -> Path:
    """Where ``bench/run.py`` is in a source checkout (``src/replaystore/cli.py`` -> ``bench/run.py``)."""
    return Path(__file__).resolve().parents[2] / "bench" / "run.py"


def _bench(argv: list[str]) -> int:
    script = bench_script()
    if not script.is_file():
        print(
            f"replaystore bench: no benchmark harness at {script}. The benchmarks live in the "
            "source repository (bench/run.py), not in the installed package: clone the repository, "
            "`pip install -e .` there, and run `replaystore bench` (or `python bench/run.py`).",
            file=sys.stderr,
        )
        return 2
    return subprocess.call([sys.executable, str(script), *argv])


# -- parser -----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``replaystore`` command."""
    parser = argparse.ArgumentParser(
        prog="replaystore",
        description="replaystore: experience replay for reinforcement learning. "
        "Commands: demo (DQN + prioritized replay on CartPole), tour (the core on synthetic data), "
        "inspect (a checkpoint), bench (the benchmark harness of a source checkout), "
        "dashboard (live charts of a running buffer).",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"replaystore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_demo_parser(sub)  # replaystore demo (replaystore.demo.command)

    tour = sub.add_parser(
        "tour",
        help="walk through the core on synthetic data (no extra needed)",
        description="Fill a prioritized table with synthetic transitions, sample with "
        "importance weights, update priorities, checkpoint, reload, and print the stats.",
    )
    tour.add_argument("--capacity", type=int, default=1_000_000, help="table capacity (default 1M)")
    tour.add_argument("--inserts", type=int, default=200_000, help="transitions to insert (default 200k)")
    tour.add_argument("--iterations", type=int, default=2_000, help="sample+update iterations (default 2000)")
    tour.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    tour.add_argument("--checkpoint", help="directory to keep the tour's checkpoint in (default: temporary)")
    tour.set_defaults(func=_tour)

    insp = sub.add_parser(
        "inspect",
        help="summarise a checkpoint directory",
        description="Print a checkpoint's items, fields (shapes, dtypes), sampler, remover, "
        "rate limiter and counters; with --plot, also draw its priorities and "
        "times-sampled counts.",
    )
    insp.add_argument("path", help="checkpoint directory written by Table.save")
    insp.add_argument(
        "--plot",
        metavar="OUT.png",
        help="write a figure of the priority distribution and times-sampled histogram (needs matplotlib)",
    )
    insp.set_defaults(func=_inspect)

    add_shm_parser(sub)  # replaystore shm list|rm (replaystore.shared.command)
    from .metrics.command import add_parser as add_dashboard_parser

    add_dashboard_parser(sub)  # replaystore dashboard (replaystore.metrics.command)
    sub.add_parser(
        "bench",
        add_help=False,
        help="run the benchmark harness bench/run.py of a source checkout; arguments are passed "
        "through ([WORKLOAD ...] [--repeats N] [--quick]; `replaystore bench --help` for all)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``replaystore`` command."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "bench":
        return _bench(argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
