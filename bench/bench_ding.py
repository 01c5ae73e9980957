"""Benchmark DI-engine's own ``AdvancedReplayBuffer`` against ``replaystore.compat.ding``.

Both buffers run in one process on the same workload: dict transitions (``obs`` of shape (4,)
float32 or (4, 84, 84) uint8, plus ``action``, ``reward``, ``next_obs``, ``done``), capacities 4096
and 1,000,000, batches 64 and 256. Each buffer is first filled (lists of 256 items), then timed on:

- ``push_list``: push a list of 64 new transitions (a collector's output);
- ``push_one``: push one transition;
- ``sample``: ``sample(batch, iter)``;
- ``update``: ``update`` of the batch's priorities;
- ``step``: one training-loop iteration = push_list + sample + update.

Times are the median over repeated calls (microseconds per call), measured in alternating blocks
of 20 calls so that both buffers see the same background load; the ratio is DI-engine's time
divided by ours (> 1: we are faster). Items are stored by reference by both buffers (``deepcopy``
off, their default), so the obs size changes the memory touched, not what is copied.

Setup (once): ``python3 bench/bench_ding.py --setup`` creates ``bench/.venv-ding`` with
``DI-engine`` installed ``--no-deps`` plus only what its buffer modules import (no numba: the
default install, where DI-engine's segment tree is plain Python). With numba installed in that
environment (``pip install numba "numpy==1.26.4"``: DI-engine's and replaystore's ``[fast]``
extras), both libraries use their compiled trees; the report says which case it measured. Then::

    nice bench/.venv-ding/bin/python bench/bench_ding.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-ding"
# what `import ding.worker.replay_buffer` needs (found by importing it in a bare venv), numpy<2 as
# DI-engine requires; torch from the local CPU wheel
DEPS = [
    "numpy<2", "torch==2.13.0", "easydict", "hickle", "h5py", "cloudpickle", "DI-toolkit", "hbutils",
    "deprecation", "packaging", "rich", "markdown-it-py", "mdurl", "DI-treetensor", "treevalue", "graphviz",
    "dill", "pyyaml", "requests", "urllib3", "idna", "certifi", "flask", "werkzeug", "click", "blinker",
    "itsdangerous", "jinja2", "markupsafe", "urlobject", "enum_tools", "pygments", "tabulate", "tensorboardX",
    "protobuf", "gym", "typing_extensions", "filelock", "fsspec", "networkx", "sympy", "mpmath",
]


def setup() -> None:
    """Create bench/.venv-ding: DI-engine with --no-deps, then its buffer modules' imports."""
    if not (VENV / "bin" / "python").exists():
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    (VENV / ".gitignore").write_text("*\n")
    pip = [str(VENV / "bin" / "pip"), "install", "-q"]
    subprocess.check_call(pip + ["--no-deps", "DI-engine==0.5.3"])
    subprocess.check_call(pip + ["--no-deps"] + DEPS)
    print(f"ready: {VENV / 'bin' / 'python'} {Path(__file__).relative_to(HERE.parent)}")


def import_ding() -> Any:
    """DI-engine's AdvancedReplayBuffer, without running ``ding.worker``'s package __init__.

    ``ding/worker/__init__.py`` imports the collectors, learners and coordinator (gym, envs, ...);
    the buffer package itself needs none of that, so ``ding.worker`` is registered as a bare
    namespace before ``ding.worker.replay_buffer`` is imported.
    """
    import ding

    worker = types.ModuleType("ding.worker")
    worker.__path__ = [os.path.join(os.path.dirname(ding.__file__), "worker")]
    sys.modules.setdefault("ding.worker", worker)
    from ding.worker.replay_buffer import AdvancedReplayBuffer

    return AdvancedReplayBuffer, getattr(ding, "__version__", "?")


def import_ours() -> Any:
    try:
        import replaystore  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(HERE.parent / "src"))
    from replaystore.compat.ding import AdvancedReplayBuffer

    return AdvancedReplayBuffer


class Items:
    """A stream of fresh transition dicts whose arrays come from a fixed pool (same for both)."""

    def __init__(self, obs_shape: tuple, pool: int = 512) -> None:
        import numpy as np

        rng = np.random.default_rng(0)
        if obs_shape == (4,):
            self.obs = [rng.standard_normal(4).astype(np.float32) for _ in range(pool)]
        else:
            self.obs = [rng.integers(0, 255, obs_shape, dtype=np.uint8) for _ in range(pool)]
        self.n = 0

    def take(self, k: int) -> list:
        out = []
        pool = self.obs
        m = len(pool)
        for _ in range(k):
            i = self.n
            out.append({"obs": pool[i % m], "action": i % 3, "reward": 1.0, "next_obs": pool[(i + 1) % m],
                        "done": False})
            self.n += 1
        return out


def timed(fn: Callable[[], Any], calls: int) -> list[float]:
    """Per-call times in seconds of ``calls`` calls."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


class Run:
    """One buffer under the workload; each ``op_*`` method is one timed call."""

    def __init__(self, cls: Any, capacity: int, obs_shape: tuple) -> None:
        import numpy as np

        cfg = cls.default_config()
        cfg.replay_buffer_size = capacity
        self.buf = cls(cfg, tb_logger=None, exp_name="bench", instance_name="bench")
        self.items = Items(obs_shape)
        self.rng = np.random.default_rng(1)
        self.it = 0
        self.batch = 64
        self.last: list = []
        self.queue: list = []

    def fill(self, n: int) -> float:
        """Push ``n`` items in lists of 256; return items per second."""
        t0 = time.perf_counter()
        done = 0
        while done < n:
            k = min(256, n - done)
            self.buf.push(self.items.take(k), 0)
            done += k
        return n / (time.perf_counter() - t0)

    def prepare(self, calls: int, size: int) -> None:
        """Make the transitions the next ``calls`` push calls will use (outside the timing)."""
        self.queue = [self.items.take(size) if size > 1 else self.items.take(1)[0] for _ in range(calls)]
        self.queue.reverse()

    def op_push(self) -> None:
        self.buf.push(self.queue.pop(), 0)

    def op_sample(self) -> None:
        self.it += 1
        self.last = self.buf.sample(self.batch, self.it)

    def info(self) -> dict:
        return {"replay_unique_id": [d["replay_unique_id"] for d in self.last],
                "replay_buffer_idx": [d["replay_buffer_idx"] for d in self.last],
                "priority": self.rng.random(len(self.last)).tolist()}

    def op_update(self) -> None:
        self.buf.update(self.fixed_info)

    def op_step(self) -> None:
        self.op_push()
        self.op_sample()
        self.buf.update(self.info())


def run_pair(classes: dict, capacity: int, obs_shape: tuple, batches: list, calls: int, fill: int) -> dict:
    """Both buffers side by side; every operation is timed in alternating blocks of 20 calls.

    Alternating blocks expose both buffers to the same background load (the machine is shared),
    so the ratios stay meaningful even when absolute times drift.
    """
    import numpy as np

    runs = {}
    res: dict[str, dict[str, Any]] = {name: {} for name in classes}
    for name, cls in classes.items():
        np.random.seed(0)
        runs[name] = Run(cls, capacity, obs_shape)
        res[name]["fill_items_per_s"] = runs[name].fill(fill)
    block = 20
    rounds = max(1, calls // block)

    def measure(key: str, op: str, size: int = 0, batch: int = 64) -> None:
        times: dict[str, list] = {name: [] for name in runs}
        for r in range(rounds):
            order = list(runs) if r % 2 == 0 else list(runs)[::-1]
            for name in order:
                run = runs[name]
                run.batch = batch
                if size:
                    run.prepare(block, size)
                times[name] += timed(getattr(run, op), block)
        for name in runs:
            res[name][key] = statistics.median(times[name]) * 1e6

    measure("push_list", "op_push", size=64)
    measure("push_one", "op_push", size=1)
    for batch in batches:
        measure(f"sample_{batch}", "op_sample", batch=batch)
        for run in runs.values():
            run.fixed_info = run.info()
        measure(f"update_{batch}", "op_update", batch=batch)
        measure(f"step_{batch}", "op_step", size=64, batch=batch)
    for run in runs.values():
        run.buf.close()
    runs.clear()
    gc.collect()
    return res


def _parity_run(cls: Any, steps: int, max_use: float, max_staleness: float, use_range: bool) -> list:
    import numpy as np

    cfg = cls.default_config()
    cfg.replay_buffer_size = 100
    cfg.max_use = max_use
    cfg.max_staleness = max_staleness
    buf = cls(cfg, tb_logger=None, exp_name="parity", instance_name="p")
    np.random.seed(5)
    rng = np.random.default_rng(0)
    out: list = []
    for it in range(steps):
        buf.push([{"o": it * 4 + k, "collect_iter": it} for k in range(4)], it)
        sample_range = slice(-50, -10) if use_range and it > 30 and it % 3 == 0 else None
        batch = buf.sample(16, it, sample_range=sample_range)
        if batch is None:
            out.append(None)
            continue
        out.append([(d["replay_unique_id"], d["replay_buffer_idx"], d["use"], d["staleness"], round(d["IS"], 9))
                    for d in batch])
        buf.update({"replay_unique_id": [d["replay_unique_id"] for d in batch],
                    "replay_buffer_idx": [d["replay_buffer_idx"] for d in batch],
                    "priority": rng.random(len(batch)).tolist()})
    out.append(("count", buf.count(), round(buf.beta, 12)))
    buf.close()
    return out


def parity(ding_cls: Any, ours_cls: Any, steps: int = 300) -> dict[str, tuple[int, int]]:
    """Run both buffers on seeded push/sample/update loops; per scenario (identical steps, steps).

    Capacity 100, 4 pushes and a batch of 16 per step, random priority updates. A step is
    identical when both return ``None`` or items with the same unique ids, slots, use counts,
    staleness and IS (9 decimals); the final count and beta are compared too. Scenarios:
    ``max_use`` 3 with ``max_staleness`` 30 (in-order ``collect_iter``), and ``sample_range``
    ``slice(-50, -10)`` on every third step once the ring is full (without ``max_use``, which
    empties that range; DI-engine then draws outside it, see docs/compat/ding.md).
    """
    scenarios = {"max_use+max_staleness": (3, 30, False), "sample_range": (float("inf"), float("inf"), True)}
    result = {}
    for name, (max_use, max_staleness, use_range) in scenarios.items():
        a = _parity_run(ding_cls, steps, max_use, max_staleness, use_range)
        b = _parity_run(ours_cls, steps, max_use, max_staleness, use_range)
        result[name] = (sum(x == y for x, y in zip(a, b)), len(a))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setup", action="store_true", help="create bench/.venv-ding and exit")
    ap.add_argument("--quick", action="store_true", help="fewer calls, fill 1M buffers to 100k only")
    ap.add_argument("--parity", action="store_true", help="only compare seeded outputs and exit")
    ap.add_argument("--capacities", default="4096,1000000")
    ap.add_argument("--json", help="also write the raw results here")
    args = ap.parse_args()
    if args.setup:
        setup()
        return
    warnings.filterwarnings("ignore")
    logging.disable(logging.INFO)
    ding_cls, ding_version = import_ding()
    ours_cls = import_ours()
    workdir = tempfile.mkdtemp(prefix="bench-ding-")  # DI-engine writes logs under ./bench/log
    os.chdir(workdir)
    checks = parity(ding_cls, ours_cls)
    print("parity with DI-engine on seeded runs (identical steps / steps): "
          + ", ".join(f"{k} {same}/{total}" for k, (same, total) in checks.items()) + "\n")
    if args.parity:
        return
    calls = 60 if args.quick else 300
    batches = [64, 256]
    results: list[dict] = []
    for capacity in [int(c) for c in args.capacities.split(",")]:
        fill = min(capacity, 100_000) if args.quick else capacity
        for obs_shape in [(4,), (4, 84, 84)]:
            row: dict[str, Any] = {"capacity": capacity, "obs": "x".join(map(str, obs_shape)), "fill": fill}
            row.update(run_pair({"ours": ours_cls, "ding": ding_cls}, capacity, obs_shape, batches, calls, fill))
            for name in ("ours", "ding"):
                print(f"# {name} capacity={capacity} obs={row['obs']}: "
                      + ", ".join(f"{k}={v:.0f}" for k, v in row[name].items()), file=sys.stderr, flush=True)
            results.append(row)
    try:
        import numba  # noqa: F401 - both libraries use it when it is installed (their [fast] extras)

        numba_note = "both with numba"
    except ImportError:
        numba_note = "no numba in either"
    print(f"DI-engine {ding_version} vs replaystore.compat.ding ({numba_note}); Python {platform.python_version()}, "
          f"{platform.machine()}; median microseconds per call; ratio = DI-engine / ours\n")
    ops = ["push_list", "push_one"] + [f"{op}_{b}" for b in batches for op in ("sample", "update", "step")]
    labels = {"push_list": "push 64", "push_one": "push 1"}
    head = "| capacity | obs | " + " | ".join(labels.get(o, o.replace("_", " ")) for o in ops) + " | fill items/s |"
    print(head)
    print("|" + "---|" * (len(ops) + 3))
    for r in results:
        cells = [f"{r['ding'][o]:.0f} / {r['ours'][o]:.0f} (**{r['ding'][o] / r['ours'][o]:.1f}x**)" for o in ops]
        fill_cell = (f"{r['ding']['fill_items_per_s']:.0f} / {r['ours']['fill_items_per_s']:.0f} "
                     f"(**{r['ours']['fill_items_per_s'] / r['ding']['fill_items_per_s']:.1f}x**)")
        print(f"| {r['capacity']:,} | {r['obs']} | " + " | ".join(cells) + f" | {fill_cell} |")
    print("\ncells: DI-engine / ours (ratio); fill: items per second while filling (ratio ours / DI-engine)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
