"""The ``replaystore`` command: ``demo``, ``tour``, ``inspect`` and ``bench``.

``replaystore demo`` trains DQN with prioritized replay on CartPole-v1 from a replaystore Table,
shows a progress bar, prints the greedy evaluation and writes a figure (needs the ``[demo]`` extra).
``replaystore tour`` walks through the core on synthetic data: fill a prioritized table, sample
with importance weights, update priorities, checkpoint, reload, and print the stats.
``replaystore inspect PATH`` summarises a checkpoint (``--plot`` draws its priorities and
times-sampled counts). ``replaystore bench`` runs the benchmark harness of a source checkout.
``replaystore dashboard`` serves live charts of a running buffer (``replaystore.metrics.command``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .demo.config import DemoConfig
from .shared.command import add_parser as add_shm_parser

_DEMO_EXTRA = "pip install 'replaystore[demo]'  (torch==2.13.0, gymnasium, tqdm, matplotlib)"


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


# -- demo -------------------------------------------------------------------------------------------
def missing_demo_dependencies() -> list[str]:
    """The packages of the ``[demo]`` extra that cannot be imported."""
    return [name for name in ("torch", "gymnasium", "tqdm", "matplotlib") if importlib.util.find_spec(name) is None]


def _demo(args: argparse.Namespace) -> int:
    if args.distributed and args.n_step > 1:
        print("replaystore demo: --n-step applies only without --distributed", file=sys.stderr)
        return 2
    if args.distributed:
        return _demo_distributed(args)
    given = [f"--{k.replace('_', '-')}" for k in _DISTRIBUTED_OPTIONS if getattr(args, k) is not None]
    if given:
        print(f"replaystore demo: {', '.join(given)} only apply with --distributed", file=sys.stderr)
        return 2
    missing = missing_demo_dependencies()
    if missing:
        print(f"replaystore demo needs {', '.join(missing)}: {_DEMO_EXTRA}", file=sys.stderr)
        return 2
    from .demo.plot import plot_result
    from .demo.train import train

    config = DemoConfig(
        seed=args.seed,
        total_steps=args.steps,
        device=args.device,
        threads=args.threads,
        eval_episodes=args.eval_episodes,
        n_step=args.n_step,
    )
    nstep = f", {config.n_step}-step returns (Table.sample_nstep)" if config.n_step > 1 else ""
    print(
        f"replaystore demo: DQN with prioritized replay (alpha {config.alpha}, beta {config.beta_start} -> "
        f"{config.beta_end}){nstep} on {config.env_id}, seed {config.seed}, at most {config.total_steps:,} steps, "
        f"device {config.device}",
        flush=True,
    )
    result = train(config, progress=not args.no_progress)
    out = Path(args.out or config.figure_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_result(result, out)
    st = result.stats
    rets = result.final_returns
    bar = config.pass_return  # the figure draws the same bar
    solved = f"solved (>= {bar:.0f})" if result.final_return >= bar else f"not solved (below {bar:.0f})"
    stop = f"solved at step {result.solved_at:,}" if result.solved_at else "step budget used up"
    print(
        f"trained {result.steps:,} env steps ({stop}), {result.updates:,} gradient steps, "
        f"{result.wall_time:.1f} s wall, {result.cpu_time:.1f} s CPU"
    )
    print(
        f"buffer: {st['size']:,} items, {st['inserts']:,} inserts, {st['samples']:,} sampled, "
        f"sample/insert ratio {st['sample_to_insert_ratio']:.1f}, priorities in "
        f"[{st['priority_min']:.3g}, {st['priority_max']:.3g}] (mean {st['priority_mean']:.3g})"
    )
    print(
        f"final average return over {len(rets)} greedy evaluation episodes: {result.final_return:.1f} "
        f"(min {rets.min():.0f}, max {rets.max():.0f}): {solved}"
    )
    print(f"figure: {out}")
    return 0


_DISTRIBUTED_OPTIONS = ("actors", "sync_every", "write_batch", "batches_per_call")


def _demo_distributed(args: argparse.Namespace) -> int:
    missing = missing_demo_dependencies() + [n for n in ("ray",) if importlib.util.find_spec(n) is None]
    if missing:
        print(
            f"replaystore demo --distributed needs {', '.join(missing)}: pip install 'replaystore[demo,ray]'",
            file=sys.stderr,
        )
        return 2
    from .demo.distributed import DistributedConfig, train_distributed
    from .demo.plot import plot_result

    config = DemoConfig(
        seed=args.seed,
        total_steps=args.steps,
        device=args.device,
        threads=args.threads,
        eval_episodes=args.eval_episodes,
    )
    given = {k: getattr(args, k) for k in _DISTRIBUTED_OPTIONS if getattr(args, k) is not None}
    dist = DistributedConfig(**given)
    try:
        dist.check(config)
    except ValueError as e:
        print(f"replaystore demo --distributed: {e}", file=sys.stderr)
        return 2
    spi = dist.spi(config)
    print(
        f"replaystore demo --distributed: DQN with prioritized replay (alpha {config.alpha}, beta "
        f"{config.beta_start} -> {config.beta_end}) on {config.env_id}, seed {config.seed}, at most "
        f"{config.total_steps:,} steps; {dist.actors} rollout actors "
        f"(seeds {config.seed}..{config.seed + dist.actors - 1}, "
        f"weights pulled every {dist.sync_every} steps, {dist.write_batch} transitions per extend) and the "
        f"learner (device {config.device}, {dist.batches_per_call} batches of {config.batch_size} per sample "
        f"call) on a local Ray instance; rate limiter: {spi:g} sampled items per insert",
        flush=True,
    )
    try:
        result = train_distributed(config, dist, progress=not args.no_progress)
    except KeyboardInterrupt:
        print("\nreplaystore demo --distributed: interrupted; actors, service and Ray shut down", file=sys.stderr)
        return 130
    out = Path(args.out or "replaystore-demo-distributed.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_result(result, out)
    st = result.stats
    rets = result.final_returns
    solved = "solved" if result.final_return >= 450 else "not solved (below 450)"
    stop = f"solved at step {result.solved_at:,}" if result.solved_at else "step budget used up"
    print(
        f"trained {result.steps:,} env steps ({stop}), {result.updates:,} gradient steps, "
        f"{result.wall_time:.1f} s wall, {result.cpu_time:.1f} s CPU in the learner process"
    )
    print(
        f"actors: env steps {result.actor_steps}, transitions inserted {result.actor_inserts}, episodes "
        f"{result.actor_episodes}, weight pulls {result.actor_weight_pulls}; live items by actor "
        f"{result.live_by_actor}"
    )
    print(
        f"learner: {result.sample_calls:,} sample calls, {result.priority_updates:,} priority updates "
        f"({result.priorities_applied:,} applied), {result.weight_versions:,} weight versions published"
    )
    print(
        f"buffer (Ray service): {st['size']:,} items, {st['inserts']:,} inserts, {st['samples']:,} sampled, "
        f"sample/insert ratio {st['sample_to_insert_ratio']:.1f}, priorities in "
        f"[{st['priority_min']:.3g}, {st['priority_max']:.3g}] (mean {st['priority_mean']:.3g}), actors "
        f"blocked by the rate limiter {st['insert_blocked_s']:.0f} s, learner {st['sample_blocked_s']:.0f} s"
    )
    print(
        f"final average return over {len(rets)} greedy evaluation episodes: {result.final_return:.1f} "
        f"(min {rets.min():.0f}, max {rets.max():.0f}): {solved}"
    )
    print(f"figure: {out}")
    return 0


# -- inspect ----------------------------------------------------------------------------------------
def _inspect(args: argparse.Namespace) -> int:
    from .checkpoint import open_checkpoint
    from .errors import CheckpointError

    try:
        where, m = open_checkpoint(args.path)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.plot and _missing_folder(Path(args.plot), "--plot"):
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
    if args.plot:
        return _inspect_plot(where, m, Path(args.plot))
    return 0


def _missing_folder(out: Path, option: str) -> bool:
    """Print an error and return True when ``out``'s folder does not exist (none is made: a typo would)."""
    if out.parent.is_dir():
        return False
    print(f"error: {option} {out}: the folder {out.parent} does not exist (create it first)", file=sys.stderr)
    return True


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
def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _distributed_defaults() -> dict:
    """The distributed demo's defaults, for --help (importing the module does not import Ray or PyTorch)."""
    from dataclasses import asdict

    from .demo.distributed import DistributedConfig

    return asdict(DistributedConfig())


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

    d = DemoConfig()
    demo = sub.add_parser(
        "demo",
        help="train DQN with prioritized replay on CartPole-v1 (needs the [demo] extra)",
        description="Train DQN with prioritized replay on Gymnasium's CartPole-v1 from an in-process "
        "replaystore Table: a prioritized sampler (alpha 0.6, beta annealed 0.4 -> 1), importance "
        "weights on the Huber TD loss, priorities updated with |TD error|. Training stops once the "
        f"recent returns reach {d.solved_return:.0f} and a greedy evaluation confirms it; the command "
        "then prints the average return of fresh greedy evaluation episodes and writes a four-panel "
        "figure (learning curve, priority distribution, times-sampled histogram, sample-to-insert "
        f"ratio). Needs the [demo] extra: {_DEMO_EXTRA}.",
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=d.seed,
        help=f"seeds PyTorch, NumPy, the environment and the table; the same seed repeats "
        f"the same run (default {d.seed})",
    )
    demo.add_argument(
        "--steps",
        type=_positive_int,
        default=d.total_steps,
        help=f"budget of environment steps; training usually stops earlier, when solved (default {d.total_steps:,})",
    )
    demo.add_argument(
        "--out",
        default=None,
        help="path of the PNG figure to write (default replaystore-demo.png, "
        "replaystore-demo-nstep3.png with --n-step 3, "
        "replaystore-demo-distributed.png with --distributed)",
    )
    demo.add_argument(
        "--device", default=d.device, help=f"PyTorch device of the Q-network, e.g. cpu or cuda (default {d.device})"
    )
    demo.add_argument(
        "--threads",
        type=_positive_int,
        default=d.threads,
        help=f"PyTorch CPU threads, torch.set_num_threads (default {d.threads})",
    )
    demo.add_argument(
        "--eval-episodes",
        type=_positive_int,
        default=d.eval_episodes,
        help=f"episodes of each greedy evaluation, and of the final one (default {d.eval_episodes})",
    )
    demo.add_argument(
        "--n-step",
        type=_positive_int,
        default=d.n_step,
        metavar="N",
        help="n-step TD targets: N > 1 stores steps in an episodic table (rs.Episodes) and "
        "trains on Table.sample_nstep(batch, N, gamma): discounted returns over up to N "
        "steps of the same episode, no bootstrap after termination (default 1)",
    )
    demo.add_argument(
        "--no-progress", action="store_true", help="no progress bar; print one line per evaluation instead"
    )
    demo.add_argument(
        "--distributed",
        action="store_true",
        help="the Ape-X style version on a local Ray instance (loopback only, 2 CPUs, no "
        "dashboard; needs the [ray] extra too): rollout actors, each with its own environment "
        "and an epsilon-greedy copy of the Q-network, write transitions into a prioritized "
        "table served by replaystore.ray; the learner in this process samples it, trains with "
        "the importance weights and updates priorities; a sample-to-insert rate limiter keeps "
        f"one gradient step of {d.batch_size} per environment step, as in-process. --steps counts "
        "the steps of all actors",
    )
    dd = _distributed_defaults()
    demo.add_argument(
        "--actors",
        type=_positive_int,
        default=None,
        help=f"with --distributed: number of rollout actors (Ray actors; actor i is seeded with "
        f"seed + i) (default {dd['actors']})",
    )
    demo.add_argument(
        "--sync-every",
        type=_positive_int,
        default=None,
        metavar="K",
        help=f"with --distributed: each actor pulls the learner's newest weights from Ray's object "
        f"store every K of its environment steps (default {dd['sync_every']})",
    )
    demo.add_argument(
        "--write-batch",
        type=_positive_int,
        default=None,
        metavar="B",
        help=f"with --distributed: transitions an actor sends per insert call (client.extend) "
        f"(default {dd['write_batch']})",
    )
    demo.add_argument(
        "--batches-per-call",
        type=_positive_int,
        default=None,
        metavar="N",
        help="with --distributed: the learner samples N batches in one call (client.sample), makes "
        "N gradient steps from them and sends their new priorities in one update_priorities call; "
        f"fewer Ray round trips per gradient step (default {dd['batches_per_call']})",
    )
    demo.set_defaults(func=_demo)

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
    _add_dashboard_parser(sub)
    sub.add_parser(
        "bench",
        add_help=False,
        help="run the benchmark harness bench/run.py of a source checkout; arguments are passed "
        "through ([WORKLOAD ...] [--repeats N] [--quick]; `replaystore bench --help` for all)",
    )
    return parser


def _add_dashboard_parser(sub: Any) -> None:
    """``replaystore dashboard`` (replaystore.metrics.command)."""
    from .metrics.command import add_parser

    add_parser(sub)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``replaystore`` command."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "bench":
        return _bench(argv[1:])
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
