"""Why a shared table's mutex spins before it sleeps: what sleeping costs, and spin budgets compared.

Two measurements (replaystore only; the peers are in ``bench_shared.py``):

1. **The cost of a sleep**: an in-process table's ``sample(256)`` (200,000 small transitions),
   CPU µs per call when the calls follow each other and when a ``time.sleep`` of 5-100 µs comes
   before each. On this 2-vCPU machine a core that went idle comes back with cold caches: the
   next call costs ~2x. A waiter that sleeps on the futex pays that too.
2. **Spin budgets**: one learner process sampling 256 back to back (uniform; or prioritized and
   updating the priorities) and ``W`` writer processes calling ``extend`` of 8 small rows, on a
   shared table, for each spin budget (``replaystore.shared._sync.set_spin``, per process; 0:
   sleep at once). Per process: calls, user and system CPU µs per call, voluntary context
   switches per call (``getrusage``).

Usage::

    PYTHONPATH=src python bench/bench_shared_lock.py [--seconds 1.5] [--spins 0,10,20,50] [--writers 1,2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import tempfile
import time

import numpy as np

import replaystore as rs
from replaystore.shared import SharedTable

SPEC = {
    "obs": ((4,), np.float32),
    "action": ((), np.int64),
    "reward": ((), np.float32),
    "next_obs": ((4,), np.float32),
    "done": ((), np.bool_),
}


def batch(n: int) -> dict:
    rng = np.random.default_rng(0)
    return {k: (rng.random((n, *shape)) * 100).astype(dtype) for k, (shape, dtype) in SPEC.items()}


def sleep_cost(calls: int = 20_000) -> None:
    t = rs.Table(200_000, spec=SPEC)
    for _ in range(100):
        t.extend(batch(1000))
    print("| sleep before each call | sample(256) CPU µs |")
    print("|---|---|")
    for nap in (0.0, 5e-6, 20e-6, 100e-6):
        cpu = 0.0
        for _ in range(calls):
            if nap:
                time.sleep(nap)
            c = time.thread_time()
            t.sample(256)
            cpu += time.thread_time() - c
        print(f"| {nap * 1e6:.0f} µs | {cpu / calls * 1e6:.1f} |", flush=True)


def _run(role, name, directory, spin_ns, prioritized, stop_at, q):
    from replaystore.shared import _sync

    _sync.set_spin(spin_ns)
    t = SharedTable.attach(name, directory)
    t.prefault()
    if role == "writer":
        b = batch(8)

        def step():
            t.extend(b)
    else:
        rng = np.random.default_rng(0)

        def step():
            s = t.sample(256)
            if prioritized:
                t.update_priorities(s.keys, rng.random(256) + 0.01)

    step()
    r0, n = resource.getrusage(resource.RUSAGE_SELF), 0
    while time.time() < stop_at:
        step()
        n += 1
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    q.put(
        (
            role,
            n,
            (r1.ru_utime - r0.ru_utime) / n * 1e6,
            (r1.ru_stime - r0.ru_stime) / n * 1e6,
            (r1.ru_nvcsw - r0.ru_nvcsw) / n,
        )
    )
    t.close()


def spin_budgets(seconds: float, spins: list[float], writers: list[int]) -> None:
    directory = tempfile.mkdtemp(prefix="bench-lock-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    print(
        "| sampler | W | spin µs | learner calls | learner CPU µs | writer calls | writer CPU µs "
        "| switches per call (learner / writer) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for prioritized in (False, True):
        for w in writers:
            for spin in spins:
                name = f"lock-{os.getpid()}-{time.time_ns()}"
                sampler = rs.Prioritized(0.6, 0.4) if prioritized else rs.Uniform()
                t = SharedTable.create(name, 200_000, SPEC, sampler=sampler, directory=directory)
                for _ in range(100):
                    t.extend(batch(1000))
                ctx = mp.get_context("fork")
                q = ctx.Queue()
                stop_at = time.time() + 0.5 + seconds
                roles = ["learner"] + ["writer"] * w
                procs = [
                    ctx.Process(target=_run, args=(r, name, directory, int(spin * 1000), prioritized, stop_at, q))
                    for r in roles
                ]
                for p in procs:
                    p.start()
                out = [q.get(timeout=120) for _ in procs]
                for p in procs:
                    p.join(30)
                t.close()
                learner = next(o for o in out if o[0] == "learner")
                ws = [o for o in out if o[0] == "writer"]
                wcalls = sum(o[1] for o in ws)
                wcpu = sum((o[2] + o[3]) * o[1] for o in ws) / wcalls
                wsys = sum(o[3] * o[1] for o in ws) / wcalls
                wsw = sum(o[4] * o[1] for o in ws) / wcalls
                print(
                    f"| {'prioritized' if prioritized else 'uniform'} | {w} | {spin:g} | {learner[1]:,} | "
                    f"{learner[2] + learner[3]:.1f} ({learner[3]:.1f} sys) | {wcalls:,} | "
                    f"{wcpu:.1f} ({wsys:.1f} sys) | "
                    f"{learner[4]:.2f} / {wsw:.2f} |",
                    flush=True,
                )
    os.rmdir(directory)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--spins", default="0,10,20,50", help="spin budgets to compare, µs")
    ap.add_argument("--writers", default="1,2")
    args = ap.parse_args()
    print(f"# bench_shared_lock: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    sleep_cost()
    print()
    spin_budgets(args.seconds, [float(x) for x in args.spins.split(",")], [int(x) for x in args.writers.split(",")])


if __name__ == "__main__":
    main()
