"""Train a GFlowNet (trajectory balance) on torchgfn's HyperGrid with a replay buffer.

The same run twice, same seed and step budget: once with replaystore's
``replaystore.compat.gfn.ReplayBuffer`` and once with torchgfn's own ``gfn.containers.ReplayBuffer``.
Each iteration samples a batch of trajectories on-policy, adds it to the buffer, and trains on a
batch sampled from the buffer (off-policy, so log-probabilities are recomputed). The final L1
distance between the empirical and the true terminating-state distribution is printed for both.

Needs torchgfn 2.4.1, in an environment of its own (it pins NumPy 1.26 and brings
torch-geometric), with torch 2.13.0 installed first::

    python3 -m venv bench/.venv-gfn
    bench/.venv-gfn/bin/pip install torch==2.13.0
    bench/.venv-gfn/bin/pip install -e '.[gfn-test]'     # torchgfn==2.4.1 (docs/compat/gfn.md)
    nice bench/.venv-gfn/bin/python examples/gfn_hypergrid.py            # a few minutes
    nice bench/.venv-gfn/bin/python examples/gfn_hypergrid.py --buffer replaystore --n-iterations 500
    bench/.venv-gfn/bin/python examples/gfn_hypergrid.py --smoke         # seconds

Without torchgfn it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

import torch


def train(buffer_impl: str, args: argparse.Namespace) -> dict[str, float]:
    """One training run; returns the final validation metrics and the wall time."""
    from gfn.estimators import DiscretePolicyEstimator
    from gfn.gflownet import TBGFlowNet
    from gfn.gym import HyperGrid
    from gfn.preprocessors import KHotPreprocessor
    from gfn.utils.modules import MLP

    torch.manual_seed(args.seed)
    env = HyperGrid(ndim=args.ndim, height=args.height, store_all_states=True, calculate_partition=True,
                    validate_modes=False)
    pre = KHotPreprocessor(env.height, env.ndim)
    pf_module = MLP(input_dim=pre.output_dim, output_dim=env.n_actions, hidden_dim=args.hidden)
    pb_module = MLP(input_dim=pre.output_dim, output_dim=env.n_actions - 1, hidden_dim=args.hidden,
                    trunk=pf_module.trunk)
    pf = DiscretePolicyEstimator(pf_module, env.n_actions, preprocessor=pre)
    pb = DiscretePolicyEstimator(pb_module, env.n_actions, preprocessor=pre, is_backward=True)
    gflownet = TBGFlowNet(pf=pf, pb=pb, init_logZ=0.0)
    optimizer = torch.optim.Adam(gflownet.pf_pb_parameters(), lr=args.lr)
    optimizer.add_param_group({"params": gflownet.logz_parameters(), "lr": args.lr_logz})

    if buffer_impl == "replaystore":
        from replaystore.compat.gfn import ReplayBuffer
    else:
        from gfn.containers import ReplayBuffer
    buffer = ReplayBuffer(env, capacity=args.buffer_size, prioritized_capacity=args.prioritized,
                          prioritized_sampling=args.prioritized)

    start = last = time.perf_counter()
    metrics: dict[str, float] = {}
    for it in range(args.n_iterations):
        trajectories = gflownet.sample_trajectories(env, n=args.batch_size, save_logprobs=False,
                                                    epsilon=args.epsilon)
        with torch.no_grad():
            buffer.add(trajectories)
        training = buffer.sample(args.batch_size) if len(buffer) >= args.batch_size else trajectories
        optimizer.zero_grad()
        loss = gflownet.loss(env, training, recalculate_all_logprobs=True)
        loss.backward()
        optimizer.step()
        if time.perf_counter() - last > 20:  # a line at least every 20 s between validations
            last = time.perf_counter()
            print(f"[{buffer_impl}] iter {it + 1}: loss {loss.item():.4f}", flush=True)
        if (it + 1) % args.validation_interval == 0 or it + 1 == args.n_iterations:
            last = time.perf_counter()
            metrics, _ = env.validate(gflownet, n_validation_samples=args.validation_samples)
            print(f"[{buffer_impl}] iter {it + 1}: loss {loss.item():.4f} l1 {metrics['l1_dist']:.4f}", flush=True)
    metrics["seconds"] = time.perf_counter() - start
    return metrics


MISSING_TORCHGFN = """examples/gfn_hypergrid.py needs torchgfn (the 'gfn' package), which is not installed in
this Python. It pins NumPy 1.26, so give it an environment of its own, from the repository root:

    python3 -m venv bench/.venv-gfn
    bench/.venv-gfn/bin/pip install torch==2.13.0
    bench/.venv-gfn/bin/pip install -e '.[gfn-test]'
    bench/.venv-gfn/bin/python examples/gfn_hypergrid.py

(docs/compat/gfn.md, "Example: HyperGrid")"""


def main() -> None:
    """Parse the options, run the requested trainings, print the L1 table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--buffer", choices=["both", "replaystore", "torchgfn", "both-reversed"], default="both")
    p.add_argument("--ndim", type=int, default=2)
    p.add_argument("--height", type=int, default=8)
    p.add_argument("--n-iterations", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--buffer-size", type=int, default=1000)
    p.add_argument("--prioritized", action="store_true", help="prioritized capacity and sampling")
    p.add_argument("--epsilon", type=float, default=0.05, help="exploration of the sampling policy")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-logz", type=float, default=1e-1)
    p.add_argument("--validation-interval", type=int, default=500)
    p.add_argument("--validation-samples", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="seconds: 20 iterations, a small validation")
    args = p.parse_args()
    if importlib.util.find_spec("gfn") is None:
        print(MISSING_TORCHGFN, file=sys.stderr)
        raise SystemExit(2)
    if args.smoke:
        args.n_iterations, args.validation_interval, args.validation_samples = 20, 10, 200
    torch.set_num_threads(1)
    impls = {"both": ["replaystore", "torchgfn"], "both-reversed": ["torchgfn", "replaystore"]}.get(
        args.buffer, [args.buffer])
    results = {impl: train(impl, args) for impl in impls}
    print()
    print("| buffer | final L1 | logZ diff | seconds |")
    print("| --- | ---: | ---: | ---: |")
    for impl, m in results.items():
        print(f"| {impl} | {m['l1_dist']:.4f} | {m.get('logZ_diff', float('nan')):.4f} | {m['seconds']:.1f} |")
    print("(seconds include validation; the first run also pays one-time warm-up: compare with --buffer both-reversed)")


if __name__ == "__main__":
    main()
