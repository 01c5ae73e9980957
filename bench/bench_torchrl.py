"""TorchRL 0.14.1's replay buffers with their own samplers and with replaystore's, through TorchRL's API.

Workloads (medians of ``--repeats`` timed calls after warm-up; wall time and CPU time of this
process, ``time.process_time``; torch uses one thread):

- ``uniform``: ``TensorDictReplayBuffer(LazyTensorStorage(1M), RandomSampler)``, ``sample()`` of 256
  CartPole-sized transitions (obs float32[4], action, reward, next obs, done), with TorchRL's
  storage and with ``replaystore.integrations.torchrl.LazyTensorStorage`` (TorchRL's sampler is
  ``torch.randint``: nothing to replace), and a replaystore ``Table.sample(256)`` of the same
  fields as tensors for reference.
- ``per``: ``TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, LazyTensorStorage(1M))``,
  ``sample()`` of 256 + ``update_tensordict_priority``: TorchRL's (its C++ sum tree; the wheel's
  extension does not load with torch 2.13: rebuild it with ``shared/tools/build_torchrl_ext.py``,
  else the row says "unavailable") and ``replaystore.integrations.torchrl``'s, with TorchRL's
  ``LazyTensorStorage`` and with replaystore's.
- ``configs``: the same two workloads (uniform ``sample()`` of 256; PER ``sample()`` of 256 +
  priority update) in the configurations TorchRL users run: CartPole transitions in
  ``LazyTensorStorage(1M)`` / ``LazyMemmapStorage(1M)``, a tuple of tensors through the generic
  ``ReplayBuffer``, nested multi-agent keys (``("agents", ...)`` with a batch dim of 3 agents),
  Atari frames (uint8 ``[4, 84, 84]`` pixels and next pixels, ``--pixel-size`` transitions in
  RAM), and ``ListStorage(1M)`` of single-step TensorDicts. Each row: TorchRL's own class vs
  replaystore's class of the same name (``replaystore.integrations.torchrl``: one import), both
  on the SAME storage object (filled once). ``--part profile`` splits TorchRL's CartPole steps
  into its sampler, its storage read and the rest (its Python around them).
- ``slice``: ``TensorDictReplayBuffer(storage, SliceSampler(num_slices=8, traj_key="episode"))``,
  ``sample(256)`` (8 slices of 32) in a collect-and-train loop: each timed sample follows an
  ``extend`` of 1,000 new steps (episodes of ``--episode-len`` steps), at each ``--sizes`` stored
  steps (``LazyTensorStorage`` up to 1M, ``LazyMemmapStorage`` in ``--memmap-dir`` above).
  TorchRL's ``SliceSampler`` vs replaystore's (same boundaries, incremental index).
- ``extend``: ``extend`` of 1 and 256 CartPole transitions into a filled ``LazyTensorStorage(1M)``,
  TorchRL's ``TensorDictReplayBuffer`` / ``TensorDictPrioritizedReplayBuffer`` vs ours (each on its
  own storage: an extend writes).

Usage::

    PYTHONPATH=src nice -n 10 python bench/bench_torchrl.py [--part uniform,per,slice] \\
        [--sizes 1000000,10000000,100000000] [--memmap-dir /tmp/rs-torchrl-bench] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("RL_WARNINGS", "0")
torch.set_num_threads(1)
logging.getLogger("torchrl").setLevel(logging.WARNING)

from tensordict import TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyMemmapStorage,
    LazyTensorStorage,
    ListStorage,
    PrioritizedReplayBuffer,
    RandomSampler,
    ReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.samplers import SliceSampler as RLSliceSampler  # noqa: E402

from replaystore import Table  # noqa: E402
from replaystore.integrations import torchrl as rs_torchrl  # noqa: E402


def _timed(fn, repeats: int, warmup: int = 5) -> dict:
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    return {"wall_ms": statistics.median(wall) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3, "n": repeats}


def _transitions(n: int, start: int = 0, episode_len: int = 500) -> TensorDict:
    steps = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": torch.randn(n, 4),
            "action": torch.randint(0, 2, (n,)),
            "reward": torch.ones(n),
            "episode": steps // episode_len,
            "next": {"obs": torch.randn(n, 4), "done": ((steps + 1) % episode_len == 0).unsqueeze(-1)},
        },
        batch_size=[n],
    )


def _fill(rb, size: int, episode_len: int, chunk: int = 1 << 20) -> None:
    for start in range(0, size, chunk):
        rb.extend(_transitions(min(chunk, size - start), start, episode_len))


def bench_uniform(repeats: int) -> list[dict]:
    """TorchRL's uniform sample of 256 from 1M (and a replaystore Table for scale)."""
    n = 1 << 20
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(n), sampler=RandomSampler(), batch_size=256)
    _fill(rb, n, 500)
    ours = TensorDictReplayBuffer(storage=rs_torchrl.LazyTensorStorage(n), sampler=RandomSampler(), batch_size=256)
    _fill(ours, n, 500)
    rows = [{"workload": "uniform 256 of 1M", "impl": "torchrl RandomSampler", **_timed(rb.sample, repeats)}]
    rows.append(
        {
            "workload": "uniform 256 of 1M",
            "impl": "torchrl RandomSampler + replaystore LazyTensorStorage",
            **_timed(ours.sample, repeats),
        }
    )
    table = Table(n)
    data = _transitions(n)
    table.extend(
        {
            "obs": data["obs"].numpy(),
            "action": data["action"].numpy(),
            "reward": data["reward"].numpy(),
            "next_obs": data["next", "obs"].numpy(),
            "done": data["next", "done"].numpy(),
        }
    )
    rows.append(
        {
            "workload": "uniform 256 of 1M",
            "impl": "replaystore Table.sample(as_tensor=True)",
            **_timed(lambda: table.sample(256, as_tensor=True), repeats),
        }
    )
    return rows


def _per_available() -> str | None:
    try:
        import torchrl._torchrl  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure: the wheel's extension
        return f"unavailable ({type(exc).__name__}: rebuild with shared/tools/build_torchrl_ext.py)"
    return None


def bench_per(repeats: int) -> list[dict]:
    """PER sample 256 + priority update at 1M, TorchRL's sampler vs replaystore's."""
    n = 1 << 20
    rows = []
    for impl, cls, storage in (
        ("torchrl PrioritizedSampler", TensorDictPrioritizedReplayBuffer, LazyTensorStorage),
        ("replaystore PrioritizedSampler", rs_torchrl.TensorDictPrioritizedReplayBuffer, LazyTensorStorage),
        (
            "replaystore PrioritizedSampler + LazyTensorStorage",
            rs_torchrl.TensorDictPrioritizedReplayBuffer,
            rs_torchrl.LazyTensorStorage,
        ),
    ):
        if cls is TensorDictPrioritizedReplayBuffer and _per_available():
            rows.append({"workload": "PER 256 of 1M, sample+update", "impl": impl, "note": _per_available()})
            continue
        rb = cls(alpha=0.6, beta=0.4, storage=storage(n), batch_size=256)
        _fill(rb, n, 500)
        gen = torch.Generator().manual_seed(0)

        def step(rb=rb, gen=gen):
            s = rb.sample()
            s["td_error"] = torch.rand(256, generator=gen)
            rb.update_tensordict_priority(s)

        rows.append({"workload": "PER 256 of 1M, sample+update", "impl": impl, **_timed(step, repeats)})
    return rows


def bench_slice(sizes: list[int], repeats: int, memmap_dir: Path, episode_len: int) -> list[dict]:
    """Slice sampling (8 x 32) after each extend of 1,000 steps, at each stored size."""
    rows = []
    for size in sizes:
        for impl, cls in (
            ("torchrl SliceSampler", RLSliceSampler),
            ("replaystore SliceSampler", rs_torchrl.SliceSampler),
        ):
            if size <= 1 << 20:
                storage, kind = LazyTensorStorage(size), "RAM"
            else:
                path = memmap_dir / f"{impl.split()[0]}-{size}"
                shutil.rmtree(path, ignore_errors=True)
                storage, kind = LazyMemmapStorage(size, scratch_dir=str(path)), "memmap"
            rb = TensorDictReplayBuffer(
                storage=storage, sampler=cls(num_slices=8, traj_key="episode", end_key=None), batch_size=256
            )
            t0 = time.perf_counter()
            _fill(rb, size, episode_len)
            fill_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            rb.sample()  # the first sample reads the whole column (both samplers)
            first_s = time.perf_counter() - t0
            written = [size]

            def step(rb=rb, written=written):
                rb.extend(_transitions(1000, written[0], episode_len))
                written[0] += 1000
                rb.sample()

            def extend_only(rb=rb, written=written):
                rb.extend(_transitions(1000, written[0], episode_len))
                written[0] += 1000

            reps = repeats if (cls is not RLSliceSampler or size <= 10_000_000) else max(3, repeats // 10)
            loop = _timed(step, reps, warmup=2)
            ext = _timed(extend_only, reps, warmup=1)
            rows.append(
                {
                    "workload": f"slice 8x32 after extend(1000), {size:,} stored ({kind})",
                    "impl": impl,
                    "wall_ms": loop["wall_ms"] - ext["wall_ms"],
                    "cpu_ms": loop["cpu_ms"] - ext["cpu_ms"],
                    "loop_wall_ms": loop["wall_ms"],
                    "extend_wall_ms": ext["wall_ms"],
                    "n": reps,
                    "first_sample_s": round(first_s, 3),
                    "fill_s": round(fill_s, 1),
                }
            )
            print(rows[-1], flush=True)
            del rb, storage
            if kind == "memmap":
                shutil.rmtree(path, ignore_errors=True)
    return rows


def _cartpole(n: int, start: int = 0) -> TensorDict:
    return _transitions(n, start, 500).exclude("episode")


def _multiagent(n: int) -> TensorDict:
    agents = TensorDict(
        {"obs": torch.randn(n, 3, 16), "action": torch.randint(0, 5, (n, 3)), "reward": torch.randn(n, 3, 1)},
        batch_size=[n, 3],
    )
    nxt = TensorDict({"obs": torch.randn(n, 3, 16), "reward": torch.randn(n, 3, 1)}, batch_size=[n, 3])
    return TensorDict(
        {"agents": agents, "next": {"agents": nxt, "done": torch.zeros(n, 1, dtype=torch.bool)}}, batch_size=[n]
    )


def _pixels(n: int) -> TensorDict:
    return TensorDict(
        {
            "pixels": torch.randint(0, 255, (n, 4, 84, 84), dtype=torch.uint8),
            "action": torch.randint(0, 6, (n,)),
            "reward": torch.randn(n),
            "next": {
                "pixels": torch.randint(0, 255, (n, 4, 84, 84), dtype=torch.uint8),
                "done": torch.zeros(n, 1, dtype=torch.bool),
            },
        },
        batch_size=[n],
    )


def _fill_chunks(rb, make, n: int, chunk: int = 1 << 16) -> None:
    for start in range(0, n, chunk):
        rb.extend(make(min(chunk, n - start)))


def _config_rows(name: str, make_storage, fill, repeats: int, per: bool) -> list[dict]:
    """TorchRL's buffer vs ours on one storage object: uniform sample, then (``per``) prioritized step."""
    rows = []
    storage = make_storage()
    generic = name.startswith(("tuple", "ListStorage"))  # (TorchRL's generic ReplayBuffer classes)
    pairs = [("uniform", ReplayBuffer, rs_torchrl.ReplayBuffer)] if generic else []
    pairs = pairs or [("uniform", TensorDictReplayBuffer, rs_torchrl.TensorDictReplayBuffer)]
    filled = False
    for kind, rl_cls, rs_cls in pairs:
        for impl, cls in (("torchrl", rl_cls), ("replaystore", rs_cls)):
            rb = cls(storage=storage, batch_size=256)
            if not filled:
                fill(rb)
                filled = True
            rows.append(
                {"workload": f"{kind} 256: {name}", "impl": f"{impl} {cls.__name__}", **_timed(rb.sample, repeats)}
            )
            print(rows[-1], flush=True)
    if not per:
        return rows
    per_pairs = (
        (PrioritizedReplayBuffer, rs_torchrl.PrioritizedReplayBuffer)
        if generic
        else (TensorDictPrioritizedReplayBuffer, rs_torchrl.TensorDictPrioritizedReplayBuffer)
    )
    for impl, cls in zip(("torchrl", "replaystore"), per_pairs):
        if impl == "torchrl" and _per_available():
            rows.append({"workload": f"PER 256: {name}", "impl": f"{impl} {cls.__name__}", "note": _per_available()})
            continue
        rb = cls(alpha=0.6, beta=0.4, storage=storage, batch_size=256)
        everything = torch.arange(len(storage))
        rb.update_priority(everything, torch.ones(len(storage)))  # (the storage is already full)
        gen = torch.Generator().manual_seed(0)
        if cls in (PrioritizedReplayBuffer, rs_torchrl.PrioritizedReplayBuffer):

            def step(rb=rb, gen=gen):
                _, info = rb.sample(return_info=True)
                rb.update_priority(info["index"], torch.rand(256, generator=gen))

        else:

            def step(rb=rb, gen=gen):
                s = rb.sample()
                s["td_error"] = torch.rand(256, generator=gen)
                rb.update_tensordict_priority(s)

        rows.append({"workload": f"PER 256: {name}", "impl": f"{impl} {cls.__name__}", **_timed(step, repeats)})
        print(rows[-1], flush=True)
    return rows


def bench_configs(repeats: int, memmap_dir: Path, pixel_size: int) -> list[dict]:
    """Uniform and PER steps in TorchRL users' configurations, TorchRL's classes vs ours (same storage)."""
    n = 1 << 20
    tuple_data = (torch.randn(n, 4), torch.randint(0, 2, (n,)), torch.ones(n), torch.randn(n, 4), torch.zeros(n, 1))
    mm = memmap_dir / "configs-memmap"
    shutil.rmtree(mm, ignore_errors=True)
    configs = [
        ("CartPole, LazyTensorStorage(1M)", lambda: LazyTensorStorage(n), lambda rb: _fill_chunks(rb, _cartpole, n)),
        (
            "tuple of tensors, ReplayBuffer(LazyTensorStorage(1M))",
            lambda: LazyTensorStorage(n),
            lambda rb: rb.extend(tuple_data),
        ),
        (
            "CartPole, LazyMemmapStorage(1M)",
            lambda: LazyMemmapStorage(n, scratch_dir=str(mm)),
            lambda rb: _fill_chunks(rb, _cartpole, n),
        ),
        (
            "multi-agent nested keys (3 agents), LazyTensorStorage(1M)",
            lambda: LazyTensorStorage(n),
            lambda rb: _fill_chunks(rb, _multiagent, n),
        ),
        (
            f"Atari pixels uint8 [4,84,84] + next, LazyTensorStorage({pixel_size:,})",
            lambda: LazyTensorStorage(pixel_size),
            lambda rb: _fill_chunks(rb, _pixels, pixel_size, 5000),
        ),
        (
            "ListStorage(1M) of single-step TensorDicts",
            lambda: ListStorage(n),
            lambda rb: rb.extend(list(_cartpole(n).unbind(0))),
        ),
    ]
    rows = []
    for name, make_storage, fill in configs:
        rows += _config_rows(
            name, make_storage, fill, repeats if "Atari" not in name else max(20, repeats // 5), per=True
        )
    shutil.rmtree(mm, ignore_errors=True)
    return rows


def bench_profile(repeats: int) -> list[dict]:
    """TorchRL's CartPole steps (1M) split: its sampler's call, its storage read, and its Python around them."""
    n = 1 << 20
    rows = []
    storage = LazyTensorStorage(n)
    rb = TensorDictReplayBuffer(storage=storage, batch_size=256)
    _fill_chunks(rb, _cartpole, n)
    idx = torch.randint(0, n, (256,))
    parts = {
        "whole sample()": rb.sample,
        "RandomSampler.sample": lambda: rb.sampler.sample(storage, 256),
        "storage.get(index)": lambda: storage.get(idx),
        "replaystore TensorDictReplayBuffer.sample": rs_torchrl.TensorDictReplayBuffer(
            storage=storage, batch_size=256
        ).sample,
    }
    if not _per_available():
        prb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=storage, batch_size=256)
        prb.update_priority(torch.arange(n), torch.ones(n))
        sample = prb.sample()
        sample["td_error"] = torch.rand(256)
        prio = torch.rand(256)

        def per_step():
            s = prb.sample()
            s["td_error"] = prio
            prb.update_tensordict_priority(s)

        parts.update(
            {
                "PER: whole sample() + update_tensordict_priority": per_step,
                "PER: PrioritizedSampler.sample": lambda: prb.sampler.sample(storage, 256),
                "PER: storage.get(index)": lambda: storage.get(idx),
                "PER: PrioritizedSampler.update_priority": lambda: prb.sampler.update_priority(idx, prio),
                "PER: update_tensordict_priority": lambda: prb.update_tensordict_priority(sample),
            }
        )
    # ours, split the same way (the step's sample and update; the sampler's draw alone)
    ours = rs_torchrl.TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=storage, batch_size=256)
    ours.update_priority(torch.arange(n), torch.ones(n))
    ours_sample = ours.sample()
    ours_sample["td_error"] = torch.rand(256)
    ours_prio = torch.rand(256)

    def ours_step():
        s = ours.sample()
        s["td_error"] = ours_prio
        ours.update_tensordict_priority(s)

    parts.update(
        {
            "replaystore PER: whole sample() + update_tensordict_priority": ours_step,
            "replaystore PER: sample()": ours.sample,
            "replaystore PER: PrioritizedSampler.sample": lambda: ours.sampler.sample(storage, 256),
            "replaystore PER: update_tensordict_priority": lambda: ours.update_tensordict_priority(ours_sample),
        }
    )
    for name, fn in parts.items():
        rows.append({"workload": "profile, CartPole 1M, 256", "impl": name, **_timed(fn, repeats)})
        print(rows[-1], flush=True)
    return rows


def bench_extend(repeats: int) -> list[dict]:
    """``extend`` of CartPole batches into a filled 1M storage: TorchRL's buffers vs ours (each its own storage)."""
    n = 1 << 20
    rows = []
    pairs = (
        ("TensorDictReplayBuffer", TensorDictReplayBuffer, rs_torchrl.TensorDictReplayBuffer, {}),
        (
            "TensorDictPrioritizedReplayBuffer",
            TensorDictPrioritizedReplayBuffer,
            rs_torchrl.TensorDictPrioritizedReplayBuffer,
            {"alpha": 0.6, "beta": 0.4},
        ),
    )
    for name, rl_cls, rs_cls, kw in pairs:
        for impl, cls in (("torchrl", rl_cls), ("replaystore", rs_cls)):
            if impl == "torchrl" and kw and _per_available():
                rows.append({"workload": f"extend: {name}", "impl": impl, "note": _per_available()})
                continue
            rb = cls(storage=LazyTensorStorage(n), batch_size=256, **kw)
            _fill_chunks(rb, _cartpole, n)
            for batch in (1, 256):
                data = _cartpole(batch)
                rows.append(
                    {
                        "workload": f"extend({batch}) into 1M: {name}",
                        "impl": f"{impl} {cls.__name__}",
                        **_timed(lambda rb=rb, data=data: rb.extend(data), repeats),
                    }
                )
                print(rows[-1], flush=True)
            step = _cartpole(1)[0]  # (one step, no batch dimension: add())
            rows.append(
                {
                    "workload": f"add(1 step) into 1M: {name}",
                    "impl": f"{impl} {cls.__name__}",
                    **_timed(lambda rb=rb, step=step: rb.add(step), repeats),
                }
            )
            print(rows[-1], flush=True)
            del rb
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the chosen parts and print a Markdown table (and JSON with ``--json``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", default="uniform,per,slice")
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--sizes", default="1000000,10000000")
    p.add_argument("--episode-len", type=int, default=1000)
    p.add_argument("--memmap-dir", default="/tmp/rs-torchrl-bench")
    p.add_argument("--pixel-size", type=int, default=50_000)
    p.add_argument("--json")
    args = p.parse_args(argv)
    parts = args.part.split(",")
    rows: list[dict] = []
    if "uniform" in parts:
        rows += bench_uniform(args.repeats)
    if "per" in parts:
        rows += bench_per(args.repeats)
    if "configs" in parts:
        rows += bench_configs(args.repeats, Path(args.memmap_dir), args.pixel_size)
    if "profile" in parts:
        rows += bench_profile(args.repeats)
    if "extend" in parts:
        rows += bench_extend(args.repeats)
    if "slice" in parts:
        memmap_dir = Path(args.memmap_dir)
        memmap_dir.mkdir(parents=True, exist_ok=True)
        sizes = [int(s) for s in args.sizes.split(",")]
        rows += bench_slice(sizes, max(10, args.repeats // 5), memmap_dir, args.episode_len)
    print(f"\ntorch {torch.__version__}, python {sys.version.split()[0]}; medians; wall / CPU ms")
    print("| workload | implementation | wall ms | CPU ms | note |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "wall_ms" not in r:
            print(f"| {r['workload']} | {r['impl']} | - | - | {r.get('note', '')} |")
            continue
        note = f"first sample {r['first_sample_s']} s" if "first_sample_s" in r else ""
        print(f"| {r['workload']} | {r['impl']} | {r['wall_ms']:.3f} | {r['cpu_ms']:.3f} | {note} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
