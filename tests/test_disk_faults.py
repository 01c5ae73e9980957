"""Full disks, as they happen: small tmpfs mounts filled until a write fails.

Each writer runs in a child process, so a SIGBUS (the old failure: a write through a memory map
into a sparse page of a full file system) shows up as the child's exit status instead of killing
the test run. Needs root (``mount -t tmpfs``); skipped with the reason otherwise.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import uuid

import numpy as np
import pytest

import replaystore as rs

CTX = mp.get_context("spawn")  # a clean interpreter per child: no inherited LMDB environments


@pytest.fixture
def tmpfs(tmpfs_factory):
    """A fresh 2 MiB tmpfs mounted at a temporary directory (unmounted afterwards)."""
    return tmpfs_factory("2m")


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
        q.put(
            (
                "DiskFull",
                isinstance(e, OSError),
                e.errno,
                e.path,
                e.wanted,
                len(t),
                t.stats()["inserts"],
                sorted(os.listdir(f"{directory}/table")),
            )
        )
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


# -- the LMDB fragment store ------------------------------------------------------------------------------
pytest.importorskip("lmdb")
from replaystore.storage.diskspace import allocated_bytes  # noqa: E402
from replaystore.storage.fragments import FragmentStore  # noqa: E402


def du(path) -> int:
    """What the file system holds for every file under ``path``."""
    return allocated_bytes(os.path.join(r, f) for r, _, files in os.walk(path) for f in files)


def payload(i: int, nbytes: int = 150_000) -> dict:
    return {"i": i, "obs": np.full(nbytes, i % 251, np.uint8)}


def _store_writer_until_full(q, path, writemap, filler):
    """Put payloads until the disk is full; report every acknowledged id and the error.

    One shard: pages freed in a shard's file are reused by that shard only (space returns to the
    file system when a shard empties or is compacted).
    """
    store = FragmentStore(path, num_shards=1, writemap=writemap)
    acked = []
    try:
        for i in range(1000):
            acked.append((store.put(payload(i)), i))
        q.put(("never full", acked))
        return
    except rs.DiskFull as e:
        q.put(("DiskFull", e.errno, e.path, e.wanted, acked))
    except Exception as e:  # noqa: BLE001 - reported to the test
        q.put(("other", repr(e), acked))
        return
    # the store still serves: every acknowledged payload reads back, deletes work
    bad = [i for fid, i in acked if store.get(fid)["i"] != i]
    q.put(("read back", bad))
    store.delete([fid for fid, _ in acked[: len(acked) // 2]])
    if filler:  # with writemap a put needs fresh blocks past the file's end, not freed pages
        os.unlink(filler)
    store.put(payload(-1), fragment_id="after-free")  # space came back
    q.put(("recovered", store.get("after-free")["i"]))
    store.close()


@pytest.mark.parametrize("writemap", [False, True], ids=["pwrite", "writemap"])
def test_fragment_store_on_a_full_disk_raises_diskfull_and_keeps_every_acknowledged_payload(tmpfs, writemap):
    path = str(tmpfs / "store")
    filler = fill(tmpfs, leave=1_200_000) if writemap else None
    code, out = run_child(_store_writer_until_full, path, writemap, filler)
    assert code == 0, f"writer died with exit status {code} (-{signal.SIGBUS} is SIGBUS)"
    kind, err, where, wanted, acked = out[0]
    assert kind == "DiskFull" and err == 28 and where.startswith(path) and 150_000 <= wanted < 160_000
    assert len(acked) >= 2
    assert out[1] == ("read back", [])
    assert out[2] == ("recovered", -1)
    # a fresh reader (another process, the same files) sees every payload acknowledged and not deleted
    with FragmentStore(path, num_shards=1) as fresh:
        for fid, i in acked[len(acked) // 2 :]:
            assert fresh.get(fid)["i"] == i
        assert fresh.get("after-free")["i"] == -1
        assert len(fresh) == len(acked) - len(acked) // 2 + 1


def test_fragment_store_options_are_recorded_for_every_process(tmp_path):
    FragmentStore(tmp_path / "s", num_shards=1, writemap=True).close()
    with FragmentStore(tmp_path / "s", num_shards=1) as again:
        assert again.writemap is True
    with pytest.raises(ValueError, match="writemap"):
        FragmentStore(tmp_path / "s", num_shards=1, writemap=False)


# -- disk space follows the live payloads ----------------------------------------------------------------
def test_deleting_every_payload_gives_the_space_back(tmp_path):
    """The issue's case: six 1.5 MB fragments put and deleted left 9-11 MB on disk."""
    path = tmp_path / "store"
    with FragmentStore(path, num_shards=4) as store:
        ids = [store.put(np.random.default_rng(i).bytes(1_500_000)) for i in range(6)]
        peak = du(path)
        assert peak >= 9_000_000 and store.disk_usage() >= 9_000_000
        assert store.delete(ids) == 6
        assert len(store) == 0
        # per shard: a 64 KB lock file and two pages, plus the same for its spare generation
        assert store.disk_usage() < 400_000 and du(path) < 800_000, (peak, du(path))
        fid = store.put(payload(1))  # and it keeps working
        assert store.get(fid)["i"] == 1
    assert du(path) < 800_000 + 200_000  # plus the one live payload


def test_clear_gives_the_space_back_and_other_handles_follow(tmp_path):
    path = tmp_path / "store"
    writer, reader = FragmentStore(path, num_shards=2), FragmentStore(path, num_shards=2)
    ids = [writer.put(payload(i)) for i in range(20)]
    assert reader.get(ids[3])["i"] == 3
    assert du(path) > 3_000_000
    writer.clear()
    assert du(path) < 400_000 and len(reader) == 0  # 2 shards: lock files and empty pages (+ spares)
    fid = reader.put(payload(7))  # the other handle writes into the new generation
    assert writer.get(fid)["i"] == 7
    writer.close(), reader.close()


def test_steady_state_reuses_freed_pages(tmp_path):
    """Put/delete cycles with 20 live payloads: the files stay bounded (LMDB reuses free pages)."""
    with FragmentStore(tmp_path / "s", num_shards=2) as store:
        live: list[str] = []
        sizes = []
        for i in range(600):
            live.append(store.put(payload(i, 100_000)))
            if len(live) > 20:
                store.delete([live.pop(0)])
            if i % 100 == 99:
                sizes.append(store.disk_usage())
        assert max(sizes[1:]) <= 1.2 * sizes[0] + 500_000, sizes  # no growth after warm-up
        assert sizes[-1] < 6 * 20 * 100_000  # within a small factor of the live payloads (2 MB)


def test_compact_online_keeps_every_payload_readable_for_concurrent_readers(tmp_path):
    import threading

    path = tmp_path / "s"
    store = FragmentStore(path, num_shards=2)
    ids = [store.put(payload(i)) for i in range(40)]
    store.delete(ids[:30])  # 30 of 40 gone: most pages are free
    keep = ids[30:]
    before = store.disk_usage()
    errors: list[BaseException] = []
    stop = threading.Event()

    def read_loop() -> None:
        other = FragmentStore(path, num_shards=2)  # another handle, same process: shares the envs
        try:
            while not stop.is_set():
                for j, fid in enumerate(keep):
                    assert other.get(fid)["i"] == 30 + j
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            other.close()

    t = threading.Thread(target=read_loop)
    t.start()
    freed = [store.compact() for _ in range(3)]
    stop.set()
    t.join(30)
    assert not errors, errors
    assert freed[0] > before / 2 and store.disk_usage() < before / 2
    assert [store.get(f)["i"] for f in keep] == list(range(30, 40))
    store.close()


# -- the fragment buffer (the service's state): journal and payloads on one full disk -----------------------
from replaystore.fragments.buffer import FragmentBuffer, FragmentBufferConfig  # noqa: E402

S = "session"


def buffer_config(path, **kw) -> FragmentBufferConfig:
    cfg = dict(
        max_chunks=1000,
        max_staleness=100,
        max_reuse=1000,
        fragments_per_chunk=1,
        path=str(path),
        num_shards=1,
        seed=0,
        journal_reserve=256 << 10,
        lease_ttl=None,
    )
    cfg.update(kw)
    return FragmentBufferConfig(**cfg)


def _service_fills_its_disk(q, path):
    """Producers put and add until the disk is full; the buffer keeps serving fetches and releases."""
    buf = FragmentBuffer(buffer_config(path))
    buf.set_version(S, 0)
    acked = []
    error = None
    for seq in range(1000):
        try:
            fid = buf.store.put(payload(seq))
            buf.add(fid, "env-0", seq, 0, S)
            acked.append(fid)
        except rs.DiskFull as e:
            error = e
            break
    q.put(("full", type(error).__name__, len(acked), buf.stats()["replay_buffer_size_chunks"]))
    lease = buf.fetch(2)  # the journal records it from its reserve
    q.put(("fetched", len(lease.records), all(buf.store.get(r.fragment_id)["i"] == r.seq for r in lease.records)))
    buf.release(lease.lease_id)
    # space comes back: the trainer's version update drops every chunk, their payloads are deleted
    buf.set_version(S, 1000)
    q.put(("dropped", buf.stats()["replay_buffer_size_chunks"], len(buf.store)))
    fid = buf.store.put(payload(7))
    q.put(("added again", buf.add(fid, "env-1", 0, 1000, S), buf.store.get(fid)["i"]))
    buf.close()


def test_service_on_a_full_disk_refuses_inserts_and_keeps_serving(tmpfs):
    code, out = run_child(_service_fills_its_disk, str(tmpfs / "buf"))
    assert code == 0, f"service died with exit status {code}"
    (_, err, n_acked, chunks), fetched, dropped, again = out
    assert err == "DiskFull" and n_acked >= 3 and chunks == n_acked
    assert fetched == ("fetched", 2, True)
    assert dropped == ("dropped", 0, 0)
    assert again == ("added again", "chunk", 7)


def _journal_full_rolls_back(q, path, filler_dir):
    """No journal reserve: a journal write that finds no room raises DiskFull and changes nothing."""
    buf = FragmentBuffer(buffer_config(path, journal_reserve=0))
    buf.set_version(S, 0)
    filler = fill(filler_dir)
    n = 0
    try:
        for seq in range(100_000):  # metadata only: the journal grows until the disk is full
            before = (buf.stats(), buf.journal.load(), len(buf.refs))
            buf.add(f"fragment-{seq:06d}-{'x' * 200}", "env-0", seq, 0, S)
            n += 1
    except rs.DiskFull as e:
        after = (buf.stats(), buf.journal.load(), len(buf.refs))
        q.put(("DiskFull", n, e.path.startswith(path), before == after))
    os.unlink(filler)
    status = buf.add(f"fragment-{n:06d}-{'x' * 200}", "env-0", n, 0, S)
    q.put(("recovered", status, buf.stats()["replay_buffer_size_chunks"]))
    buf.close()


def test_journal_write_on_a_full_disk_changes_nothing(tmpfs):
    code, out = run_child(_journal_full_rolls_back, str(tmpfs / "buf"), str(tmpfs))
    assert code == 0
    kind, n, on_path, unchanged = out[0]
    assert kind == "DiskFull" and on_path and unchanged
    assert out[1] == ("recovered", "chunk", n + 1)
    # a fresh buffer on the same journal resumes every acknowledged chunk
    buf = FragmentBuffer(buffer_config(tmpfs / "buf"))
    assert buf.stats()["replay_buffer_size_chunks"] == n + 1
    buf.close()


def test_buffer_space_returns_after_drain(tmp_path):
    """Drained and closed, the store and journal hold (near) nothing: the issue's 9-11 MB case."""
    buf = FragmentBuffer(buffer_config(tmp_path / "buf", num_shards=4, journal_reserve=1 << 20))
    buf.set_version(S, 0)
    for seq in range(6):
        buf.add(buf.store.put(np.random.default_rng(seq).bytes(1_500_000)), "env-0", seq, 0, S)
    lease = buf.fetch(3)
    peak = du(tmp_path / "buf")
    buf.drain()
    assert lease.lease_id not in buf._leases
    buf.close()
    left, journal = du(tmp_path / "buf"), du(tmp_path / "buf" / "meta")
    assert peak > 9_000_000 and journal < 1_300_000  # the journal keeps its 1 MB reserve
    assert left - journal < 800_000, (peak, left, journal)  # 4 shards: lock files and empty pages (+ spares)


def test_wipe_on_start_gives_the_space_back(tmp_path):
    """``clear_on_start=True`` (a new service, not a restart): store and journal start from empty files."""
    cfg = buffer_config(tmp_path / "buf", num_shards=2, journal_reserve=0, clear_on_start=True, max_chunks=10_000)
    buf = FragmentBuffer(cfg)
    buf.set_version(S, 0)
    for seq in range(6):
        buf.add(buf.store.put(np.random.default_rng(seq).bytes(1_500_000)), "env-0", seq, 0, S)
    for seq in range(3000):  # metadata only: the journal grows
        buf.add(f"meta-{seq:05d}-{'x' * 200}", "meta", seq, 0, S)
    buf.close()
    peak, journal_peak = du(tmp_path / "buf"), du(tmp_path / "buf" / "meta")
    fresh = FragmentBuffer(cfg, resume=False)
    assert fresh.stats()["replay_buffer_size_chunks"] == 0 and len(fresh.store) == 0
    assert peak > 9_000_000 and journal_peak > 500_000
    assert du(tmp_path / "buf" / "meta") < 100_000 and du(tmp_path / "buf") < 600_000, du(tmp_path / "buf")
    fresh.close()


def test_a_reader_racing_a_swap_never_resurrects_the_replaced_generation(tmp_path, monkeypatch):
    """readlink returns the old generation, the swap deletes it before the open: read the link again."""
    import replaystore.storage.fragments as fr

    path = tmp_path / "s"
    writer = FragmentStore(path, num_shards=1)
    old = os.readlink(path / "shard-000")
    writer.clear()  # swaps to a new generation and deletes the old one
    fid = writer.put(payload(5))
    real = fr.read_target
    calls = []

    def stale_once(link):
        calls.append(link)
        return old if len(calls) == 1 else real(link)

    monkeypatch.setattr(fr, "read_target", stale_once)
    reader = FragmentStore.__new__(FragmentStore)  # a handle that has not opened the shard yet
    reader.__dict__.update(
        path=writer.path,
        num_shards=1,
        map_size=writer.map_size,
        sync=False,
        writemap=False,
        shrink_threshold=None,
        _shards=[fr.ShardLink(str(path / "shard-000"))],
        _closed=False,
        shrinks=0,
    )
    assert reader.get(fid)["i"] == 5  # found in the current generation
    assert not (path / old).exists() and len(calls) >= 2
    writer.close()
