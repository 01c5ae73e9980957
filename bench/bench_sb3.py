"""Stable-Baselines3's replay buffer against replaystore's SB3 adapter, and CleanRL's dqn.py end to end.

Part 1 (``micro``), both buffers in this one process, alternating, medians of ``--repeats``:

- ``add``: ``--adds`` calls of ``add`` (one transition per env, CartPole-sized: obs float32[4],
  Discrete(2) actions, ``handle_timeout_termination=True``, SB3's default) into a buffer of 1M
  transitions, with 1 and 8 envs. For replaystore the time includes registering the rows with the
  table (forced once at the end), which otherwise happens at the next ``sample``.
- ``sample B``: from a full buffer of 100k transitions, B in 32, 128, 256, tensors materialised.
- ``loop``: the calling patterns of the algorithms: 10 adds + ``sample(128)`` (CleanRL's DQN:
  ``train_frequency=10``, ``batch_size=128``), 4 adds + ``sample(32)`` (SB3's DQN defaults),
  1 add + ``sample(256)`` (SB3's SAC defaults), into a full 100k buffer.
- ``PER``: ``ReplaystorePrioritizedReplayBuffer.sample(256)`` + ``update_priorities`` (SB3 has no
  prioritized buffer; shown against SB3's uniform ``sample(256)`` for scale).
- times are CPU time of this process (``time.process_time``), steadier than wall time on a shared
  machine; torch and BLAS use one thread.
- memory: bytes allocated (``tracemalloc``) by building and filling 1M transitions.

Part 2 (``cleanrl``): CleanRL's ``cleanrl/dqn.py`` run unmodified except for its buffer import,
with SB3's ``ReplayBuffer`` and with ``ReplaystoreReplayBuffer``, each in a fresh subprocess,
alternating, ``--cleanrl-repeats`` times; steps/s over the training loop (from the buffer's
construction, which the script does just before its loop, to the process's exit), in wall time
and in CPU time of the process (steadier on a loaded machine). The script is
read at run time from a local clone (``--cleanrl-repo``, a git directory; default: the mirror this
project was developed with), or from a file given with ``--cleanrl-script`` (download it from
https://github.com/vwxyzjn/cleanrl/blob/master/cleanrl/dqn.py). Nothing of CleanRL is stored here.
The text patches, each checked to apply exactly once:

- ``from cleanrl_utils.buffers import ReplayBuffer``: the buffer under test (CleanRL's copy of
  SB3's buffer is replaced by SB3's own or by replaystore's);
- ``tyro.cli(Args)``: the same ``Args`` with ``--cleanrl-steps`` total steps (tyro not needed);
- ``SummaryWriter``: a no-op writer (no TensorBoard event files: the same for both runs);
- ``infos["final_observation"]``: gymnasium >= 1.0 returns the final observation as ``next_obs``
  (and no such key); the script was written for gymnasium 0.29.

Usage::

    PYTHONPATH=src nice -n 5 bench/.venv/bin/python bench/bench_sb3.py [--part micro|cleanrl|all]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

DEFAULT_CLEANRL_REPO = "/work/.mirror/vwxyzjn+cleanrl/repo"
# CPU time of this process: on a shared, loaded machine it is far steadier than wall time
_clock = time.process_time


def _spaces():
    from gymnasium import spaces

    return spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2)


def _classes():
    from stable_baselines3.common.buffers import ReplayBuffer

    from replaystore.integrations.sb3 import ReplaystoreReplayBuffer

    return {"sb3": ReplayBuffer, "replaystore": ReplaystoreReplayBuffer}


def _data(n_envs: int, rows: int = 256, seed: int = 0):
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((rows, n_envs, 4)).astype(np.float32)
    act = rng.integers(0, 2, (rows, n_envs))
    rew = rng.standard_normal((rows, n_envs)).astype(np.float32)
    done = rng.random((rows, n_envs)) < 0.02
    infos = [[{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} for d in row] for row in done]
    return obs, act, rew, done, infos


def _fill(buf, n_adds: int, data) -> None:
    obs, act, rew, done, infos = data
    rows = len(obs)
    for i in range(n_adds):
        j = i % rows
        buf.add(obs[j], obs[(j + 1) % rows], act[j], rew[j], done[j], infos[j])


def _register(buf) -> None:
    if hasattr(buf, "table"):
        buf.table  # noqa: B018  (the property registers the pending rows)


def bench_add(cls, n_envs: int, n_adds: int) -> float:
    """Microseconds per add (one row per env), registration with the table included."""
    obs_space, act_space = _spaces()
    buf = cls(1_000_000, obs_space, act_space, device="cpu", n_envs=n_envs)
    data = _data(n_envs)
    _fill(buf, 1000, data)  # warm up (pages of the first rows, code paths)
    _register(buf)
    t = _clock()
    _fill(buf, n_adds, data)
    _register(buf)
    return (_clock() - t) / n_adds * 1e6


def _full_buffer(cls, n_envs: int, size: int = 100_000):
    obs_space, act_space = _spaces()
    buf = cls(size, obs_space, act_space, device="cpu", n_envs=n_envs)
    _fill(buf, size // n_envs, _data(n_envs))
    buf.sample(1)
    return buf


def bench_sample(buf, batch: int, calls: int) -> float:
    """Microseconds per ``sample(batch)``."""
    t = _clock()
    for _ in range(calls):
        buf.sample(batch)
    return (_clock() - t) / calls * 1e6


def bench_loop(buf, adds: int, batch: int, cycles: int, data) -> float:
    """Microseconds per cycle of ``adds`` adds then one ``sample(batch)``."""
    obs, act, rew, done, infos = data
    rows = len(obs)
    j = 0
    t = _clock()
    for _ in range(cycles):
        for _ in range(adds):
            buf.add(obs[j], obs[(j + 1) % rows], act[j], rew[j], done[j], infos[j])
            j = (j + 1) % rows
        buf.sample(batch)
    return (_clock() - t) / cycles * 1e6


def bench_per(calls: int) -> float:
    """Microseconds per prioritized ``sample(256)`` + ``update_priorities`` from 100k transitions."""
    from replaystore.integrations.sb3 import ReplaystorePrioritizedReplayBuffer

    buf = _full_buffer(ReplaystorePrioritizedReplayBuffer, 1)
    rng = np.random.default_rng(0)
    td = rng.random((calls, 256))
    t = _clock()
    for i in range(calls):
        s = buf.sample(256)
        buf.update_priorities(s.keys, td[i])
    return (_clock() - t) / calls * 1e6


def memory(cls, n: int = 1_000_000) -> int:
    """Bytes allocated (tracemalloc) by building and filling a buffer of ``n`` transitions."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    obs_space, act_space = _spaces()
    buf = cls(n, obs_space, act_space, device="cpu")
    obs, act, rew, done, infos = _data(1)
    # fill by whole arrays (the same for both: it is the footprint that is measured, not the add)
    buf.observations[:, 0] = obs[0, 0]
    buf.pos, buf.full = 0, True
    buf.sample(1)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del buf
    return used


def median(xs):
    return statistics.median(xs)


def run_micro(repeats: int, adds: int) -> list[dict]:
    classes = _classes()
    rows = []

    def record(name, fn):
        times = {k: [] for k in classes}
        for _ in range(repeats):
            for k in classes:  # alternate the libraries within each repeat
                times[k].append(fn(k))
        m = {k: median(v) for k, v in times.items()}
        rows.append({"workload": name, "sb3_us": m["sb3"], "replaystore_us": m["replaystore"],
                     "speedup": m["sb3"] / m["replaystore"]})
        print(f"{name:32s} sb3 {m['sb3']:9.2f} us   replaystore {m['replaystore']:9.2f} us   "
              f"ratio {m['sb3'] / m['replaystore']:.2f}x", flush=True)

    for n_envs in (1, 8):
        record(f"add, {n_envs} env(s)", lambda k, n=n_envs: bench_add(classes[k], n, adds))
    for n_envs in (1, 8):
        bufs = {k: _full_buffer(c, n_envs) for k, c in classes.items()}
        for batch in (32, 128, 256):
            record(f"sample {batch}, {n_envs} env(s)",
                   lambda k, b=batch, bufs=bufs: bench_sample(bufs[k], b, 300))
        data = _data(n_envs, seed=1)
        for adds_per, batch in ((10, 128), (4, 32), (1, 256)):
            record(f"{adds_per} adds + sample {batch}, {n_envs} env(s)",
                   lambda k, a=adds_per, b=batch, bufs=bufs, data=data: bench_loop(bufs[k], a, b, 300, data))
        bufs.clear()
    per = median([bench_per(300) for _ in range(repeats)])
    print(f"{'PER sample 256 + update':32s} replaystore {per:9.2f} us (no SB3 peer)", flush=True)
    rows.append({"workload": "PER sample 256 + update (replaystore only)", "replaystore_us": per})
    mem = {k: memory(c) for k, c in classes.items()}
    print(f"memory, 1M transitions: sb3 {mem['sb3'] / 1e6:.1f} MB, replaystore {mem['replaystore'] / 1e6:.1f} MB",
          flush=True)
    rows.append({"workload": "memory 1M (bytes)", "sb3": mem["sb3"], "replaystore": mem["replaystore"]})
    return rows


# -- CleanRL ----------------------------------------------------------------------------------------
_PATCHES = [
    ("from cleanrl_utils.buffers import ReplayBuffer", "from _bench_shim import ReplayBuffer"),
    ("import tyro\n", ""),
    ("from torch.utils.tensorboard import SummaryWriter", "from _bench_shim import SummaryWriter"),
    ("args = tyro.cli(Args)", "args = _bench_shim.args(Args)"),
    ('real_next_obs[idx] = infos["final_observation"][idx]',
     'real_next_obs[idx] = infos.get("final_observation", next_obs)[idx]'),
]

_SHIM = '''
"""Written by bench/bench_sb3.py: the buffer under test, a no-op SummaryWriter, the run's Args."""
import atexit, json, os, sys, time

_kind = os.environ["BENCH_BUFFER"]
if _kind == "sb3":
    from stable_baselines3.common.buffers import ReplayBuffer as _Buffer
else:
    from replaystore.integrations.sb3 import ReplaystoreReplayBuffer as _Buffer
_start = []


def ReplayBuffer(*args, **kwargs):
    buf = _Buffer(*args, **kwargs)
    _start.append((time.perf_counter(), time.process_time()))  # the script starts its loop right after this
    return buf


def _report():
    if _start:
        wall, cpu = _start[0]
        print("BENCH_RESULT " + json.dumps({"seconds": time.perf_counter() - wall,
                                            "cpu_seconds": time.process_time() - cpu}), flush=True)


atexit.register(_report)


class SummaryWriter:
    def __init__(self, *a, **k): pass
    def add_scalar(self, *a, **k): pass
    def add_text(self, *a, **k): pass
    def close(self): pass


def args(cls):
    a = cls()
    for k, v in json.loads(os.environ["BENCH_ARGS"]).items():
        setattr(a, k, v)
    return a
'''


def cleanrl_source(repo: str, script: str | None) -> tuple[str, str]:
    """The text of CleanRL's dqn.py and where it came from."""
    if script:
        return Path(script).read_text(), script
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    text = subprocess.run(["git", "-C", repo, "show", f"{commit}:cleanrl/dqn.py"], capture_output=True, text=True,
                          check=True).stdout
    return text, f"{repo} @ {commit[:12]}"


def patch(text: str) -> str:
    for old, new in _PATCHES:
        if text.count(old) != 1:
            raise SystemExit(f"CleanRL's dqn.py changed: {old!r} found {text.count(old)} times (expected 1)")
        text = text.replace(old, new)
    return "import _bench_shim\n" + text


def run_cleanrl(repo: str, script: str | None, steps: int, repeats: int) -> dict:
    text, origin = cleanrl_source(repo, script)
    work = Path(tempfile.mkdtemp(prefix="bench_cleanrl_"))
    (work / "dqn.py").write_text(patch(text))
    (work / "_bench_shim.py").write_text(_SHIM)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(work), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env["BENCH_ARGS"] = json.dumps({"total_timesteps": steps, "cuda": False, "seed": 1})
    sps = {"sb3": [], "replaystore": []}
    cpu_sps = {"sb3": [], "replaystore": []}
    for r in range(repeats):
        for kind in (("sb3", "replaystore") if r % 2 == 0 else ("replaystore", "sb3")):
            env["BENCH_BUFFER"] = kind
            out = subprocess.run([sys.executable, "dqn.py"], cwd=work, env=env, capture_output=True, text=True)
            line = [x for x in out.stdout.splitlines() if x.startswith("BENCH_RESULT ")]
            if out.returncode != 0 or not line:
                raise SystemExit(f"dqn.py with {kind} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
            res = json.loads(line[-1].split(" ", 1)[1])
            sps[kind].append(steps / res["seconds"])
            cpu_sps[kind].append(steps / res["cpu_seconds"])
            print(f"cleanrl dqn.py, {kind:11s}: {steps / res['seconds']:8.1f} steps/s wall, "
                  f"{steps / res['cpu_seconds']:8.1f} steps per CPU second", flush=True)
    m = {k: median(v) for k, v in sps.items()}
    c = {k: median(v) for k, v in cpu_sps.items()}
    print(f"cleanrl dqn.py {steps} steps, medians of {repeats} (source: {origin}):\n"
          f"  wall: sb3 {m['sb3']:.1f} steps/s, replaystore {m['replaystore']:.1f} steps/s, "
          f"ratio {m['replaystore'] / m['sb3']:.3f}\n"
          f"  CPU:  sb3 {c['sb3']:.1f} steps/CPU-s, replaystore {c['replaystore']:.1f} steps/CPU-s, "
          f"ratio {c['replaystore'] / c['sb3']:.3f}", flush=True)
    return {"source": origin, "steps": steps, "sps": sps, "cpu_sps": cpu_sps, "median": m, "cpu_median": c}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("micro", "cleanrl", "all"), default="all")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--adds", type=int, default=20_000)
    parser.add_argument("--cleanrl-repo", default=DEFAULT_CLEANRL_REPO)
    parser.add_argument("--cleanrl-script", default=None)
    parser.add_argument("--cleanrl-steps", type=int, default=30_000)
    parser.add_argument("--cleanrl-repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()

    import stable_baselines3
    import torch

    import replaystore

    print(f"stable-baselines3 {stable_baselines3.__version__}, replaystore {replaystore.__version__}, "
          f"numpy {np.__version__}, torch {torch.__version__}, python {sys.version.split()[0]}", flush=True)
    torch.set_num_threads(1)
    results = {}
    if args.part in ("micro", "all"):
        results["micro"] = run_micro(args.repeats, args.adds)
    if args.part in ("cleanrl", "all"):
        results["cleanrl"] = run_cleanrl(args.cleanrl_repo, args.cleanrl_script, args.cleanrl_steps,
                                         args.cleanrl_repeats)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
