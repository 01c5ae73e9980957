"""``replaystore demo``: its command line and what it runs (the ``replaystore`` command adds it).

``run_demo`` trains in process (:mod:`.train`) or, with ``--distributed``, with rollout actors on
a local Ray instance (:mod:`.distributed`), prints the run's figures and writes the figure
(:mod:`.plot`). Importing this module imports neither PyTorch, Gymnasium nor Ray: the command
first says which packages of the ``[demo]`` (and ``[ray]``) extra are missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .config import DemoConfig, DistributedConfig

DEMO_EXTRA = "pip install 'replaystore[demo]'  (torch==2.13.0, gymnasium, tqdm, matplotlib)"


def positive_int(text: str) -> int:
    """``int(text)``, for argparse: an ``ArgumentTypeError`` unless it is at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


# -- running the demo -------------------------------------------------------------------------------------------
def missing_demo_dependencies() -> list[str]:
    """The packages of the ``[demo]`` extra that cannot be imported."""
    return [name for name in ("torch", "gymnasium", "tqdm", "matplotlib") if importlib.util.find_spec(name) is None]


def run_demo(args: argparse.Namespace) -> int:
    """Run ``replaystore demo`` with the parsed ``args``; return the exit code (2: bad options or a missing extra)."""
    if args.distributed and args.n_step > 1:
        print("replaystore demo: --n-step applies only without --distributed", file=sys.stderr)
        return 2
    given = {k: getattr(args, k) for k in _DISTRIBUTED_OPTIONS if getattr(args, k) is not None}
    if given and not args.distributed:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in given)
        print(f"replaystore demo: {flags} only apply with --distributed", file=sys.stderr)
        return 2
    missing = missing_demo_dependencies()
    if args.distributed:
        missing += [n for n in ("ray",) if importlib.util.find_spec(n) is None]
    if missing:
        name, extra = (
            ("demo --distributed", "pip install 'replaystore[demo,ray]'") if args.distributed else ("demo", DEMO_EXTRA)
        )
        print(f"replaystore {name} needs {', '.join(missing)}: {extra}", file=sys.stderr)
        return 2
    from .plot import plot_result

    config = DemoConfig(
        seed=args.seed,
        total_steps=args.steps,
        device=args.device,
        threads=args.threads,
        eval_episodes=args.eval_episodes,
        n_step=args.n_step,
    )
    progress = not args.no_progress
    result = _train_distributed(config, given, progress) if args.distributed else _train(config, progress)
    if isinstance(result, int):  # the exit code of a refused or interrupted run
        return result
    out = Path(args.out or ("replaystore-demo-distributed.png" if args.distributed else config.figure_name))
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_result(result, out)
    st, rets, bar = result.stats, result.final_returns, config.pass_return  # the figure draws the same bar
    solved = f"solved (>= {bar:.0f})" if result.final_return >= bar else f"not solved (below {bar:.0f})"
    stop = f"solved at step {result.solved_at:,}" if result.solved_at else "step budget used up"
    print(
        f"trained {result.steps:,} env steps ({stop}), {result.updates:,} gradient steps, "
        f"{result.wall_time:.1f} s wall, {result.cpu_time:.1f} s CPU"
        + (" in the learner process" if args.distributed else "")
    )
    buffer = (
        f"{st['size']:,} items, {st['inserts']:,} inserts, {st['samples']:,} sampled, "
        f"sample/insert ratio {st['sample_to_insert_ratio']:.1f}, priorities in "
        f"[{st['priority_min']:.3g}, {st['priority_max']:.3g}] (mean {st['priority_mean']:.3g})"
    )
    if args.distributed:
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
            f"buffer (Ray service): {buffer}, actors blocked by the rate limiter {st['insert_blocked_s']:.0f} s, "
            f"learner {st['sample_blocked_s']:.0f} s"
        )
    else:
        print(f"buffer: {buffer}")
    print(
        f"final average return over {len(rets)} greedy evaluation episodes: {result.final_return:.1f} "
        f"(min {rets.min():.0f}, max {rets.max():.0f}): {solved}"
    )
    print(f"figure: {out}")
    return 0


_DISTRIBUTED_OPTIONS = ("actors", "sync_every", "write_batch", "batches_per_call")


def _train(config: DemoConfig, progress: bool) -> Any:
    from .train import train

    nstep = f", {config.n_step}-step returns (Table.sample_nstep)" if config.n_step > 1 else ""
    print(
        f"replaystore demo: DQN with prioritized replay (alpha {config.alpha}, beta {config.beta_start} -> "
        f"{config.beta_end}){nstep} on {config.env_id}, seed {config.seed}, at most {config.total_steps:,} steps, "
        f"device {config.device}",
        flush=True,
    )
    return train(config, progress=progress)


def _train_distributed(config: DemoConfig, given: dict, progress: bool) -> Any:
    from .distributed import train_distributed

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
        return train_distributed(config, dist, progress=progress)
    except KeyboardInterrupt:
        print("\nreplaystore demo --distributed: interrupted; actors, service and Ray shut down", file=sys.stderr)
        return 130


# -- its command line -------------------------------------------------------------------------------
def add_parser(sub: Any) -> None:
    """Add ``replaystore demo`` to the ``replaystore`` command's subparsers ``sub``."""
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
        f"ratio). Needs the [demo] extra: {DEMO_EXTRA}.",
    )
    for flag, kind, text in (  # the options DemoConfig holds, with its defaults
        ("--seed", int, "seeds PyTorch, NumPy, the environment and the table; the same seed repeats the same run"),
        ("--steps", positive_int, "budget of environment steps; training usually stops earlier, when solved"),
        ("--device", str, "PyTorch device of the Q-network, e.g. cpu or cuda"),
        ("--threads", positive_int, "PyTorch CPU threads, torch.set_num_threads"),
        ("--eval-episodes", positive_int, "episodes of each greedy evaluation, and of the final one"),
    ):
        value = getattr(d, {"--steps": "total_steps"}.get(flag, flag[2:].replace("-", "_")))
        shown = f"{value:,}" if isinstance(value, int) else value
        demo.add_argument(flag, type=kind, default=value, help=f"{text} (default {shown})")
    demo.add_argument(
        "--out",
        default=None,
        help="path of the PNG figure to write (default replaystore-demo.png, "
        "replaystore-demo-nstep3.png with --n-step 3, "
        "replaystore-demo-distributed.png with --distributed)",
    )
    demo.add_argument(
        "--n-step",
        type=positive_int,
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
    dd = asdict(DistributedConfig())
    for flag, metavar, text in (
        ("--actors", None, "number of rollout actors (Ray actors; actor i is seeded with seed + i)"),
        (
            "--sync-every",
            "K",
            "each actor pulls the learner's newest weights from Ray's object store every K of its environment steps",
        ),
        ("--write-batch", "B", "transitions an actor sends per insert call (client.extend)"),
        (
            "--batches-per-call",
            "N",
            "the learner samples N batches in one call (client.sample), makes N gradient steps from them and "
            "sends their new priorities in one update_priorities call; fewer Ray round trips per gradient step",
        ),
    ):
        text = f"with --distributed: {text} (default {dd[flag[2:].replace('-', '_')]})"
        demo.add_argument(flag, type=positive_int, default=None, metavar=metavar, help=text)
    demo.set_defaults(func=run_demo)


__all__ = ["DEMO_EXTRA", "add_parser", "missing_demo_dependencies", "positive_int", "run_demo"]
