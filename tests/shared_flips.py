"""Single-byte flips of a shared table's header and configuration, attached in a worker process.

Used by ``tests/test_shared_damage.py``. The worker (``python tests/shared_flips.py DIR``) reads
``offset xor`` lines on stdin; for each it restores the pristine segment, flips the byte, attaches,
adds, samples and closes, and prints one line: ``ok``, ``named <class>`` (a ReplayError) or
``other <class> <message>``. A crash (a signal) ends the worker: the caller notes the flip and
starts a new worker for the rest.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np

NAME = "flips"
SPEC = {"obs": ((3,), np.float32), "act": ((), np.int64)}


def make(directory: str, lock: str = "auto"):
    """Create the pristine table in ``directory``, save its segment's bytes as ``pristine``; the table.

    The caller keeps the table open while workers attach (so the directory is never removed).
    """
    import replaystore as rs
    from replaystore.shared import SharedTable

    t = SharedTable.create(NAME, 16, SPEC, sampler=rs.Prioritized(), directory=directory, lock_timeout=1.0, lock=lock)
    for i in range(5):
        t.add({"obs": np.full(3, i, np.float32), "act": i}, priority=1.0 + i)
    seg = Path(directory) / f"replaystore-{NAME}" / "segment"
    shutil.copy(seg, Path(directory) / "pristine")
    return t


def run(directory: str, flips: list[tuple[int, int]], per_flip: float = 2.0) -> dict[tuple[int, int], str]:
    """The outcome of each flip (``crash ...`` for one that killed its worker, ``hang`` when a batch
    took longer than 30 s plus ``per_flip`` seconds a flip)."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out: dict[tuple[int, int], str] = {}
    todo = list(flips)
    while todo:
        p = subprocess.Popen(
            [sys.executable, __file__, directory],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            stdout, stderr = p.communicate("".join(f"{o} {x}\n" for o, x in todo), timeout=30 + per_flip * len(todo))
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
            lines = stdout.splitlines()
            out.update(zip(todo, lines))
            out[todo[len(lines)]] = "hang"
            todo = todo[len(lines) + 1 :]
            continue
        lines = stdout.splitlines()
        out.update(zip(todo, lines))
        if len(lines) < len(todo):
            out[todo[len(lines)]] = f"crash rc={p.returncode} {stderr.strip().splitlines()[-1:]}"
        todo = todo[len(lines) + 1 :]
    return out


def worker(directory: str) -> None:
    import replaystore as rs
    from replaystore.shared import SharedTable

    root = Path(directory)
    pristine = (root / "pristine").read_bytes()
    seg = root / f"replaystore-{NAME}" / "segment"
    for line in sys.stdin:
        off, xor = (int(x) for x in line.split())
        data = bytearray(pristine)
        data[off] ^= xor
        with open(seg, "r+b") as f:
            f.write(data)
        try:
            t = SharedTable.attach(NAME, directory=directory, lock_timeout=0.5)
            try:
                t.add({"obs": np.zeros(3, np.float32), "act": 7}, priority=1.0)
                b = t.sample(2, timeout=0.5)
                act = b.data["act"]  # rows as written: obs is act's value (the added row: zeros, act 7)
                assert np.array_equal(b.data["obs"], np.repeat(np.where(act == 7, 0, act)[:, None], 3, 1))
                t.stats()
            finally:
                t.close()
            out = "ok"
        except rs.ReplayError as e:
            out = f"named {type(e).__name__}"
        except Exception as e:  # noqa: BLE001 - what the test reports
            out = f"other {type(e).__name__} {str(e)[:120]!r}"
        print(out, flush=True)


if __name__ == "__main__":
    worker(sys.argv[1])
