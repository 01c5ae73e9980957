"""Line profiles of the hot paths that are still above the NumPy limit (``pip install line_profiler``).

The performance issue asks for a profile where a target is not met. This script fills a 1M table of
small transitions (as ``bench/run.py`` does) and line-profiles, in the steady state of a full table:

* ``extend`` of 1000 transitions (``Table._insert`` and ``Table._replace_slots``), and
* ``sample(256)`` from a uniform table (``Table.sample``),

then prints how the time of one call splits over the lines, next to the bare NumPy operations that
are the physical limit (slice assignment of the five columns; ``randint`` + ``np.take(out=...)``).
Line-profiler adds ~0.1-0.3 us per line, so absolute numbers run a little high::

    python bench/profile_hot_paths.py [--calls 5000]
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np

import replaystore as rs
from replaystore import table as table_module

CAPACITY = 1_000_000


def transitions(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A batch of the benchmark's small transitions."""
    return {
        "obs": rng.random((n, 17), dtype=np.float32),
        "action": rng.random((n, 6), dtype=np.float32),
        "reward": rng.random(n, dtype=np.float32),
        "next_obs": rng.random((n, 17), dtype=np.float32),
        "done": np.zeros(n, dtype=np.bool_),
    }


def numpy_limits(batch: dict[str, np.ndarray]) -> tuple[float, float]:
    """Microseconds of the bare NumPy ring: add a batch of 1000, gather 256."""
    cols = {k: np.zeros((CAPACITY,) + v.shape[1:], v.dtype) for k, v in batch.items()}
    out = {k: np.empty((256,) + v.shape[1:], v.dtype) for k, v in batch.items()}
    pos = [0]
    rng = np.random.default_rng(1)

    def add() -> None:
        p = pos[0]
        for k, v in batch.items():
            cols[k][p : p + len(v)] = v
        pos[0] = (p + len(v)) % CAPACITY

    def sample() -> None:
        idx = rng.integers(0, CAPACITY, 256)
        for k, c in cols.items():
            np.take(c, idx, axis=0, out=out[k])

    for _ in range(CAPACITY // 1000):
        add()
    a = min(timeit.repeat(add, number=2000, repeat=5)) / 2000 * 1e6
    s = min(timeit.repeat(sample, number=2000, repeat=5)) / 2000 * 1e6
    return a, s


def main() -> None:
    """Print the line profiles and the NumPy limits."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    from line_profiler import LineProfiler

    rng = np.random.default_rng(0)
    batch = transitions(1000, rng)
    table = rs.Table(CAPACITY, seed=0)
    for _ in range(CAPACITY // 1000):
        table.extend(batch)
    plain_add = min(timeit.repeat(lambda: table.extend(batch), number=2000, repeat=5)) / 2000 * 1e6
    plain_sample = min(timeit.repeat(lambda: table.sample(256), number=2000, repeat=5)) / 2000 * 1e6
    limit_add, limit_sample = numpy_limits(batch)
    print(f"extend(1000): {plain_add:.1f} us (NumPy slice assignment {limit_add:.1f} us, "
          f"ratio {limit_add / plain_add:.2f}x of the limit's speed)")
    print(f"sample(256):  {plain_sample:.1f} us (NumPy randint + take(out=) {limit_sample:.1f} us, "
          f"{plain_sample / limit_sample:.2f}x the limit's time)\n")

    lp = LineProfiler(table_module.Table._insert, table_module.Table._replace_slots, table_module.Table.sample)
    extend = lp(table.extend)
    sample = lp(table.sample)
    for _ in range(args.calls):
        extend(batch)
        sample(256)
    lp.print_stats(output_unit=1e-6, stripzeros=True)


if __name__ == "__main__":
    main()
