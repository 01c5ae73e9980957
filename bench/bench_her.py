"""HER buffers: Stable-Baselines3's ``HerReplayBuffer``, replaystore's and rlox's, in one process.

All are filled from the same BitFlippingEnv vector env (SB3's goal env: Dict observations of
``--bits`` bits, episodes of at most ``--bits`` steps); then, alternating blocks of calls, CPU time
(``time.process_time``) per ``add`` (one transition per env) and per ``sample(B)`` (relabelling
with the "future" strategy, 4 sampled goals per real one, i.e. a relabelled share of 0.8),
medians over ``--repeats`` blocks. The recorded stream is built as SB3's own training loop stores
it: for a finished episode, ``next_obs`` is the terminal observation from ``infos``, not the reset.

- SB3 ``HerReplayBuffer`` and replaystore's ``ReplaystoreHerReplayBuffer``: ``add(obs, next_obs,
  action, reward, done, infos)`` of Dict observations; ``sample`` returns torch tensors, relabelled
  rewards from the env's ``compute_reward`` (Python, through ``env_method``).
- rlox 1.2 ``HERBuffer`` (``--no-rlox`` leaves it out): one flat float32 observation per step,
  ``[observation | achieved_goal | desired_goal]``, pushed one step at a time with ``push(obs,
  next_obs, action, reward, terminated, truncated)``; ``sample(B, her_ratio=0.8, seed)`` returns
  NumPy arrays (flat observations, relabelled goal written in), rewards computed in Rust as
  ``0 if ||achieved - goal|| < goal_tolerance else -1`` (equal to BitFlippingEnv's reward for
  ``goal_tolerance=0.5``). It tracks the episodes of *one* stream, so with ``n`` envs the rlox
  column uses ``n`` buffers (one per env, ``size`` steps each): ``add`` is ``n`` pushes and
  ``sample(B)`` draws ``B / n`` from each and concatenates. Its inputs (flattened float32
  observations, float actions, split done flags) are converted before timing, as in ``peers.py``.

    PYTHONPATH=src python bench/bench_her.py --sizes 10000,100000 --envs 1,8

Measured on a shared machine: compare the ratios of one run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from importlib import metadata

import numpy as np

HER_RATIO = 0.8  # SB3: 1 - 1 / (n_sampled_goal + 1) with n_sampled_goal = 4


def make(kind: str, venv, size: int, n_envs: int):
    if kind == "rlox":
        return RloxHer(venv, size, n_envs)
    from stable_baselines3 import HerReplayBuffer

    from replaystore.integrations.sb3_her import ReplaystoreHerReplayBuffer

    cls = HerReplayBuffer if kind == "sb3" else ReplaystoreHerReplayBuffer
    return cls(size * n_envs, venv.observation_space, venv.action_space, env=venv, n_envs=n_envs,
               n_sampled_goal=4, goal_selection_strategy="future", device="cpu")


class RloxHer:
    """``n_envs`` rlox ``HERBuffer`` s (one per env stream) behind the bench's add/sample calls.

    ``add`` takes the step in rlox's form (:func:`rlox_steps`): one ``push`` per env. ``sample(B)``
    draws an equal share of ``B`` from every buffer (seed advanced per call: a fixed seed repeats
    the batch) and concatenates the NumPy arrays; with one env it returns rlox's dict as is.
    """

    def __init__(self, venv, size: int, n_envs: int) -> None:
        import rlox

        bits = venv.observation_space["observation"].shape[0]
        self.bufs = [rlox.HERBuffer(size, 3 * bits, 1, bits, achieved_goal_start=bits,
                                    desired_goal_start=2 * bits, strategy="future", k=4,
                                    goal_tolerance=0.5) for _ in range(n_envs)]
        self.seed = 0

    def add(self, *step) -> None:
        for buf, row in zip(self.bufs, step):
            buf.push(*row)

    def sample(self, batch: int) -> dict[str, np.ndarray]:
        self.seed += 1
        if len(self.bufs) == 1:
            return self.bufs[0].sample(batch, HER_RATIO, self.seed)
        shares = [len(a) for a in np.array_split(np.empty(batch), len(self.bufs))]
        parts = [b.sample(k, HER_RATIO, self.seed * 1000 + i) for i, (b, k) in enumerate(zip(self.bufs, shares))]
        return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def transitions(venv, n_envs: int, count: int, rng: np.random.Generator) -> list:
    """``count`` vector-env steps as ``add`` arguments; ``next_obs`` as SB3's loop stores it."""
    out = []
    obs = venv.reset()
    for _ in range(count):
        act = rng.integers(0, venv.action_space.n, n_envs)
        nxt, r, d, infos = venv.step(act)
        real_next = {k: v.copy() for k, v in nxt.items()}
        for i in np.flatnonzero(d):  # SB3's _store_transition: the terminal obs, not the reset one
            for k in real_next:
                real_next[k][i] = infos[i]["terminal_observation"][k]
        out.append((obs, real_next, act, r, d, infos))
        obs = nxt
    return out


def rlox_steps(data: list) -> list:
    """The recorded steps in rlox's form: per step, per env ``(obs, next_obs, action, reward,
    terminated, truncated)`` with flat float32 ``[observation | achieved | desired]`` vectors."""
    keys = ("observation", "achieved_goal", "desired_goal")

    def flat(o):
        return np.concatenate([o[k] for k in keys], axis=1).astype(np.float32)

    out = []
    for obs, nxt, act, r, d, infos in data:
        fo, fn = flat(obs), flat(nxt)
        rows = []
        for i in range(len(act)):
            trunc = bool(infos[i].get("TimeLimit.truncated", False))
            rows.append((fo[i], fn[i], np.array([act[i]], np.float32), float(r[i]),
                         bool(d[i]) and not trunc, bool(d[i]) and trunc))
        out.append(rows)
    return out


def check_rlox(buf: RloxHer, bits: int, batch: int) -> float:
    """Share of rlox's sampled rows whose reward equals BitFlippingEnv's for the goal it returns
    (``next_obs``'s achieved goal against ``obs``'s desired goal); raises if the goal differs
    between ``obs`` and ``next_obs``."""
    s = buf.sample(batch)
    obs, nxt = s["obs"], s["next_obs"]
    goal = obs[:, 2 * bits:]
    assert np.array_equal(goal, nxt[:, 2 * bits:]), "obs and next_obs carry different goals"
    expected = -(np.linalg.norm(nxt[:, bits:2 * bits] - goal, axis=1) > 0).astype(np.float32)
    return float(np.mean(s["rewards"] == expected))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000", help="ring length per env (steps)")
    ap.add_argument("--envs", default="1,8")
    ap.add_argument("--bits", type=int, default=15)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=100, help="calls per timed block")
    ap.add_argument("--no-rlox", action="store_true", help="leave rlox's HERBuffer out")
    args = ap.parse_args()
    import stable_baselines3
    import torch
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.envs import BitFlippingEnv

    import replaystore

    kinds = ["sb3", "ours"]
    rlox_version = "not run"
    if not args.no_rlox:
        try:
            import rlox  # noqa: F401

            rlox_version = metadata.version("rlox")
            kinds.append("rlox")
        except ImportError as e:
            rlox_version = f"not installed ({e})"
    torch.set_num_threads(1)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"replaystore {replaystore.__version__}, stable-baselines3 {stable_baselines3.__version__}, "
          f"rlox {rlox_version}, numpy {np.__version__}; bits={args.bits}, batch={args.batch}; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load {' '.join(load)}")
    head = f"{'steps/env x envs':>18} | {'add SB3':>9} {'add ours':>9} "
    if "rlox" in kinds:
        head += f"{'add rlox':>9} "
    head += f"{'SB3/ours':>8} "
    if "rlox" in kinds:
        head += f"{'rlox/ours':>9} "
    head += f"| {'smp SB3':>9} {'smp ours':>9} "
    if "rlox" in kinds:
        head += f"{'smp rlox':>9} "
    head += f"{'SB3/ours':>8}"
    if "rlox" in kinds:
        head += f" {'rlox/ours':>9} | rlox reward check"
    print(head)
    for n_envs in (int(x) for x in args.envs.split(",")):
        venv = make_vec_env(lambda: BitFlippingEnv(n_bits=args.bits), n_envs)
        venv.seed(0)
        for size in (int(x) for x in args.sizes.split(",")):
            rng = np.random.default_rng(0)
            data = transitions(venv, n_envs, min(size, 4000), rng)
            steps = {k: data for k in kinds}
            if "rlox" in kinds:
                steps["rlox"] = rlox_steps(data)
            bufs = {k: make(k, venv, size, n_envs) for k in kinds}
            for k, b in bufs.items():  # fill the ring once (repeat the recorded stream)
                st = steps[k]
                for i in range(size):
                    b.add(*st[i % len(st)])
            add = {k: [] for k in bufs}
            smp = {k: [] for k in bufs}
            for _ in range(args.repeats):
                for k, b in bufs.items():
                    st = steps[k]
                    c0 = time.process_time()
                    for i in range(args.calls):
                        b.add(*st[i % len(st)])
                    add[k].append((time.process_time() - c0) / args.calls * 1e6)
                    c0 = time.process_time()
                    for _ in range(args.calls):
                        b.sample(args.batch)
                    smp[k].append((time.process_time() - c0) / args.calls * 1e6)
            a = {k: statistics.median(v) for k, v in add.items()}
            s = {k: statistics.median(v) for k, v in smp.items()}
            line = f"{size:>10,} x {n_envs:<5} | {a['sb3']:7.1f}us {a['ours']:7.1f}us "
            if "rlox" in kinds:
                line += f"{a['rlox']:7.1f}us "
            line += f"{a['sb3'] / a['ours']:7.2f}x "
            if "rlox" in kinds:
                line += f"{a['rlox'] / a['ours']:8.2f}x "
            line += f"| {s['sb3']:7.1f}us {s['ours']:7.1f}us "
            if "rlox" in kinds:
                line += f"{s['rlox']:7.1f}us "
            line += f"{s['sb3'] / s['ours']:7.2f}x"
            if "rlox" in kinds:
                ok = check_rlox(bufs["rlox"], args.bits, 4096)
                line += f" {s['rlox'] / s['ours']:8.2f}x | {ok:.1%} of 4096 rows"
            print(line, flush=True)


if __name__ == "__main__":
    main()
