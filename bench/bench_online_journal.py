"""The online journal's cost per write as tickets pile up: O(1) per write, or O(tickets held)?

Workload (issue 36, item 4): a paced ``RolloutBuffer`` with an ``OnlineJournal`` (LMDB, in a
temporary directory; ``--dir`` to choose). ``--held`` tickets are acquired first and stay held
(other producers' running groups); then ``--groups`` times: ``acquire(1)`` and ``add_group`` of a
group of one. Reported per configuration: the wall and CPU seconds of the ``add_group`` calls, of
the whole loop (acquires too), and the ratio to the run with no ticket held. Medians of
``--repeats``; the configurations alternate within each repeat.

    python bench/bench_online_journal.py [--groups 4096] [--held 0 4096] [--repeats 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from replaystore.online import OnlineJournal, RolloutBuffer


def run(groups: int, held: int, journal_dir: str) -> tuple[float, float, float, float]:
    """(add_group wall s, add_group CPU s, loop wall s, loop CPU s) with ``held`` tickets held."""
    journal = OnlineJournal(journal_dir)
    buf = RolloutBuffer(
        capacity=2 * groups, batch_size=2 * (groups + held) + 1, max_staleness=0, group_size=1, journal=journal
    )
    try:
        if held:
            buf.acquire(held, timeout=60)
        payload = {"tokens": list(range(16)), "reward": 1.0}
        add_wall = add_cpu = 0.0
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(groups):
            [t] = buf.acquire(1, timeout=60)
            w, c = time.perf_counter(), time.process_time()
            buf.add_group(t, [payload], versions=0, lengths=[16])
            add_wall += time.perf_counter() - w
            add_cpu += time.process_time() - c
        return add_wall, add_cpu, time.perf_counter() - w0, time.process_time() - c0
    finally:
        buf.close()


def main() -> None:
    """Print a table: seconds for ``--groups`` add_group calls per number of tickets held."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=4096)
    ap.add_argument("--held", type=int, nargs="+", default=[0, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the journal goes (default: a temporary directory)")
    args = ap.parse_args()
    rows: dict[int, list[tuple[float, float, float, float]]] = {h: [] for h in args.held}
    for _ in range(args.repeats):
        for h in args.held:
            with tempfile.TemporaryDirectory(dir=args.dir) as d:
                rows[h].append(run(args.groups, h, d))
    base = statistics.median(r[0] for r in rows[args.held[0]])
    print(f"{args.groups} add_group calls (groups of one, paced, LMDB journal); medians of {args.repeats}")
    print("| tickets held | add_group wall s | add_group CPU s | loop wall s | loop CPU s | wall x first row |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for h, rs_ in rows.items():
        med = [statistics.median(r[i] for r in rs_) for i in range(4)]
        print(f"| {h} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} | {med[3]:.2f} | {med[0] / base:.2f} |")


if __name__ == "__main__":
    main()
