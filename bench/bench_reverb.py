"""DeepMind Reverb on the workload of ``bench_ray.py``: inserts/s and samples/s from client processes.

One Reverb server (in this process) with one table: capacity 1M, ``Prioritized(0.6)`` or ``Uniform``
sampler, ``Fifo`` remover, ``MinSize(1000)``. ``--writers`` processes insert ~1 KB items (the same
fields as ``bench_ray.py``, padded) through Reverb's trajectory writer, one item per step, flushing
every ``--batch`` items; ``--samplers`` processes draw ``--batch`` items per ``client.sample`` call
(and, for the prioritized table, send ``mutate_priorities`` for them).

Runs only in ``bench/.venv-reverb`` (dm-reverb 0.14 with TensorFlow; Python 3.11)::

    python3 -m venv bench/.venv-reverb && bench/.venv-reverb/bin/pip install "dm-reverb[tensorflow]==0.14.0"
    bench/.venv-reverb/bin/python bench/bench_reverb.py [--writers 2] [--samplers 2] [--seconds 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import numpy as np

FIELDS = {"obs": (17,), "action": (6,), "reward": (), "next_obs": (17,), "done": ()}


def _writer(address: str, table: str, batch: int, pad: int, seconds: float, out: mp.Queue) -> None:
    import reverb

    client = reverb.Client(address)
    rng = np.random.default_rng(0)
    step = {k: rng.random(s).astype(np.float32) for k, s in FIELDS.items()}
    if pad:
        step["pad"] = np.zeros(pad, np.uint8)
    n = 0
    end = time.monotonic() + seconds
    with client.trajectory_writer(num_keep_alive_refs=1) as w:
        while time.monotonic() < end:
            for _ in range(batch):
                w.append(step)
                w.create_item(table, priority=1.0, trajectory={k: w.history[k][-1:] for k in step})
            w.flush()
            n += batch
    out.put(n)


def _sampler(address: str, table: str, batch: int, seconds: float, prioritized: bool, out: mp.Queue) -> None:
    import reverb

    client = reverb.Client(address)
    rng = np.random.default_rng(0)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        keys = [s[0].info.key for s in client.sample(table, num_samples=batch)]
        if prioritized:
            client.mutate_priorities(table, updates=dict(zip(keys, (rng.random(len(keys)) + 0.01).tolist())))
        n += len(keys)
    out.put(n)


def _phase(ctx: mp.context.BaseContext, address: str, table: str, args: argparse.Namespace, writers: int,
           samplers: int, prioritized: bool) -> tuple[float, float]:
    qw, qs = ctx.Queue(), ctx.Queue()
    pad = max(0, args.item_bytes - 180)
    procs = [ctx.Process(target=_writer, args=(address, table, args.batch, pad, args.seconds, qw))
             for _ in range(writers)]
    procs += [ctx.Process(target=_sampler, args=(address, table, args.batch, args.seconds, prioritized, qs))
              for _ in range(samplers)]
    for p in procs:
        p.start()
    ins = sum(qw.get(timeout=args.seconds + 120) for _ in range(writers)) / args.seconds
    smp = sum(qs.get(timeout=args.seconds + 120) for _ in range(samplers)) / args.seconds
    for p in procs:
        p.join(30)
    return ins, smp


def run(args: argparse.Namespace, prioritized: bool) -> dict:
    import reverb

    sampler = reverb.selectors.Prioritized(0.6) if prioritized else reverb.selectors.Uniform()
    table = reverb.Table("replay", sampler=sampler, remover=reverb.selectors.Fifo(), max_size=1_000_000,
                         rate_limiter=reverb.rate_limiters.MinSize(1000))
    server = reverb.Server(tables=[table], port=None)
    address = f"localhost:{server.port}"
    ctx = mp.get_context("spawn")
    _phase(ctx, address, "replay", argparse.Namespace(**{**vars(args), "seconds": 2.0}), 1, 0, prioritized)
    ins, smp, mi, ms = [], [], [], []
    for _ in range(args.repeats):
        ins.append(_phase(ctx, address, "replay", args, args.writers, 0, prioritized)[0])
        smp.append(_phase(ctx, address, "replay", args, 0, args.samplers, prioritized)[1])
        a, b = _phase(ctx, address, "replay", args, args.writers, args.samplers, prioritized)
        mi.append(a)
        ms.append(b)
    server.stop()
    return {"sampler": "Prioritized (+ mutate)" if prioritized else "Uniform",
            "inserts_alone": statistics.median(ins), "samples_alone": statistics.median(smp),
            "inserts_mixed": statistics.median(mi), "samples_mixed": statistics.median(ms)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--samplers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--item-bytes", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = [run(args, prioritized=False), run(args, prioritized=True)]
    print(f"\nReverb: {args.writers} writer and {args.samplers} sampler processes, batches of {args.batch}, "
          f"~{args.item_bytes} B items, medians of {args.repeats} x {args.seconds:g} s\n")
    print("| table | inserts/s alone | samples/s alone | inserts/s mixed | samples/s mixed |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['sampler']} | {r['inserts_alone']:,.0f} | {r['samples_alone']:,.0f} | "
              f"{r['inserts_mixed']:,.0f} | {r['samples_mixed']:,.0f} |")


if __name__ == "__main__":
    main()
