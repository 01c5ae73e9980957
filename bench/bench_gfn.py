"""replaystore.compat.gfn vs torchgfn's own replay buffers on the same HyperGrid workload.

Workload: capacity 10,000; batches of 64 trajectories sampled from HyperGrid by a uniform policy;
the buffers are filled to capacity first, then every add goes to a full buffer (the steady state
of training). Measured per operation: ``add(batch of 64)``, ``sample(64)`` and one add + one
sample, for FIFO capacity, prioritized capacity (top-k by log-reward, + prioritized sampling) and
the norm-based diverse buffer. Both libraries get the same batches in the same order.

Needs torchgfn (bench/.venv-gfn has it):

    nice bench/.venv-gfn/bin/python bench/bench_gfn.py            # full run (about 2 minutes)
    nice bench/.venv-gfn/bin/python bench/bench_gfn.py --quick    # smaller, for a smoke test
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def make_batches(ndim: int, height: int, batch: int, n_batches: int, seed: int):
    from gfn.estimators import DiscretePolicyEstimator
    from gfn.gym import HyperGrid
    from gfn.preprocessors import KHotPreprocessor
    from gfn.samplers import Sampler
    from gfn.utils.modules import DiscreteUniform

    env = HyperGrid(ndim=ndim, height=height, validate_modes=False)
    pf = DiscretePolicyEstimator(DiscreteUniform(env.n_actions), env.n_actions,
                                 preprocessor=KHotPreprocessor(env.height, env.ndim))
    sampler = Sampler(pf)
    torch.manual_seed(seed)
    batches = []
    for _ in range(n_batches):
        tr = sampler.sample_trajectories(env, n=batch, save_logprobs=True)
        _ = tr.log_rewards  # computed once, as a training loop would
        batches.append(tr)
    return env, batches


def timed(fn, reps: int) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(make_buffer, batches, capacity: int, reps: int, sample_n: int) -> dict[str, float]:
    rb = make_buffer()
    i = 0
    while len(rb) < capacity and i < 20 * capacity:  # fill (a diverse buffer may refuse some)
        rb.add(batches[i % len(batches)])
        i += 1
    cursor = [i]

    def add():
        rb.add(batches[cursor[0] % len(batches)])
        cursor[0] += 1

    def sample():
        rb.sample(sample_n)

    def both():
        add()
        sample()

    return {"add": timed(add, reps), "sample": timed(sample, reps), "add+sample": timed(both, reps), "size": len(rb)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--capacity", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--ndim", type=int, default=4)
    parser.add_argument("--height", type=int, default=8)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="capacity 2,000 and 10 reps")
    args = parser.parse_args()
    if args.quick:
        args.capacity, args.reps = 2_000, 10
    torch.set_num_threads(1)

    import gfn.containers as gc

    import replaystore.compat.gfn as rs_gfn

    env, batches = make_batches(args.ndim, args.height, args.batch, 40, seed=0)
    cap = args.capacity
    configs = {
        "FIFO capacity, uniform sampling": dict(prioritized_capacity=False, prioritized_sampling=False),
        "prioritized capacity + sampling": dict(prioritized_capacity=True, prioritized_sampling=True),
        "prioritized capacity, uniform sampling": dict(prioritized_capacity=True, prioritized_sampling=False),
    }
    rows = []
    for label, kw in configs.items():
        ours = measure(lambda kw=kw: rs_gfn.ReplayBuffer(env, cap, **kw), batches, cap, args.reps, args.batch)
        theirs = measure(lambda kw=kw: gc.ReplayBuffer(env, cap, **kw), batches, cap, args.reps, args.batch)
        rows.append((label, ours, theirs))
    div = dict(cutoff_distance=0.0, p_norm_distance=1.0)
    ours = measure(lambda: rs_gfn.NormBasedDiversePrioritizedReplayBuffer(env, cap, **div), batches, cap, args.reps,
                   args.batch)
    theirs = measure(lambda: gc.NormBasedDiversePrioritizedReplayBuffer(env, cap, **div), batches, cap, args.reps,
                     args.batch)
    rows.append(("diverse (cutoff 0, L1)", ours, theirs))
    div = dict(cutoff_distance=1.0, p_norm_distance=2.0)
    ours = measure(lambda: rs_gfn.NormBasedDiversePrioritizedReplayBuffer(env, cap, **div), batches, cap, args.reps,
                   args.batch)
    theirs = measure(lambda: gc.NormBasedDiversePrioritizedReplayBuffer(env, cap, **div), batches, cap, args.reps,
                     args.batch)
    rows.append(("diverse (cutoff 1, L2)", ours, theirs))

    print(f"HyperGrid(ndim={args.ndim}, height={args.height}), capacity {cap:,}, batches of {args.batch} "
          f"trajectories, full buffer, median of {args.reps}; torch {torch.__version__}, 1 thread")
    print()
    print("| buffer | op | replaystore (ms) | torchgfn (ms) | speed-up |")
    print("| --- | --- | ---: | ---: | ---: |")
    for label, ours, theirs in rows:
        for op in ("add", "sample", "add+sample"):
            o, t = ours[op] * 1e3, theirs[op] * 1e3
            print(f"| {label} | {op} | {o:.3f} | {t:.3f} | {t / o:.1f}x |")


if __name__ == "__main__":
    main()
