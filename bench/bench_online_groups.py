"""replaystore.online for large-model trainers: whole-group writes and over-provisioning (issue 22).

1. **A group of 8 in one call.** Per group of ``--group`` completions: the calls and journal
   transactions of ``add`` per member (before) against one ``add_group`` (after), and the time per
   group with the LMDB journal (``OnlineJournal`` in a temporary directory; ``--dir`` to choose)
   and without; same process, alternating, medians of ``--repeats``.
2. **Over-provisioning against a long tail.** 16 producer threads, lengths drawn from a lognormal
   (median 64 tokens, sigma ``--sigma`` (1), clipped to 8-4096) at ``--token-us`` per token (generation is a
   sleep: compute is not the limit, the budget is); the trainer samples ``--batch`` groups per
   version (``max_staleness=1``, pick ``fifo``) and publishes the next version. Without
   over-provisioning a producer takes one ticket and generates one group; with it, it takes
   ``acquire(1, overprovision=1)``, "generates" two groups, writes the one that finishes first and
   the buffer cancels the other. Reported: trainer batches/s (CPU and wall), the mean and 95th
   percentile length of generated (finished) and trained groups, tickets cancelled. Same run,
   alternating, ``--repeats`` each.

    nice python bench/bench_online_groups.py [--group 8] [--seconds 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

import numpy as np

import replaystore as rs
from replaystore.online import OnlineJournal, RolloutBuffer


class CountingJournal:
    """Wraps a journal (or nothing) and counts its transactions."""

    def __init__(self, inner=None) -> None:
        self.inner, self.writes = inner, 0

    def write(self, puts, deletes) -> None:  # noqa: D102
        self.writes += 1
        if self.inner is not None:
            self.inner.write(puts, deletes)

    def load(self) -> dict:  # noqa: D102
        return {} if self.inner is None else self.inner.load()

    def close(self) -> None:  # noqa: D102
        if self.inner is not None:
            self.inner.close()


def groups_bench(args: argparse.Namespace, whole: bool, journal_dir: str | None) -> tuple[float, float, float, float]:
    """(calls, journal writes, wall us, CPU us) per group, writing groups of ``args.group``."""
    j = CountingJournal(OnlineJournal(journal_dir) if journal_dir else None)
    buf = RolloutBuffer(1 << 16, batch_size=64, max_staleness=1, group_size=args.group, journal=j)
    item = {"tokens": list(range(64)), "logp": [0.0] * 64, "reward": 1.0}
    members = [item] * args.group
    groups, calls, writes, spent, cpu = 0, 0, 0, 0.0, 0.0
    t_end = time.perf_counter() + args.seconds
    v = 0
    while time.perf_counter() < t_end:
        tickets = buf.acquire(64, timeout=5)
        w0 = j.writes
        t0, c0 = time.perf_counter(), time.process_time()
        for t in tickets:
            if whole:
                buf.add_group(t, members, versions=v, lengths=[64] * args.group)
                calls += 1
            else:
                for m in members:
                    buf.add(m, group=t, versions=v, length=64)
                calls += args.group
        spent += time.perf_counter() - t0
        cpu += time.process_time() - c0
        writes += j.writes - w0
        groups += len(tickets)
        buf.sample(64, timeout=5)
        v += 1
        buf.set_version(v)
    buf.close()
    return calls / groups, writes / groups, spent / groups * 1e6, cpu / groups * 1e6


def tail_bench(args: argparse.Namespace, over: bool, seed: int) -> dict:
    """Trainer batches/s with 16 producers of long-tailed lengths, with or without over-provisioning."""
    buf = RolloutBuffer(1 << 14, batch_size=args.batch, max_staleness=1, group_size=1, pick="fifo", ticket_ttl=60)
    stop = threading.Event()
    generated: list[int] = []
    lock = threading.Lock()

    def producer(i: int) -> None:
        rng = np.random.default_rng(seed * 100 + i)
        while not stop.is_set():
            try:
                tickets = buf.acquire(1, timeout=0.2, holder=f"p{i}", overprovision=1 if over else 0)
            except (rs.Timeout, rs.Closed):
                continue
            lengths = np.clip(rng.lognormal(np.log(64), args.sigma, len(tickets)), 8, 4096).astype(int)
            first = int(np.argmin(lengths))
            time.sleep(lengths[first] * args.token_us * 1e-6)  # the shortest finishes first
            try:
                buf.add({"len": int(lengths[first])}, group=tickets[first], length=int(lengths[first]))
            except (rs.Closed, KeyError):  # closed at the end; or expired
                continue
            with lock:
                generated.append(int(lengths[first]))
            # (with over-provisioning the other ticket was cancelled when this one completed)

    threads = [threading.Thread(target=producer, args=(i,), daemon=True) for i in range(args.producers)]
    for th in threads:
        th.start()
    trained: list[int] = []
    steps, v = 0, 0
    c0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        b = buf.sample(args.batch, timeout=30)
        trained += b.lengths.tolist()
        v += 1
        buf.set_version(v)
        steps += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = buf.stats()
    stop.set()
    buf.close()
    for th in threads:
        th.join(5)
    return {"batches_per_s": steps / wall, "cpu_ms_per_batch": cpu / steps * 1e3, "steps": steps,
            "gen_mean": float(np.mean(generated)), "gen_p95": float(np.percentile(generated, 95)),
            "trained_mean": float(np.mean(trained)), "trained_p95": float(np.percentile(trained, 95)),
            "cancelled": s["tickets_cancelled"], "trained": len(trained)}


def main() -> None:
    """Print both tables (markdown)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8, help="groups per trainer step (tail benchmark)")
    ap.add_argument("--producers", type=int, default=16)
    ap.add_argument("--token-us", type=float, default=20.0, help="generation time per token (microseconds)")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the lengths (the tail)")
    ap.add_argument("--skip-groups", action="store_true", help="only the over-provisioning benchmark")
    ap.add_argument("--dir", default=None, help="where the journal goes (default: a temporary directory)")
    args = ap.parse_args()

    rows: dict[str, list] = {}
    for _ in range(0 if args.skip_groups else args.repeats):
        for whole in (False, True):
            for journal in (False, True):
                with tempfile.TemporaryDirectory(dir=args.dir) as d:
                    key = (whole, journal)
                    rows.setdefault(key, []).append(groups_bench(args, whole, d if journal else None))
    if not args.skip_groups:
        print_groups(args, rows)
    print_tails(args)


def print_groups(args: argparse.Namespace, rows: dict) -> None:
    """The table of part 1."""
    print(f"groups of {args.group} completions (64 tokens each); medians of {args.repeats} runs of {args.seconds} s")
    print("| writes | journal | calls per group | journal transactions per group | CPU us per group | "
          "wall us per group | CPU x add_group |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for journal in (False, True):
        base = statistics.median(r[3] for r in rows[(True, journal)])
        for whole in (False, True):
            rs_ = rows[(whole, journal)]
            cpu = statistics.median(r[3] for r in rs_)
            wall = statistics.median(r[2] for r in rs_)
            print(f"| {'add_group (after)' if whole else 'add per member (before)'} | "
                  f"{'LMDB' if journal else 'none'} | {rs_[0][0]:.0f} | {rs_[0][1]:.0f} | {cpu:.0f} | {wall:.0f} | "
                  f"{cpu / base:.2f} |")


def print_tails(args: argparse.Namespace) -> None:
    """Run part 2 and print its table."""
    tails: dict[bool, list] = {False: [], True: []}
    for r in range(args.repeats):
        for over in (False, True):
            tails[over].append(tail_bench(args, over, seed=r))
    print()
    print(f"{args.producers} producers, lognormal lengths (median 64 tokens, sigma {args.sigma}), "
          f"{args.token_us} us/token, "
          f"batch {args.batch} groups, max_staleness 1, fifo; medians of {args.repeats} runs of {args.seconds} s")
    print("| over-provisioning | trainer batches/s | CPU ms per batch | generated mean / p95 length | "
          "trained mean / p95 length | tickets cancelled per batch |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for over in (False, True):
        t = tails[over]

        def med(k: str) -> float:
            return statistics.median(x[k] for x in t)  # noqa: B023

        print(f"| {'acquire(1, overprovision=1)' if over else 'off'} | {med('batches_per_s'):.1f} | "
              f"{med('cpu_ms_per_batch'):.2f} | {med('gen_mean'):.0f} / {med('gen_p95'):.0f} | "
              f"{med('trained_mean'):.0f} / {med('trained_p95'):.0f} | "
              f"{statistics.median(x['cancelled'] / x['steps'] for x in t):.1f} |")
    ratio = statistics.median(a["batches_per_s"] / b["batches_per_s"] for a, b in zip(tails[True], tails[False]))
    print(f"\nbatches/s with over-provisioning / without (median of per-run ratios): {ratio:.2f}x")


if __name__ == "__main__":
    main()
