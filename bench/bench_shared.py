"""Many writer processes and one learner on one host: a SharedTable against its multi-process peers.

Peers (issue 20): cpprb's ``MPReplayBuffer`` and ``MPPrioritizedReplayBuffer`` (shared memory,
explorers add, one learner samples), TorchRL's ``ReplayBuffer(shared=True)`` on a
``LazyMemmapStorage`` (uniform only: its samplers' state is not shared), the Ray service
(``replaystore.ray``: writer and learner Ray actors), and the in-process Table (the limit: the
same calls in one process, no lock round trip; measured alone, after one full cycle of writes so
that its pages are touched, as they are in a long run). ``private`` is the floor the sharing is
measured against: the same processes doing the same calls, each on an in-process Table of its own
(what two busy cores, their caches and memory bandwidth cost without any sharing).

A shared table's processes map its whole segment first (``SharedTable.prefault``: in a long run
every page is mapped after the ring has gone round once; without it a 1-second phase measures the
first-touch page faults of Atari frames, ~5x the copy); cpprb and TorchRL have no equivalent.

Each phase: a buffer (200,000 small transitions, 4,000 Atari frames) prefilled to half, then
``W`` writer processes (forked; Ray actors for the service) call ``extend`` of ``B`` rows in a
loop while one learner process samples 256 (uniform; or prioritized and updates the 256
priorities) for ``--seconds``. Reported
per phase: rows inserted per second (all writers), the writers' CPU time per ``extend`` call, the
learner's batches per second and its CPU time per batch. Payloads: ``small`` transitions (obs
f32[4], action i64, reward f32, next_obs f32[4], done; 45 bytes) and ``atari`` (obs and next_obs
u8[4, 84, 84]: 56 KB). The machine these run on may be loaded: compare ratios of one run.

``--pace L,W``: the learner computes for ``L`` µs before each call (a training step) and each writer
for ``W`` µs (its environment steps), a busy loop as real work is; CPU is then counted around the
calls only (``time.thread_time``), and the in-process table alone is paced the same way. Without
it every process calls back to back: the worst case, where the two kinds of process contend for
one lock every few microseconds.

Usage (the bench venv has cpprb and TorchRL)::

    PYTHONPATH=src bench/.venv/bin/python bench/bench_shared.py [--quick] [--seconds 1]
        [--writers 1,2,4] [--rows 1,8,64,256] [--payloads small,atari]
        [--peers shared,private,cpprb,torchrl,ray]
        [--samplers uniform,prioritized] [--directory DIR] [--pace LEARNER_US,WRITER_US] [--repeat N]
    PYTHONPATH=src bench/.venv/bin/python bench/bench_shared.py --split --seconds 2 [--rows 8] [--pace ...] [--repeat N]
        # the learner's cost, split: a neighbour, shared memory, the same table
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402

import replaystore as rs  # noqa: E402
from replaystore.shared import SharedTable  # noqa: E402

SAMPLE = 256


def spec_of(payload: str) -> dict:
    if payload == "atari":
        frames = ((4, 84, 84), np.uint8)
        return {
            "obs": frames,
            "action": ((), np.int64),
            "reward": ((), np.float32),
            "next_obs": frames,
            "done": ((), np.bool_),
        }
    return {
        "obs": ((4,), np.float32),
        "action": ((), np.int64),
        "reward": ((), np.float32),
        "next_obs": ((4,), np.float32),
        "done": ((), np.bool_),
    }


def batch_of(payload: str, n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for k, (shape, dtype) in spec_of(payload).items():
        out[k] = (rng.random((n, *shape)) * 100).astype(dtype)
    return out


# -- the buffers -------------------------------------------------------------------------------------
class Shared:
    """replaystore.shared.SharedTable."""

    name = "replaystore shared"

    def __init__(self, capacity, payload, prioritized, directory):
        sampler = rs.Prioritized(0.6, 0.4) if prioritized else rs.Uniform()
        self.t = SharedTable.create(
            f"bench-{os.getpid()}", capacity, spec_of(payload), sampler=sampler, directory=directory
        )
        self.prioritized = prioritized

    def writer(self, batch):
        t = self.t
        self.prefault()
        return lambda: t.extend(batch)

    def prefault(self):
        """Map the segment into this (new) process first, as a long-running actor would have."""
        if isinstance(self.t, SharedTable):
            self.t.prefault()

    def learner(self):
        t, rng = self.t, np.random.default_rng(0)
        self.prefault()
        if not self.prioritized:
            return lambda: t.sample(SAMPLE)

        def step():
            s = t.sample(SAMPLE)
            t.update_priorities(s.keys, rng.random(SAMPLE) + 0.01)

        return step

    def close(self):
        self.t.close()


class InProcess(Shared):
    """The in-process Table (measured alone, in this process)."""

    name = "in-process Table"

    def __init__(self, capacity, payload, prioritized, directory):
        sampler = rs.Prioritized(0.6, 0.4) if prioritized else rs.Uniform()
        self.t = rs.Table(capacity, sampler=sampler, spec=spec_of(payload))
        self.prioritized = prioritized

    def close(self):
        pass


class Private(InProcess):
    """An in-process Table in every process, shared by none: the same processes doing the same work.

    The floor for the shared table: what the busy neighbours cost (two cores, their caches and
    memory bandwidth) without any sharing. Each process builds and fills its own table (once
    round the ring, every page touched) before the phase starts.
    """

    name = "in-process Table per process (no sharing)"

    def __init__(self, capacity, payload, prioritized, directory):
        self.args, self.prioritized, self.pid = (capacity, payload, prioritized), prioritized, None

    def _own(self) -> None:
        if self.pid != os.getpid():  # (not a copy-on-write copy of the parent's table)
            capacity, payload, prioritized = self.args
            InProcess.__init__(self, capacity, payload, prioritized, None)
            fill = InProcess.writer(self, batch_of(payload, 256, 99))
            for _ in range(-(-capacity // 256)):
                fill()
            self.pid = os.getpid()

    def writer(self, batch):
        self._own()
        return InProcess.writer(self, batch)

    def learner(self):
        self._own()
        return InProcess.learner(self)


class Cpprb:
    """cpprb MPReplayBuffer / MPPrioritizedReplayBuffer."""

    name = "cpprb MP"

    def __init__(self, capacity, payload, prioritized, directory):
        import cpprb

        env = {k: {"shape": shape or 1, "dtype": dtype} for k, (shape, dtype) in spec_of(payload).items()}
        ctx = mp.get_context("fork")
        cls = cpprb.MPPrioritizedReplayBuffer if prioritized else cpprb.MPReplayBuffer
        self.rb = cls(capacity, env, ctx=ctx)
        self.prioritized = prioritized

    def writer(self, batch):
        rb = self.rb
        return lambda: rb.add(**batch)

    def learner(self):
        rb, rng = self.rb, np.random.default_rng(0)
        if not self.prioritized:
            return lambda: rb.sample(SAMPLE)

        def step():
            s = rb.sample(SAMPLE)
            rb.update_priorities(s["indexes"], rng.random(SAMPLE) + 0.01)

        return step

    def close(self):
        pass


class TorchRL:
    """TorchRL ReplayBuffer(shared=True) on a LazyMemmapStorage (uniform)."""

    name = "TorchRL shared memmap"

    def __init__(self, capacity, payload, prioritized, directory):
        from torchrl.data import LazyMemmapStorage, ReplayBuffer

        if prioritized:
            raise NotImplementedError("its prioritized sampler's state is not shared between processes")
        scratch = tempfile.mkdtemp(dir=directory)  # a directory per phase: its files may not exist yet
        self.rb = ReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=scratch), shared=True, batch_size=SAMPLE)
        self.scratch = scratch

    def writer(self, batch):
        import torch
        from tensordict import TensorDict

        td = TensorDict({k: torch.from_numpy(v) for k, v in batch.items()}, batch_size=[len(batch["obs"])])
        rb = self.rb
        return lambda: rb.extend(td)

    def learner(self):
        return self.rb.sample

    def close(self):
        import shutil

        shutil.rmtree(self.scratch, ignore_errors=True)


# -- one phase ------------------------------------------------------------------------------------------
#: ``--pace``: seconds of busy work before each learner call and each writer call (0: back to back)
PACE = {"learner": 0.0, "writer": 0.0}


def _loop(fn, stop_at, queue, rows):
    fn()  # warm (first-touch, imports)
    work = PACE["writer" if rows else "learner"]
    if work:  # a paced process: compute (a busy loop) between calls; CPU counted around the calls only
        calls, cpu, clock, now = 0, 0.0, time.thread_time, time.perf_counter
        while time.time() < stop_at:
            until = now() + work
            while now() < until:
                pass
            c = clock()
            fn()
            cpu += clock() - c
            calls += 1
        queue.put((calls, calls * rows, cpu))
        return
    calls, c0 = 0, time.process_time()
    while time.time() < stop_at:
        fn()
        calls += 1
    queue.put((calls, calls * rows, time.process_time() - c0))


def _writer_proc(buf, payload, rows, seed, start_at, stop_at, queue):
    fn = buf.writer(batch_of(payload, rows, seed))
    while time.time() < start_at:
        time.sleep(0.001)
    _loop(fn, stop_at, queue, rows)


def _learner_proc(buf, start_at, stop_at, queue):
    fn = buf.learner()
    while time.time() < start_at:
        time.sleep(0.001)
    _loop(fn, stop_at, queue, 0)


def phase(cls, payload, prioritized, writers, rows, seconds, capacity, directory) -> dict:
    buf = cls(capacity, payload, prioritized, directory)
    try:
        fill = buf.writer(batch_of(payload, 256, 99))
        for _ in range(capacity // 2 // 256):
            fill()
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        start_at = time.time() + 0.5
        stop_at = start_at + seconds
        procs = [
            ctx.Process(target=_writer_proc, args=(buf, payload, rows, i, start_at, stop_at, q)) for i in range(writers)
        ]
        procs.append(ctx.Process(target=_learner_proc, args=(buf, start_at, stop_at, q)))
        for p in procs:
            p.start()
        try:
            results = [q.get(timeout=seconds + 60) for _ in procs]
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():  # a peer that did not finish in time: do not leave it running
                    p.kill()
                    p.join(10)
    finally:
        buf.close()
    learner = [r for r in results if r[1] == 0]
    ws = [r for r in results if r[1] != 0]
    calls = sum(r[0] for r in ws) or 1
    return {
        "inserts_s": sum(r[1] for r in ws) / seconds,
        "extend_cpu_us": sum(r[2] for r in ws) / calls * 1e6,
        "batches_s": learner[0][0] / seconds if learner else 0.0,
        "sample_cpu_us": learner[0][2] / max(1, learner[0][0]) * 1e6 if learner else 0.0,
    }


def alone(payload, prioritized, rows, capacity, seconds) -> dict:
    """The in-process Table in this process: extend alone, then sample (+ update) alone."""
    buf = InProcess(capacity, payload, prioritized, None)
    fill = buf.writer(batch_of(payload, 256, 99))
    for _ in range(-(-capacity // 256)):  # one full cycle first: every page touched, as in a long run
        fill()  # (NumPy's first touch of fresh pages, zeroed by the kernel, is not the steady state)
    buf.t.clear()
    for _ in range(capacity // 2 // 256):
        fill()
    out = {}
    for key, fn, n in (("extend", buf.writer(batch_of(payload, rows, 1)), rows), ("sample", buf.learner(), 0)):
        q = _ListQueue()
        _loop(fn, time.time() + seconds / 2, q, n)
        calls, total, cpu = q.items[0]
        out[key + "_cpu_us"] = cpu / max(1, calls) * 1e6
        out[key + "_per_s"] = (total if n else calls) / (seconds / 2)
    return out


def _median(runs: list[dict]) -> dict:
    """Each figure's median over the runs of one phase."""
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


class _ListQueue:
    def __init__(self):
        self.items = []

    def put(self, x):
        self.items.append(x)


def ray_phase(payload, prioritized, writers, rows, seconds, capacity) -> dict:
    """The Ray service: writer actors call client.extend(B) (one call at a time), one learner actor samples."""
    import functools

    from replaystore import ray as rsr

    ray = rsr.init_local(num_cpus=2, include_dashboard=False, log_to_driver=False)
    name = f"bench-shared-{os.getpid()}"
    sampler = rs.Prioritized(0.6, 0.4) if prioritized else rs.Uniform()
    client = rsr.serve({"replay": functools.partial(rs.Table, capacity, sampler=sampler)}, name=name)
    fill = batch_of(payload, 256, 99)
    for _ in range(capacity // 2 // 256):
        client.extend(fill)

    @ray.remote(num_cpus=0)
    class Worker:
        def __init__(self):
            self.c = rsr.connect(name, table="replay")

        def write(self, stop_at, seed):
            c, b = self.c, batch_of(payload, rows, seed)
            calls, c0 = 0, time.process_time()
            while time.time() < stop_at:
                c.extend(b)
                calls += 1
            return calls, calls * rows, time.process_time() - c0

        def learn(self, stop_at):
            c, rng = self.c, np.random.default_rng(0)
            calls, c0 = 0, time.process_time()
            while time.time() < stop_at:
                s = c.sample(SAMPLE, timeout=30)
                if prioritized:
                    c.update_priorities(s.keys, rng.random(SAMPLE) + 0.01)
                calls += 1
            return calls, 0, time.process_time() - c0

    ws = [Worker.remote() for _ in range(writers)]
    lr = Worker.remote()
    ray.get([w.write.remote(0, 0) for w in ws] + [lr.learn.remote(0)])
    stop_at = time.time() + seconds
    refs = [w.write.remote(stop_at, i) for i, w in enumerate(ws)] + [lr.learn.remote(stop_at)]
    *res_w, res_l = ray.get(refs)
    client.shutdown()
    ray.shutdown()
    calls = sum(r[0] for r in res_w) or 1
    return {
        "inserts_s": sum(r[1] for r in res_w) / seconds,
        "extend_cpu_us": sum(r[2] for r in res_w) / calls * 1e6,
        "batches_s": res_l[0] / seconds,
        "sample_cpu_us": res_l[2] / max(1, res_l[0]) * 1e6,
    }


def _split_writer(name, directory, stop_at, rows):
    if name is None:  # private: a table of this process's own, every page its own
        t = rs.Table(200_000, spec=spec_of("small"))
        for _ in range(200_000 // 256):
            t.extend(batch_of("small", 256, 9))
    else:
        t = SharedTable.attach(name, directory=directory)
        t.prefault()
    b = batch_of("small", rows, 1)
    work, now = PACE["writer"], time.perf_counter
    while time.time() < stop_at:
        until = now() + work
        while now() < until:  # (paced: its environment steps)
            pass
        t.extend(b)
    t.close()


def neighbour_split(seconds: float, rounds: int = 2, rows: int = 8) -> None:
    """A learner's sample(256) CPU alone and next to one writer: its own table, another shared one, the same.

    Tells what sharing the table costs the learner from what a busy neighbour process costs
    (``private``: both on in-process tables, no shared memory at all) and from what a busy
    neighbour writing shared memory costs (``another table``). Honours ``--pace``.
    """
    directory = tempfile.mkdtemp(prefix="bench-split-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    spec = spec_of("small")
    mine = SharedTable.create(f"split-a-{os.getpid()}", 200_000, spec, directory=directory)
    other = SharedTable.create(f"split-b-{os.getpid()}", 200_000, spec, directory=directory)
    private = rs.Table(200_000, spec=spec)
    fill = batch_of("small", 256, 9)
    for _ in range(200_000 // 256):  # (once round: every page touched)
        mine.extend(fill)
        other.extend(fill)
        private.extend(fill)
    mine.prefault()
    columns = ("learner alone", "private tables", "writer on another table", "writer on the same table")
    print("| round | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    runs: dict[str, list[float]] = {c: [] for c in columns}
    work, now = PACE["learner"], time.perf_counter
    for r in range(rounds):
        for column, table, writes in zip(columns, (mine, private, mine, mine), (False, None, other, mine)):
            stop_at = time.time() + seconds + 0.3
            p = None
            if writes is not False:
                name = None if writes is None else writes.shared_name
                p = mp.get_context("fork").Process(target=_split_writer, args=(name, directory, stop_at, rows))
                p.start()
            time.sleep(0.3 if writes is not None else 0.6)  # (the private writer fills its table first)
            n, cpu, clock = 0, 0.0, time.thread_time
            while time.time() < stop_at:
                until = now() + work
                while now() < until:  # (paced: its training step)
                    pass
                c = clock()
                table.sample(SAMPLE)
                cpu += clock() - c
                n += 1
            runs[column].append(cpu / max(1, n) * 1e6)
            if p is not None:
                p.join(30)
        print(f"| {r + 1} | " + " | ".join(f"{runs[c][-1]:.1f}" for c in columns) + " |", flush=True)
    print("| median | " + " | ".join(f"{float(np.median(runs[c])):.1f}" for c in columns) + " |")
    mine.close()
    other.close()
    os.rmdir(directory)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--writers", default="1,2,4")
    ap.add_argument("--rows", default="1,8,64,256")
    ap.add_argument("--payloads", default="small,atari")
    ap.add_argument("--peers", default="shared,cpprb,torchrl,ray")
    ap.add_argument("--samplers", default="uniform,prioritized")
    ap.add_argument("--directory", default=None, help="where the shared segments go (default /dev/shm)")
    ap.add_argument(
        "--split", action="store_true", help="only: what sharing the table costs a learner (see neighbour_split)"
    )
    ap.add_argument("--quick", action="store_true", help="one writer count, two batch sizes, small payload")
    ap.add_argument("--repeat", type=int, default=1, help="run every phase this many times; print the medians")
    ap.add_argument(
        "--pace",
        default="0,0",
        help="LEARNER_US,WRITER_US: busy work before each learner / writer call (a training step, env steps); "
        "CPU is then counted around the calls only (not for the Ray service)",
    )
    args = ap.parse_args()
    PACE["learner"], PACE["writer"] = (float(x) * 1e-6 for x in args.pace.split(","))
    if args.split:
        rows = int(args.rows.split(",")[0])
        print(
            f"# learner CPU us per sample(256), one writer extending {rows} rows; pace {args.pace} us; "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        neighbour_split(args.seconds, args.repeat if args.repeat > 1 else 2, rows)
        return
    if args.quick:
        args.writers, args.rows, args.payloads, args.seconds = "1,2", "8,256", "small", min(args.seconds, 0.5)
    peers = {"shared": Shared, "private": Private, "cpprb": Cpprb, "torchrl": TorchRL, "ray": None}
    wanted = args.peers.split(",")
    root = args.directory or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    directory = tempfile.mkdtemp(prefix="bench-shared-", dir=root)
    print(
        f"# bench_shared: {args.seconds}s per phase, load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs (compare ratios within this run); pace {args.pace} us (learner, writer)"
    )
    print(
        "| payload | sampler | W | B | peer | rows/s in | extend CPU us | x in-proc | batches/s | sample CPU us "
        "| x in-proc |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for payload in args.payloads.split(","):
        capacity = 4_000 if payload == "atari" else 200_000
        for sampler in args.samplers.split(","):
            prio = sampler == "prioritized"
            for rows in [int(x) for x in args.rows.split(",")]:
                base = _median([alone(payload, prio, rows, capacity, args.seconds) for _ in range(args.repeat)])
                print(
                    f"| {payload} | {sampler} | - | {rows} | in-process Table (alone) | "
                    f"{base['extend_per_s']:,.0f} | "
                    f"{base['extend_cpu_us']:.1f} | 1.00 | {base['sample_per_s']:,.0f} | "
                    f"{base['sample_cpu_us']:.1f} | 1.00 |",
                    flush=True,
                )
                for w in [int(x) for x in args.writers.split(",")]:
                    for key in wanted:
                        if key == "torchrl" and prio:
                            continue
                        try:
                            if key == "ray":
                                if w > 2 or rows not in (8, 256) or any(PACE.values()):
                                    continue
                                runs = [
                                    ray_phase(payload, prio, w, rows, args.seconds, capacity)
                                    for _ in range(args.repeat)
                                ]
                                r = _median(runs)
                                label = "Ray service"
                            else:
                                r = _median(
                                    [
                                        phase(peers[key], payload, prio, w, rows, args.seconds, capacity, directory)
                                        for _ in range(args.repeat)
                                    ]
                                )
                                label = peers[key].name
                        except Exception as e:  # noqa: BLE001 - a peer that cannot run this row says why
                            print(
                                f"| {payload} | {sampler} | {w} | {rows} | {key} | failed: {type(e).__name__}: "
                                f"{str(e)[:80]} |",
                                flush=True,
                            )
                            continue
                        print(
                            f"| {payload} | {sampler} | {w} | {rows} | {label} | {r['inserts_s']:,.0f} | "
                            f"{r['extend_cpu_us']:.1f} | {r['extend_cpu_us'] / base['extend_cpu_us']:.2f} | "
                            f"{r['batches_s']:,.0f} | {r['sample_cpu_us']:.1f} | "
                            f"{r['sample_cpu_us'] / base['sample_cpu_us']:.2f} |",
                            flush=True,
                        )
    print(
        "# one phase per row (no repeats): run twice to see the noise"
        if args.repeat == 1
        else f"# medians of {args.repeat} phases per row (each figure's median on its own)"
    )
    os.rmdir(directory)


if __name__ == "__main__":
    main()
