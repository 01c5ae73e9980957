"""Multi-agent replay (issue #33): joint samples of B=256 with 8 agents from 1M environment steps.

replaystore's ``MultiAgentTable`` (one row per environment step, agents on an axis, ``alive``
mask, the global state once per step) against TorchRL 0.14's nested-agent storage (a
``TensorDictReplayBuffer`` over a ``LazyTensorStorage`` whose rows hold an ``agents`` sub-TensorDict
of batch size 8, BenchMARL's layout) holding the same steps.

Per environment step: 8 agents x (obs float32[16], next_obs float32[16], action int64, reward
float32, terminated bool, truncated bool) + the global state float32[32] (+ replaystore's ``alive``
bool[8]; TorchRL's layout has no mask: a fixed agent set). Both are filled with the same 1M steps
(1,000 episodes of 1,000 steps, one stream), written in chunks before timing.

Timed: ``sample_joint(256)`` (synchronized: every agent of 256 steps, with the mask) and
``sample(256)`` (independent: 256 (step, agent) pairs) against TorchRL's ``rb.sample()`` (256 joint
steps): CPU (process time) per call, median of ``--repeats`` runs of ``--seconds`` each.
Memory: RSS growth of building and filling each buffer, per environment step, against the
payload (the bytes of the fields above per step).

Usage::

    PYTHONPATH=src nice -n 10 python bench/bench_multiagent.py [--steps 1000000] [--repeats 5] [--seconds 1]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import numpy as np

A, OBS, STATE, B = 8, 16, 32, 256
AGENT_FIELDS = {
    "obs": ((OBS,), np.float32),
    "next_obs": ((OBS,), np.float32),
    "action": ((), np.int64),
    "reward": ((), np.float32),
    "terminated": ((), np.bool_),
    "truncated": ((), np.bool_),
}
PAYLOAD = A * sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in AGENT_FIELDS.values()) + STATE * 4


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def chunks(n: int, size: int = 100_000, seed: int = 0):
    """The same steps for every peer: ``(agent fields (k, A, ...), state (k, STATE), terminated (k,))``."""
    rng = np.random.default_rng(seed)
    for start in range(0, n, size):
        k = min(size, n - start)
        agents = {
            "obs": rng.random((k, A, OBS), np.float32),
            "next_obs": rng.random((k, A, OBS), np.float32),
            "action": rng.integers(0, 5, (k, A)),
            "reward": rng.random((k, A), np.float32),
            "terminated": np.zeros((k, A), bool),
            "truncated": np.zeros((k, A), bool),
        }
        ends = (np.arange(start, start + k) % 1000) == 999
        agents["terminated"][ends] = True
        yield agents, rng.random((k, STATE), np.float32), ends


def build_replaystore(n: int):
    import replaystore as rs
    from replaystore.multiagent import MultiAgentTable

    table = rs.Table(n, episodes=rs.Episodes(), seed=0)
    ma = MultiAgentTable(table, [f"agent_{i}" for i in range(A)], global_fields=["state"], seed=0)
    for agents, state, ends in chunks(n):
        rows = dict(agents, state=state, alive=np.ones((len(state), A), bool))
        table.extend_steps(rows, streams=0, terminated=ends, truncated=np.zeros(len(ends), bool))
    return ma


def build_torchrl(n: int):
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    torch.manual_seed(0)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(n), batch_size=B)
    for agents, state, ends in chunks(n):
        k = len(state)
        td = TensorDict(
            {
                "agents": TensorDict({f: torch.from_numpy(v) for f, v in agents.items()}, batch_size=[k, A]),
                "state": torch.from_numpy(state),
                "done": torch.from_numpy(ends),
            },
            batch_size=[k],
        )
        rb.extend(td)
    return rb


def write_cost(steps: int = 20_000) -> float:
    """CPU seconds per ``MultiAgentTable.add_step`` of one environment step (8 agents, dicts per agent)."""
    import replaystore as rs
    from replaystore.multiagent import MultiAgentTable

    names = [f"agent_{i}" for i in range(A)]
    ma = MultiAgentTable(rs.Table(steps, episodes=rs.Episodes(), seed=0), names, global_fields=["state"])
    agents, state, _ = next(chunks(steps, size=steps, seed=1))
    per_step = [{a: {f: v[t, i] for f, v in agents.items()} for i, a in enumerate(names)} for t in range(steps)]
    c0 = time.process_time()
    for t in range(steps):
        ma.add_step(per_step[t], stream=0, state={"state": state[t]})
    return (time.process_time() - c0) / steps


def cpu_per_call(fn, seconds: float, repeats: int) -> float:
    fn()
    runs = []
    for _ in range(repeats):
        n, c0, w0 = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - w0 < seconds:
            fn()
            n += 1
        runs.append((time.process_time() - c0) / n)
    return statistics.median(runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0)
    args = p.parse_args()
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    out = {"steps": args.steps, "agents": A, "batch": B, "payload_bytes_per_step": PAYLOAD}
    gc.collect()
    r0 = rss()
    ma = build_replaystore(args.steps)
    out["replaystore_bytes_per_step"] = (rss() - r0) / args.steps
    out["replaystore_joint_us"] = 1e6 * cpu_per_call(lambda: ma.sample_joint(B), args.seconds, args.repeats)
    out["replaystore_independent_us"] = 1e6 * cpu_per_call(lambda: ma.sample(B), args.seconds, args.repeats)
    ma = None  # free it before the next peer
    out["replaystore_add_step_us"] = 1e6 * write_cost()
    gc.collect()
    try:
        r0 = rss()
        rb = build_torchrl(args.steps)
        out["torchrl_bytes_per_step"] = (rss() - r0) / args.steps
        out["torchrl_joint_us"] = 1e6 * cpu_per_call(lambda: rb.sample(), args.seconds, args.repeats)
        out["joint_speedup"] = out["torchrl_joint_us"] / out["replaystore_joint_us"]
    except ImportError as e:
        out["torchrl"] = f"not installed: {e}"
    out["replaystore_memory_vs_payload"] = out["replaystore_bytes_per_step"] / PAYLOAD
    with open("/proc/loadavg") as f:
        out["loadavg"] = f.read().split()[:3]
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
