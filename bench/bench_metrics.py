"""What leaving the metrics on costs: ``extend(8)`` and ``sample(256)`` with the exporters off and on.

"on": ``serve_dashboard(table, period=1)`` (a Recorder reading ``stats()`` every second, or less
often for large tables: ``max_duty``), a TensorBoard exporter writing every point, and a
Prometheus scraper fetching ``/metrics`` every ``--scrape`` seconds, all in the table's process, as
a training run would leave them. "off": none of it. The calls run back to back in the main thread
for ``--seconds`` per measurement; modes alternate (off, on, on, off, ...) so that load drifts hit
both; the figures are medians over ``--repeats``. Per call: wall µs, and CPU µs of the calling
thread.

Usage::

    PYTHONPATH=src python bench/bench_metrics.py [--items 1000000] [--seconds 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import urllib.request

import numpy as np

import replaystore as rs
from replaystore.metrics import TensorBoardExporter, serve_dashboard


def make_table(items: int, prioritized: bool) -> rs.Table:
    t = rs.Table(items, sampler=rs.Prioritized() if prioritized else rs.Uniform(), remover=rs.Fifo(), seed=0)
    rng = np.random.default_rng(0)
    for start in range(0, items, 100_000):
        n = min(100_000, items - start)
        t.extend(batch(rng, n))
    return t


def batch(rng: np.random.Generator, n: int) -> dict:
    return {
        "obs": rng.standard_normal((n, 4)).astype(np.float32),
        "action": rng.integers(0, 2, n),
        "reward": rng.standard_normal(n).astype(np.float32),
        "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
        "done": rng.random(n) < 0.01,
    }


def measure(fn, seconds: float) -> tuple[float, float]:
    """Wall and thread-CPU µs per call of ``fn`` run back to back for ``seconds``."""
    end = time.perf_counter() + 0.2
    while time.perf_counter() < end:  # warm-up
        fn()
    calls, c0, t0 = 0, time.thread_time(), time.perf_counter()
    end = t0 + seconds
    while True:
        for _ in range(20):
            fn()
        calls += 20
        now = time.perf_counter()
        if now >= end:
            break
    return (now - t0) / calls * 1e6, (time.thread_time() - c0) / calls * 1e6


class Exporters:
    """The dashboard (recorder + server), a TensorBoard exporter and a Prometheus scraper."""

    def __init__(self, table: rs.Table, logdir: str, scrape: float) -> None:
        self.scrape = scrape
        self.dash = serve_dashboard(table, port=0, period=1.0)
        self.tb = TensorBoardExporter(self.dash.recorder, logdir=logdir)
        self.stop = threading.Event()
        self.scrapes = 0
        self.thread = threading.Thread(target=self._scrape, daemon=True)
        self.thread.start()

    def _scrape(self) -> None:
        while not self.stop.wait(self.scrape):
            with urllib.request.urlopen(self.dash.url + "metrics", timeout=10) as r:
                r.read()
            self.scrapes += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.dash.close()
        self.tb.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prioritized", action="store_true")
    ap.add_argument("--scrape", type=float, default=1.0, help="seconds between scrapes of /metrics (default 1)")
    args = ap.parse_args()
    table = make_table(args.items, args.prioritized)
    rng = np.random.default_rng(1)
    b8 = batch(rng, 8)
    ops = {"extend(8)": lambda: table.extend(b8), "sample(256)": lambda: table.sample(256)}
    t0 = time.perf_counter()
    table.stats()
    print(
        f"table: {args.items:,} items, {'prioritized' if args.prioritized else 'uniform'}; one stats(): "
        f"{(time.perf_counter() - t0) * 1e3:.1f} ms"
    )
    res: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as logdir:
        for r in range(args.repeats):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                ex = Exporters(table, logdir, args.scrape) if mode == "on" else None
                try:
                    for name, fn in ops.items():
                        res.setdefault((name, mode), []).append(m := measure(fn, args.seconds))
                        print(f"  {r} {mode:<3} {name:<12} {m[0]:8.2f} µs wall {m[1]:8.2f} µs CPU", flush=True)
                finally:
                    if ex is not None:
                        period = ex.dash.recorder.effective_period
                        ex.close()
                        print(f"  repeat {r}: recorder period {period:.2f} s, {ex.scrapes} scrapes")
    print(f"{'op':<12} {'off wall':>9} {'on wall':>9} {'ratio':>6}   {'off CPU':>8} {'on CPU':>8} {'ratio':>6}")
    for name in ops:
        off, on = np.median(res[(name, "off")], axis=0), np.median(res[(name, "on")], axis=0)
        print(
            f"{name:<12} {off[0]:9.2f} {on[0]:9.2f} {on[0] / off[0]:6.3f}   "
            f"{off[1]:8.2f} {on[1]:8.2f} {on[1] / off[1]:6.3f}"
        )
    print("(µs per call, medians of", args.repeats, "interleaved runs; CPU: the calling thread's)")


if __name__ == "__main__":
    main()
