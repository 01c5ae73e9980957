"""MinHeap/MaxHeap removers in one process: the compiled tournament tree vs the heapq list.

A 100k table full of 4-float rows with a heap remover; per call CPU medians (5 rounds of 0.3 s)
of an evicting ``extend(64)``, ``update_priorities`` of 64 sampled keys, and ``sample(64)``.

    PYTHONPATH=src python bench/bench_heap.py        # both paths, alternating, two rounds
"""

from __future__ import annotations

import time

import numpy as np

import replaystore as rs
from replaystore.samplers import heap_tree


def per_call_us(f, rounds: int = 5, seconds: float = 0.3) -> float:
    """Median CPU microseconds per call of ``f`` over ``rounds`` rounds, after a warm-up."""
    for _ in range(200):
        f()
    times = []
    for _ in range(rounds):
        c0, n = time.process_time(), 0
        while time.process_time() - c0 < seconds:
            f()
            n += 1
        times.append((time.process_time() - c0) / n * 1e6)
    return float(np.median(times))


def figures(t: rs.Table, batch: dict, rng: np.random.Generator) -> dict[str, float]:
    """The three per-call figures of one filled table."""
    return {
        "extend(64), evicting": per_call_us(lambda: t.extend(batch, priorities=rng.random(64))),
        "update_priorities(64)": per_call_us(lambda: t.update_priorities(t.sample(64).keys, rng.random(64))),
        "sample(64)": per_call_us(lambda: t.sample(64)),
    }


def run(path: str, capacity: int = 100_000) -> None:
    """Print the three figures of both heap removers on one path ("tree" or "heapq")."""
    compiled = heap_tree.AVAILABLE
    heap_tree.AVAILABLE = compiled and path == "tree"
    try:
        for remover in (rs.MinHeap, rs.MaxHeap):
            t = rs.Table(capacity, sampler=rs.Uniform(), remover=remover(), seed=0)
            rng = np.random.default_rng(0)
            batch = {"obs": np.zeros((64, 4), np.float32)}
            while len(t) < capacity:
                t.extend(batch, priorities=rng.random(64))
            print(path, remover.__name__, {k: round(v, 1) for k, v in figures(t, batch, rng).items()})
    finally:
        heap_tree.AVAILABLE = compiled


if __name__ == "__main__":
    if not heap_tree.AVAILABLE:
        raise SystemExit("numba is not installed: only the heapq path exists")
    for _ in range(2):
        for path in ("heapq", "tree"):
            run(path)
