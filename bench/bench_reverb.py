"""DeepMind Reverb on the workload of ``bench_ray.py``: inserts/s and samples/s from client processes.

One Reverb server (in this process) with one table: capacity 1M, ``Prioritized(0.6)`` or ``Uniform``
sampler, ``Fifo`` remover, ``MinSize(1000)``. ``--writers`` processes insert ~1 KB items (the same
fields as ``bench_ray.py``, padded) through Reverb's trajectory writer, one item per step, flushing
every ``--batch`` items. ``--samplers`` processes draw ``--batch`` items at a time through one of two
paths (``--sample-path``):

* ``client``: ``client.sample(table, num_samples=batch)``, Reverb's Python client;
* ``dataset``: ``reverb.TrajectoryDataset(...).batch(batch)``, the tf.data path Reverb recommends for
  training, once per ``max_in_flight_samples_per_worker`` value in ``--in-flight``.

For the prioritized table each path is measured twice: sampling only, and sampling plus one
``client.mutate_priorities`` call per batch (new random priorities for the sampled keys).

Each phase starts all its processes, lets each finish its setup (imports, connection, and for the
dataset path one batch to build the pipeline), then times ``--seconds`` from a common barrier.

Runs only in ``bench/.venv-reverb`` (dm-reverb 0.14 with TensorFlow; Python 3.11)::

    python3 -m venv bench/.venv-reverb && bench/.venv-reverb/bin/pip install "dm-reverb[tensorflow]==0.14.0"
    bench/.venv-reverb/bin/python bench/bench_reverb.py [--writers 2] [--samplers 2] [--seconds 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from typing import NamedTuple

import numpy as np

FIELDS = {"obs": (17,), "action": (6,), "reward": (), "next_obs": (17,), "done": ()}
SETUP_TIMEOUT = 300.0  # seconds a phase's processes may take to import, connect and reach the start barrier


class SamplePath(NamedTuple):
    """How sampler processes draw items: ``client`` or ``dataset`` (with its in-flight setting)."""

    kind: str
    in_flight: int = 0
    mutate: bool = False

    def label(self, workers: int, prefetch: int) -> str:
        """Row label naming the path and its settings."""
        if self.kind == "client":
            name = "client.sample"
        else:
            name = f"TrajectoryDataset.batch (in-flight {self.in_flight}, workers {workers}, prefetch {prefetch})"
        return name + (" + mutate_priorities" if self.mutate else "")


def _writer(address: str, table: str, batch: int, pad: int, seconds: float, start: mp.Barrier,
            out: mp.Queue) -> None:
    import reverb

    client = reverb.Client(address)
    rng = np.random.default_rng(0)
    step = {k: rng.random(s).astype(np.float32) for k, s in FIELDS.items()}
    if pad:
        step["pad"] = np.zeros(pad, np.uint8)
    n = 0
    with client.trajectory_writer(num_keep_alive_refs=1) as w:
        start.wait(SETUP_TIMEOUT)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(batch):
                w.append(step)
                w.create_item(table, priority=1.0, trajectory={k: w.history[k][-1:] for k in step})
            w.flush()
            n += batch
    out.put(n)


def _client_batches(client, table: str, batch: int):
    """Yield the keys of ``batch`` items per ``client.sample`` call, forever."""
    while True:
        yield [s[0].info.key for s in client.sample(table, num_samples=batch)]


def _dataset_batches(address: str, table: str, batch: int, pad: int, path: SamplePath, args: argparse.Namespace):
    """Yield the keys (a uint64 tensor) of each batch of a batched ``reverb.TrajectoryDataset``, forever.

    The table has no signature, so the dataset gets the item structure (one step of each field, as the
    writers create them) explicitly; this is what ``TrajectoryDataset.from_table_signature`` would read.
    """
    import reverb
    import tensorflow as tf

    shapes = {k: tf.TensorShape((1, *s)) for k, s in FIELDS.items()}
    dtypes = {k: tf.float32 for k in FIELDS}
    if pad:
        shapes["pad"], dtypes["pad"] = tf.TensorShape((1, pad)), tf.uint8
    ds = reverb.TrajectoryDataset(address, table, dtypes, shapes,
                                  max_in_flight_samples_per_worker=path.in_flight,
                                  num_workers_per_iterator=args.dataset_workers)
    ds = ds.batch(batch, drop_remainder=True)
    if args.prefetch:
        ds = ds.prefetch(args.prefetch)
    for sample in ds:
        yield sample.info.key


def _sampler(address: str, table: str, batch: int, pad: int, path: SamplePath, args: argparse.Namespace,
             start: mp.Barrier, out: mp.Queue) -> None:
    """Draw batches through ``path`` for ``args.seconds`` after the start barrier; put the sample count."""
    import reverb

    client = reverb.Client(address)
    if path.kind == "client":
        batches = _client_batches(client, table, batch)
    else:
        batches = _dataset_batches(address, table, batch, pad, path, args)
    rng = np.random.default_rng(0)
    next(batches)  # connect, and for the dataset path build the pipeline, before the timed window
    start.wait(SETUP_TIMEOUT)
    n = 0
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        keys = next(batches)
        if path.mutate:
            keys = keys if isinstance(keys, list) else keys.numpy().tolist()
            client.mutate_priorities(table, updates=dict(zip(keys, (rng.random(len(keys)) + 0.01).tolist())))
        n += len(keys)
    out.put(n)


def _phase(ctx: mp.context.BaseContext, address: str, table: str, args: argparse.Namespace, writers: int,
           samplers: int, path: SamplePath | None = None) -> tuple[float, float]:
    """Run ``writers`` and ``samplers`` processes over one common timed window; return (inserts/s, samples/s)."""
    qw, qs = ctx.Queue(), ctx.Queue()
    start = ctx.Barrier(writers + samplers)
    pad = max(0, args.item_bytes - 180)
    procs = [ctx.Process(target=_writer, args=(address, table, args.batch, pad, args.seconds, start, qw))
             for _ in range(writers)]
    procs += [ctx.Process(target=_sampler, args=(address, table, args.batch, pad, path, args, start, qs))
              for _ in range(samplers)]
    for p in procs:
        p.start()
    ins = sum(qw.get(timeout=SETUP_TIMEOUT + args.seconds + 60) for _ in range(writers)) / args.seconds
    smp = sum(qs.get(timeout=SETUP_TIMEOUT + args.seconds + 60) for _ in range(samplers)) / args.seconds
    for p in procs:
        p.join(30)
    return ins, smp


def _paths(args: argparse.Namespace, prioritized: bool) -> list[SamplePath]:
    """The sampling paths to measure; the prioritized table adds each with ``mutate_priorities``."""
    kinds = [SamplePath("client")] if args.sample_path in ("client", "both") else []
    if args.sample_path in ("dataset", "both"):
        kinds += [SamplePath("dataset", f) for f in args.in_flight]
    mutates = (False, True) if prioritized else (False,)
    return [p._replace(mutate=m) for m in mutates for p in kinds]


def run(args: argparse.Namespace, prioritized: bool) -> list[dict]:
    """Benchmark one table; one row per sampling path, with the inserts-alone median shared by all rows."""
    import reverb

    sampler = reverb.selectors.Prioritized(0.6) if prioritized else reverb.selectors.Uniform()
    table = reverb.Table("replay", sampler=sampler, remover=reverb.selectors.Fifo(), max_size=1_000_000,
                         rate_limiter=reverb.rate_limiters.MinSize(1000))
    server = reverb.Server(tables=[table], port=None)
    address = f"localhost:{server.port}"
    ctx = mp.get_context("spawn")
    _phase(ctx, address, "replay", argparse.Namespace(**{**vars(args), "seconds": 2.0}), 1, 0)
    paths = _paths(args, prioritized)
    ins, smp, mi, ms = [], {p: [] for p in paths}, {p: [] for p in paths}, {p: [] for p in paths}
    for _ in range(args.repeats):
        ins.append(_phase(ctx, address, "replay", args, args.writers, 0)[0])
        for p in paths:
            smp[p].append(_phase(ctx, address, "replay", args, 0, args.samplers, p)[1])
            a, b = _phase(ctx, address, "replay", args, args.writers, args.samplers, p)
            mi[p].append(a)
            ms[p].append(b)
    server.stop()
    name = "Prioritized" if prioritized else "Uniform"
    return [{"table": name, "path": p.label(args.dataset_workers, args.prefetch),
             "inserts_alone": statistics.median(ins), "samples_alone": statistics.median(smp[p]),
             "inserts_mixed": statistics.median(mi[p]), "samples_mixed": statistics.median(ms[p])} for p in paths]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--samplers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--item-bytes", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sample-path", choices=("client", "dataset", "both"), default="both")
    ap.add_argument("--in-flight", type=lambda s: [int(x) for x in s.split(",")], default=[256, 1024],
                    help="max_in_flight_samples_per_worker values for the dataset path (comma-separated)")
    ap.add_argument("--dataset-workers", type=int, default=-1,
                    help="num_workers_per_iterator for the dataset path (-1: Reverb chooses)")
    ap.add_argument("--prefetch", type=int, default=0, help="tf.data prefetch after batching (0: none)")
    args = ap.parse_args()
    rows = run(args, prioritized=False) + run(args, prioritized=True)
    print(f"\nReverb: {args.writers} writer and {args.samplers} sampler processes, batches of {args.batch}, "
          f"~{args.item_bytes} B items, medians of {args.repeats} x {args.seconds:g} s "
          f"(inserts/s alone: one measurement per table, shared by its rows)\n")
    print("| table | sample path | inserts/s alone | samples/s alone | inserts/s mixed | samples/s mixed |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['table']} | {r['path']} | {r['inserts_alone']:,.0f} | {r['samples_alone']:,.0f} | "
              f"{r['inserts_mixed']:,.0f} | {r['samples_mixed']:,.0f} |")


if __name__ == "__main__":
    main()
