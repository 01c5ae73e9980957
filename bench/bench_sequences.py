"""Sequences and n-step returns (issue #11): replaystore against its peers, one process run.

Workloads (each peer gets the same steps, in its own native form, converted before timing):

- ``seq_small``: 32 sequences x (40 burn-in + 80) steps from 1M small steps
  (obs float32[17], action float32[6], reward float32, terminated/truncated bool); the ring
  was filled with 1.1M steps, so it has wrapped and the oldest episode is partly evicted.
- ``seq_atari``: the same sample from 100k Atari-sized steps (obs uint8[84, 84], one frame).
- ``seq_atari_stack``: the same from 100k frame-stacked steps (obs/next_obs uint8[4, 84, 84],
  replaystore's ``FrameStackStorage``: each frame stored once, stacks rebuilt on gather).
- ``nstep``: n-step (n=3, gamma 0.99) sample of 256 from 1M small transitions (with next_obs).
- ``nstep_vec``: the same from 8 interleaved environments (one row per environment per write:
  replaystore streams, SB3 ``n_envs=8``; cpprb's ``Nstep`` takes one environment: not run).

Episodes have lengths drawn uniformly from [150, 1500); 90% end terminated, 10% truncated.

Peers: TorchRL ``SliceSampler`` (with ``end_key``, as its docs recommend, and with
``cache_values=True``, its static-dataset mode), rlox 1.2 ``SequenceReplayBuffer``, SB3
``NStepReplayBuffer``, cpprb ``Nstep`` (returns summed when a step is added, so its sample is a
plain gather) and plain NumPy (the limit): starts drawn from a precomputed array of valid starts
and one ``np.take`` per field, no bookkeeping at all.

Memory: RSS growth of building and filling each buffer, per stored step, beside the payload
(the bytes of the fields a user hands in per step).

Usage::

    PYTHONPATH=src nice -n 5 bench/.venv/bin/python bench/bench_sequences.py [--repeats 5]
        [--seconds 1.0] [--only seq_small,nstep] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import math
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peers import OtherCpuMeter, read_loadavg  # noqa: E402

OBS, ACT = 17, 6
BURN_IN, LENGTH, B_SEQ = 40, 80, 32
SPAN = BURN_IN + LENGTH
N_STEP, GAMMA, B_NSTEP = 3, 0.99, 256
FRAME = (84, 84)
STACK = 4
CHUNK = 1 << 15


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def rss_bytes() -> int:
    """Resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def release_free_memory() -> None:
    """Collect garbage and hand freed heap pages back (glibc), so RSS deltas count live data."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def episode_ends(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(terminated, truncated) bool arrays of ``n`` steps: episodes of 150..1499 steps."""
    rng = np.random.default_rng(seed)
    term = np.zeros(n, bool)
    trunc = np.zeros(n, bool)
    pos = -1
    while True:
        pos += int(rng.integers(150, 1500))
        if pos >= n:
            break
        if rng.random() < 0.1:
            trunc[pos] = True
        else:
            term[pos] = True
    return term, trunc


@dataclass
class Steps:
    """``n`` steps as columns (``obs`` may be produced chunk by chunk for frames)."""

    n: int
    kind: str  # "small" | "atari" | "stack"
    terminated: np.ndarray
    truncated: np.ndarray
    cols: dict[str, np.ndarray] = field(default_factory=dict)
    frames: np.ndarray | None = None  # pool of distinct frames (atari kinds)
    envs: int = 1  # row i is a step of environment i % envs (n-step workloads)

    def chunk(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """Steps ``[lo, hi)`` as a dict of arrays (frames built from the pool on the fly)."""
        out = {k: v[lo:hi] for k, v in self.cols.items()}
        if self.kind == "atari":
            out["obs"] = self.frames[np.arange(lo, hi) % len(self.frames)]
        elif self.kind == "stack":
            t = np.arange(lo, hi)
            idx = (t[:, None] + np.arange(-STACK + 1, 2)) % len(self.frames)  # S + 1 frames
            win = self.frames[idx]
            out["obs"], out["next_obs"] = win[:, :STACK], win[:, 1:]
        out["terminated"] = self.terminated[lo:hi]
        out["truncated"] = self.truncated[lo:hi]
        return out

    def chunks(self):
        """Yield ``(lo, hi, chunk)`` over all steps."""
        for lo in range(0, self.n, CHUNK):
            hi = min(lo + CHUNK, self.n)
            yield lo, hi, self.chunk(lo, hi)

    def payload_bytes_per_step(self) -> int:
        """Bytes a user hands in per step (a stack counts one new frame: the rest repeat)."""
        c = self.chunk(0, 1)
        total = 0
        for k, v in c.items():
            if self.kind == "stack" and k in ("obs", "next_obs"):
                continue
            total += v[0].nbytes
        if self.kind == "stack":
            total += int(np.prod(FRAME))
        return total


def make_steps(n: int, kind: str, seed: int = 0, next_obs: bool = False) -> Steps:
    """``n`` steps of ``kind`` with deterministic episode boundaries."""
    term, trunc = episode_ends(n, seed)
    rng = np.random.default_rng(seed + 1)
    s = Steps(n, kind, term, trunc)
    if kind == "small":
        s.cols["obs"] = rng.standard_normal((n, OBS), dtype=np.float32)
        if next_obs:
            nxt = np.empty_like(s.cols["obs"])
            nxt[:-1] = s.cols["obs"][1:]
            nxt[-1] = 0
            s.cols["next_obs"] = nxt
        s.cols["action"] = rng.standard_normal((n, ACT), dtype=np.float32)
    else:
        s.frames = rng.integers(0, 256, (4096, *FRAME), dtype=np.uint8)
        s.cols["action"] = rng.integers(0, 18, n).astype(np.int64)
    s.cols["reward"] = rng.standard_normal(n, dtype=np.float32)
    return s


def valid_starts(term: np.ndarray, trunc: np.ndarray, first: int, span: int) -> np.ndarray:
    """Positions ``p >= first`` whose ``span`` steps stay inside one episode (linear layout)."""
    end = term | trunc
    n = len(end)
    # steps to the end of the episode (inclusive), from each position
    ends = np.flatnonzero(end)
    nxt = np.searchsorted(ends, np.arange(n))
    last = np.where(nxt < len(ends), ends[np.minimum(nxt, len(ends) - 1)], n - 1)
    ok = (last - np.arange(n) + 1) >= span
    ok[:first] = False
    return np.flatnonzero(ok)


# --------------------------------------------------------------------------------------------
# Implementations: build(steps, capacity) -> sample callable
# --------------------------------------------------------------------------------------------


class Skip(Exception):
    """The peer has no such feature (the reason is reported)."""


def _replaystore_table(capacity: int, kind: str, next_obs: bool):
    import replaystore as rs

    kw: dict[str, Any] = {}
    if kind == "stack":
        kw["storage"] = rs.FrameStackStorage(capacity, end_keys=("terminated", "truncated"))
    episodes = rs.Episodes(next_obs_field="next_obs" if next_obs else None)
    return rs.Table(capacity, sampler=rs.Uniform(), remover=rs.Fifo(), episodes=episodes, seed=0, **kw)


def build_replaystore_seq(steps: Steps, capacity: int) -> Callable[[], Any]:
    t = _replaystore_table(capacity, steps.kind, next_obs=steps.kind == "stack")
    for _lo, _hi, c in steps.chunks():
        if steps.kind == "stack":  # FrameStackStorage reads the episode ends from the items too
            term, trunc = c["terminated"], c["truncated"]
        else:
            term, trunc = c.pop("terminated"), c.pop("truncated")
        t.extend_steps(c, streams=0, terminated=term, truncated=trunc)

    def sample() -> Any:
        return t.sample_sequences(B_SEQ, LENGTH, burn_in=BURN_IN).data

    return sample


def build_numpy_seq(steps: Steps, capacity: int) -> Callable[[], Any]:
    """The limit: the newest ``capacity`` steps laid out linearly, valid starts precomputed."""
    first = steps.n - capacity
    cols: dict[str, np.ndarray] = {}
    frames = None
    for lo, hi, c in steps.chunks():
        if hi <= first:
            continue
        a = max(lo, first) - lo
        for k, v in c.items():
            if steps.kind == "stack" and k in ("obs", "next_obs"):
                continue
            if k not in cols:
                cols[k] = np.empty((capacity, *v.shape[1:]), v.dtype)
            cols[k][max(lo, first) - first : hi - first] = v[a:]
        if steps.kind == "stack":  # frame j + S - 1 is step j's newest obs frame
            if frames is None:
                frames = np.empty((capacity + STACK, *FRAME), np.uint8)
            frames[max(lo, first) - first + STACK - 1 : hi - first + STACK - 1] = c["obs"][a:, -1]
            if lo <= first < hi:
                frames[: STACK - 1] = c["obs"][a, : STACK - 1]
            if hi == steps.n:
                frames[-1] = c["next_obs"][-1, -1]
    starts = valid_starts(steps.terminated[first:], steps.truncated[first:], 0, SPAN)
    rng = np.random.default_rng(0)
    offs = np.arange(SPAN)
    win = np.arange(STACK + 1)
    out: dict[str, np.ndarray] = {}

    def sample() -> Any:
        s = starts[rng.integers(0, len(starts), B_SEQ)]
        idx = s[:, None] + offs
        flat = idx.ravel()  # a flat index gathers large rows faster than a (B, T) one
        for k, col in cols.items():
            o = out.get(k)
            if o is None:
                o = out[k] = np.empty((flat.size, *col.shape[1:]), col.dtype)
            np.take(col, flat, axis=0, out=o, mode="clip")  # mode="raise" would buffer `out`
            out[k + "/view"] = o.reshape(*idx.shape, *col.shape[1:])
        if frames is not None:  # stacks of S + 1 frames; obs / next_obs are views of them
            g = np.take(frames, (idx[..., None] + win).ravel(), axis=0).reshape(*idx.shape, STACK + 1, *FRAME)
            out["obs"], out["next_obs"] = g[:, :, :STACK], g[:, :, 1:]
        return out

    return sample


def build_rlox_seq(steps: Steps, capacity: int) -> Callable[[], Any]:
    if steps.kind != "small":
        raise Skip("float32 vectors only, and it stores next_obs too: 100k frames would take 5.6 GB")
    import rlox

    rb = rlox.SequenceReplayBuffer(capacity, OBS, ACT)
    obs, act, rew = steps.cols["obs"], steps.cols["action"], steps.cols["reward"]
    term, trunc = steps.terminated, steps.truncated
    nxt = np.empty_like(obs)
    nxt[:-1] = obs[1:]
    nxt[-1] = 0
    push = rb.push
    for i in range(steps.n):  # no batch push in SequenceReplayBuffer
        push(obs[i], nxt[i], act[i], float(rew[i]), bool(term[i]), bool(trunc[i]))
    state = {"seed": 0}

    def sample() -> Any:
        state["seed"] += 1
        return rb.sample_sequences(B_SEQ, SPAN, state["seed"])

    return sample


def _torchrl_seq(steps: Steps, capacity: int, cache: bool) -> Callable[[], Any]:
    if steps.kind == "stack":
        raise Skip("no frame dedup in the storage (CatFrames is a transform); see seq_atari")
    import logging

    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers.samplers import SliceSampler

    logging.getLogger("torchrl").setLevel(logging.WARNING)
    torch.manual_seed(0)
    sampler = SliceSampler(slice_len=SPAN, end_key=("next", "done"), strict_length=True,
                           cache_values=cache)
    rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=B_SEQ * SPAN)
    for lo, hi, c in steps.chunks():
        term = torch.from_numpy(c.pop("terminated"))
        trunc = torch.from_numpy(c.pop("truncated"))
        td = TensorDict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in c.items()},
                        batch_size=[hi - lo])
        td["next"] = TensorDict({"done": term | trunc, "terminated": term, "truncated": trunc},
                                batch_size=[hi - lo])
        rb.extend(td)

    def sample() -> Any:
        return rb.sample().reshape(B_SEQ, SPAN)

    return sample


def build_torchrl_seq(steps: Steps, capacity: int) -> Callable[[], Any]:
    return _torchrl_seq(steps, capacity, cache=False)


def build_torchrl_cached_seq(steps: Steps, capacity: int) -> Callable[[], Any]:
    return _torchrl_seq(steps, capacity, cache=True)


# ---- n-step ---------------------------------------------------------------------------------


def build_replaystore_nstep(steps: Steps, capacity: int) -> Callable[[], Any]:
    t = _replaystore_table(capacity, "small", next_obs=True)
    for lo, hi, c in steps.chunks():
        term, trunc = c.pop("terminated"), c.pop("truncated")
        streams = np.arange(lo, hi) % steps.envs if steps.envs > 1 else 0
        t.extend_steps(c, streams=streams, terminated=term, truncated=trunc)

    def sample() -> Any:
        return t.sample_nstep(B_NSTEP, N_STEP, GAMMA)

    return sample


def build_sb3_nstep(steps: Steps, capacity: int) -> Callable[[], Any]:
    from gymnasium import spaces
    from stable_baselines3.common.buffers import NStepReplayBuffer

    obs_space = spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
    act_space = spaces.Box(-1.0, 1.0, (ACT,), np.float32)
    np.random.seed(0)
    e = steps.envs
    rb = NStepReplayBuffer(capacity, obs_space, act_space, device="cpu", n_envs=e,
                           n_steps=N_STEP, gamma=GAMMA)
    # Setup only (untimed): write its arrays directly, as add() would have (the last `capacity`
    # rows; row i is environment i % e).
    first = steps.n - capacity
    assert first % e == 0 and capacity % e == 0
    sl = slice(first, steps.n)

    def per_env(a: np.ndarray) -> np.ndarray:
        return a[sl].reshape(capacity // e, e, *a.shape[1:])

    rb.observations[:] = per_env(steps.cols["obs"])
    rb.next_observations[:] = per_env(steps.cols["next_obs"])
    rb.actions[:] = per_env(steps.cols["action"])
    rb.rewards[:] = per_env(steps.cols["reward"])
    rb.dones[:] = per_env(steps.terminated | steps.truncated)
    rb.timeouts[:] = per_env(steps.truncated)
    rb.pos, rb.full = 0, True

    def sample() -> Any:
        return rb.sample(B_NSTEP)

    return sample


def build_cpprb_nstep(steps: Steps, capacity: int) -> Callable[[], Any]:
    if steps.envs > 1:
        raise Skip("cpprb's Nstep sums returns over consecutive adds of one environment")
    import cpprb

    env = {"obs": {"shape": OBS}, "action": {"shape": ACT}, "reward": {}, "next_obs": {"shape": OBS},
           "done": {}}
    rb = cpprb.ReplayBuffer(capacity, env,
                            Nstep={"size": N_STEP, "gamma": GAMMA, "rew": "reward", "next": "next_obs"})
    ends = np.flatnonzero(steps.terminated | steps.truncated)
    lo = 0
    for e in [*ends.tolist(), steps.n - 1]:  # one add per episode, then on_episode_end
        sl = slice(lo, e + 1)
        # cpprb has no truncation flag: done=1 only at termination; truncation just ends the episode
        rb.add(obs=steps.cols["obs"][sl], action=steps.cols["action"][sl], reward=steps.cols["reward"][sl],
               next_obs=steps.cols["next_obs"][sl], done=steps.terminated[sl].astype(np.float32))
        rb.on_episode_end()
        lo = e + 1

    def sample() -> Any:
        return rb.sample(B_NSTEP)

    return sample


def build_numpy_nstep(steps: Steps, capacity: int) -> Callable[[], Any]:
    """The limit: gather rewards/flags of n rows, discounted sum, bootstrap row; linear layout."""
    first = steps.n - capacity
    cols = {k: np.array(v[first:]) for k, v in steps.cols.items()}  # own copies
    term = steps.terminated[first:].copy()
    end = term | steps.truncated[first:]
    end[-steps.envs:] = True  # the newest step of each environment: nothing after it
    rng = np.random.default_rng(0)
    offs = np.arange(N_STEP)
    disc = GAMMA ** offs
    stride = offs * steps.envs  # rows of one environment are envs apart

    def sample() -> dict[str, np.ndarray]:
        idx = rng.integers(0, capacity, B_NSTEP)
        rows = np.minimum(idx[:, None] + stride, capacity - 1)
        e = end[rows]
        stop = np.where(e.any(1), e.argmax(1), N_STEP - 1)  # last step used
        mask = offs <= stop[:, None]
        ret = (cols["reward"][rows] * disc * mask).sum(1)
        last = idx + stop * steps.envs
        done = term[last]
        out = {k: np.take(v, idx, axis=0) for k, v in cols.items() if k != "next_obs"}
        out["returns"] = ret
        out["next_obs"] = np.take(cols["next_obs"], last, axis=0)
        out["discount"] = np.where(done, 0.0, GAMMA ** (stop + 1))
        out["done"] = done
        return out

    return sample


# --------------------------------------------------------------------------------------------
# Harness
# --------------------------------------------------------------------------------------------


@dataclass
class Impl:
    name: str
    dist: str
    build: Callable[[Steps, int], Callable[[], Any]]
    note: str = ""


@dataclass
class Row:
    impl: Impl
    status: str = "ok"
    reason: str = ""
    version: str = ""
    mem_bytes: int = 0
    setup_s: float = 0.0
    us: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)

    @property
    def median_us(self) -> float:
        return statistics.median(self.us) if self.us else math.nan

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu_us) if self.cpu_us else math.nan


def version_of(dist: str) -> str:
    """Installed version of ``dist`` ('' when unknown)."""
    from importlib.metadata import PackageNotFoundError, version

    if dist == "numpy":
        return np.__version__
    try:
        return version(dist)
    except PackageNotFoundError:
        try:
            return str(getattr(importlib.import_module(dist), "__version__", ""))
        except Exception:  # noqa: BLE001
            return ""


def time_call(fn: Callable[[], Any], seconds: float) -> tuple[float, float]:
    """Mean (wall µs, CPU µs) per call of ``fn`` over ``seconds`` of wall time (at least 3 calls).

    CPU time (``time.process_time``: this process, all its threads) is what a call costs; on a
    machine shared with other jobs it is far steadier than the wall time, which includes waiting.
    """
    n = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while True:
        fn()
        n += 1
        el = time.perf_counter() - t0
        if el >= seconds and n >= 3:
            return el / n * 1e6, (time.process_time() - c0) / n * 1e6


def run(name: str, desc: str, steps: Steps, capacity: int, impls: list[Impl], repeats: int,
        seconds: float) -> list[Row]:
    """Build every implementation (memory measured), then time them interleaved, ``repeats`` rounds."""
    print(f"\n## {name}: {desc}", flush=True)
    rows: list[Row] = []
    live: list[tuple[Row, Callable[[], Any]]] = []
    keep: list[Any] = []
    for impl in impls:
        row = Row(impl, version=version_of(impl.dist))
        rows.append(row)
        release_free_memory()
        before = rss_bytes()
        t0 = time.perf_counter()
        try:
            fn = impl.build(steps, capacity)
            release_free_memory()
            row.mem_bytes = rss_bytes() - before  # before the first sample: storage only
            fn()  # warm up (and materialise lazy parts)
        except Skip as exc:
            row.status, row.reason = "skipped", str(exc)
            print(f"  {impl.name}: skipped ({exc})", flush=True)
            continue
        except Exception as exc:  # noqa: BLE001 - a broken peer must not stop the run
            row.status, row.reason = "error", f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            print(f"  {impl.name}: ERROR {row.reason}", flush=True)
            traceback.print_exc(limit=4)
            continue
        row.setup_s = time.perf_counter() - t0
        keep.append(fn)
        live.append((row, fn))
        print(f"  {impl.name}: ready in {row.setup_s:.1f}s, +{row.mem_bytes / 1e6:.0f} MB", flush=True)
    meter = OtherCpuMeter()
    load0 = read_loadavg()[0]
    for r in range(repeats):
        order = live[r % len(live):] + live[: r % len(live)] if live else []
        for row, fn in order:
            gc.collect()
            try:
                wall, cpu = time_call(fn, seconds)
                row.us.append(wall)
                row.cpu_us.append(cpu)
            except Exception as exc:  # noqa: BLE001
                row.status, row.reason = "error", f"{type(exc).__name__}: {exc}"[:200]
        live = [(row, fn) for row, fn in live if row.status == "ok"]
    other = meter.stop()
    report(name, desc, steps, capacity, rows, repeats, seconds, other, load0)
    keep.clear()
    gc.collect()
    return rows


def report(name: str, desc: str, steps: Steps, capacity: int, rows: list[Row], repeats: int,
           seconds: float, other: float, load0: float) -> None:
    """Print the Markdown table of one workload."""
    payload = steps.payload_bytes_per_step()
    ref = next((r for r in rows if r.impl.name.startswith("numpy") and r.status == "ok"), None)
    subj = next((r for r in rows if r.impl.name == "replaystore" and r.status == "ok"), None)
    print(f"\n### {name}\n\n{desc}. Median of {repeats} interleaved rounds of {seconds:g}s; other "
          f"processes kept {other:.2f} CPUs busy; 1-min load {load0:.2f} at the start. Payload "
          f"{payload} B/step.\n")
    print("| implementation | version | CPU µs/sample | replaystore speed-up (CPU) | vs NumPy limit (CPU) "
          "| wall µs/sample (min-max) | speed-up (wall) | memory MB | bytes/step | / payload | notes |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if r.status != "ok":
            print(f"| {r.impl.name} | {r.version} | - | - | - | - | - | - | - | - | {r.status}: {r.reason} |")
            continue
        c, m = r.median_cpu, r.median_us
        speed = "" if r is subj or subj is None else f"{c / subj.median_cpu:.2f}x"
        speed_w = "" if r is subj or subj is None else f"{m / subj.median_us:.2f}x"
        vs = f"{c / ref.median_cpu:.2f}x" if ref else "-"
        per = r.mem_bytes / capacity
        spread = f"{min(r.us):,.0f}-{max(r.us):,.0f}"
        print(f"| {r.impl.name} | {r.version} | {c:,.0f} | {speed} | {vs} | {m:,.0f} ({spread}) "
              f"| {speed_w} | {r.mem_bytes / 1e6:,.0f} | {per:,.0f} | {per / payload:.2f}x | {r.impl.note} |")
    print("\n`replaystore speed-up` = this peer's time / replaystore's (> 1: replaystore is faster); "
          "`vs NumPy limit` = time / the plain NumPy gather's. CPU time = this process's CPU seconds per "
          "call (steady on a shared machine); wall time includes waiting for a core.", flush=True)


SEQ_IMPLS = [
    Impl("replaystore", "replaystore", build_replaystore_seq, "sample_sequences(32, 80, burn_in=40), strict"),
    Impl("torchrl SliceSampler", "torchrl", build_torchrl_seq, "end_key=('next','done'), strict_length"),
    Impl("torchrl SliceSampler cached", "torchrl", build_torchrl_cached_seq,
         "cache_values=True (static-data mode)"),
    Impl("rlox SequenceReplayBuffer", "rlox", build_rlox_seq, "sample_sequences(32, 120, seed)"),
    Impl("numpy (limit)", "numpy", build_numpy_seq, "precomputed valid starts + np.take"),
]
NSTEP_IMPLS = [
    Impl("replaystore", "replaystore", build_replaystore_nstep, "sample_nstep(256, 3, 0.99)"),
    Impl("sb3 NStepReplayBuffer", "stable-baselines3", build_sb3_nstep, "sample(256), torch output"),
    Impl("cpprb Nstep", "cpprb", build_cpprb_nstep, "returns summed at add time; sample is a gather"),
    Impl("numpy (limit)", "numpy", build_numpy_nstep, "gather n rows + discounted sum"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--only", default="", help="comma-separated workloads")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink sizes (quick checks)")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch intra-op threads (1: on a loaded 2-core machine 2 threads made "
                    "TorchRL's gathers ~30x slower through contention)")
    args = ap.parse_args()
    try:
        import torch

        torch.set_num_threads(args.torch_threads)
    except ImportError:
        pass
    only = set(filter(None, args.only.split(",")))
    print(f"python {platform.python_version()}, numpy {np.__version__}, "
          + ", ".join(f"{d} {version_of(d) or '-'}" for d in
                      ("replaystore", "torch", "torchrl", "tensordict", "rlox", "cpprb", "stable-baselines3")))
    print(f"1-min load {read_loadavg()[0]:.2f}; {len(__import__('os').sched_getaffinity(0))} CPUs; "
          f"torch threads {args.torch_threads}")
    big = int(1_000_000 * args.scale)
    atari = int(100_000 * args.scale)

    def want(n: str) -> bool:
        return not only or n in only

    if want("seq_small"):
        s = make_steps(big + big // 10, "small")
        run("seq_small", f"32 x (40 + 80) steps from {big:,} small steps (ring wrapped)", s, big,
            SEQ_IMPLS, args.repeats, args.seconds)
        del s
    if want("seq_atari"):
        s = make_steps(atari + atari // 10, "atari")
        run("seq_atari", f"32 x (40 + 80) steps from {atari:,} steps of uint8[84, 84] frames", s, atari,
            SEQ_IMPLS, args.repeats, args.seconds)
        del s
    if want("seq_atari_stack"):
        s = make_steps(atari + atari // 10, "stack")
        run("seq_atari_stack", f"32 x (40 + 80) steps from {atari:,} steps of uint8[4, 84, 84] stacks "
            "(obs and next_obs)", s, atari, SEQ_IMPLS, args.repeats, args.seconds)
        del s
    if want("nstep") or want("nstep_vec"):
        s = make_steps(big + big // 10, "small", next_obs=True)
        if want("nstep"):
            run("nstep", f"n-step (n=3, gamma 0.99) sample of 256 from {big:,} small transitions", s, big,
                NSTEP_IMPLS, args.repeats, args.seconds)
        if want("nstep_vec"):
            s.envs = 8
            run("nstep_vec", f"n-step (n=3, gamma 0.99) sample of 256 from {big:,} small transitions of 8 "
                "interleaved environments", s, big, NSTEP_IMPLS, args.repeats, args.seconds)
    print("done")


if __name__ == "__main__":
    main()
