"""Full disks, as they happen: small tmpfs mounts filled until a write fails.

Each writer runs in a child process, so a SIGBUS (the old failure: a write through a memory map
into a sparse page of a full file system) shows up as the child's exit status instead of killing
the test run. Needs root (``mount -t tmpfs``); skipped with the reason otherwise.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import uuid

import numpy as np
import pytest

import replaystore as rs

CTX = mp.get_context("spawn")  # a clean interpreter per child: no inherited LMDB environments


@pytest.fixture
def tmpfs(tmp_path):
    """A fresh 2 MiB tmpfs mounted at a temporary directory (unmounted afterwards)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}): needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(directory, leave: int = 0) -> str:
    """Fill the file system of ``directory`` up to ``leave`` free bytes with one file; return its path."""
    path = os.path.join(directory, f"filler-{uuid.uuid4().hex}")
    with open(path, "wb") as f:
        chunk = b"\xab" * 65536
        try:
            while True:
                st = os.statvfs(directory)
                free = st.f_bavail * st.f_frsize - leave
                if free <= 0:
                    break
                f.write(chunk[: min(len(chunk), free)])
                f.flush()
        except OSError:
            pass
    return path


def run_child(fn, *args, timeout: float = 60.0):
    """Run ``fn(queue, *args)`` in a spawned child; return ``(exitcode, messages)``."""
    q = CTX.Queue()
    p = CTX.Process(target=fn, args=(q, *args))
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join()
        pytest.fail(f"child {fn.__name__} hung")
    out = []
    while not q.empty():
        out.append(q.get())
    return p.exitcode, out


# -- memmap Tables --------------------------------------------------------------------------------------
def _memmap_writer_after_fill(q, directory):
    """Create a memmap table, insert some items, fill the disk, then write into untouched slots."""
    t = rs.Table(2000, storage=f"memmap:{directory}/table")
    t.extend({"obs": np.arange(10 * 64, dtype=np.float32).reshape(10, 64)})  # 2000 x 256 B = 512 KB reserved
    fill(directory)
    # Without the reservation these pages are holes: the first touch would be a SIGBUS.
    keys = t.extend({"obs": np.ones((1500, 64), np.float32)})
    t.storage.flush()
    q.put(("ok", len(t), int(keys[-1])))


def test_memmap_writes_after_the_disk_filled_cannot_fault(tmpfs):
    code, out = run_child(_memmap_writer_after_fill, str(tmpfs))
    assert code == 0, f"writer died with exit status {code} (-{signal.SIGBUS} is SIGBUS)"
    assert out == [("ok", 1510, 1509)]


def _memmap_writer_too_big(q, directory, filler):
    t = rs.Table(3000, storage=f"memmap:{directory}/table")  # 3000 x 1 KB = 3 MB > the 2 MB tmpfs
    batch = {"obs": np.ones((4, 256), np.float32)}
    try:
        t.extend(batch)
        q.put(("no error",))
        return
    except rs.DiskFull as e:
        q.put(("DiskFull", isinstance(e, OSError), e.errno, e.path, e.wanted, len(t), t.stats()["inserts"],
               sorted(os.listdir(f"{directory}/table"))))
    os.unlink(filler)  # space comes back, the same table works
    t.close()
    q.put(("after", "skip"))


def _memmap_recovers(q, directory):
    t = rs.Table(1000, storage=f"memmap:{directory}/table")  # 1 MB: fits once the filler is gone
    t.extend({"obs": np.ones((4, 256), np.float32)})
    try:
        t.extend({"obs": np.ones((1, 256), np.float32)})
    except rs.DiskFull:
        q.put(("unexpected",))
    q.put(("recovered", len(t)))


def test_memmap_table_creation_on_a_full_disk_raises_diskfull_and_changes_nothing(tmpfs):
    filler = fill(tmpfs, leave=1 << 20)  # about 1 MB left
    code, out = run_child(_memmap_writer_too_big, str(tmpfs), filler)
    assert code == 0
    kind, is_oserror, err, path, wanted, size, inserts, files = out[0]
    assert kind == "DiskFull" and is_oserror and err == 28
    assert path.endswith(".npy") and wanted >= 3000 * 1024
    assert size == 0 and inserts == 0
    assert files == []  # no column file (and no manifest) left behind
    code, out = run_child(_memmap_recovers, str(tmpfs))
    assert code == 0 and out == [("recovered", 5)]


def test_memmap_reopen_reserves_sparse_files(tmpfs):
    """A column file written sparse (by an older version) is reserved on reopen, or refused with DiskFull."""
    d = tmpfs / "t"
    s = rs.MemmapColumnStorage(100, d, {"obs": ((1024,), np.float32)})  # 400 KB
    s.close()
    col = d / "col000.npy"
    size = col.stat().st_size
    col.unlink()
    with open(col, "wb") as f:  # same header, but a sparse body
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (100, 1024)})
        f.truncate(size)
    assert col.stat().st_blocks * 512 < size
    filler = fill(tmpfs, leave=64 << 10)
    with pytest.raises(rs.DiskFull):
        rs.MemmapColumnStorage.open(d)
    os.unlink(filler)
    s = rs.MemmapColumnStorage.open(d)
    assert col.stat().st_blocks * 512 >= size and s.disk_usage() >= size
    s.close()
