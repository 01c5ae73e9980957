"""The write-ahead log and the logged Table, without Ray: format, torn tails, corruption, group
commit, replay equality (hypothesis), a full disk (tmpfs) and a writer killed with SIGKILL."""

import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ray_fixtures import log_then_replay

import replaystore as rs
from replaystore.errors import DiskFull, WalCorrupt
from replaystore.samplers import selector_from_config
from replaystore.wal.log import MAGIC, WalConfig, WriteAheadLog, list_segments, read_log, write_records
from replaystore.wal.logged import LoggedTable


def _records(n, size=16):
    return [(1, {"i": i}, {"x": np.full(size, i, np.float32), "k": np.arange(i, dtype=np.int64)}) for i in range(n)]


def _segment(path):
    segs = list_segments(path)
    assert len(segs) == 1
    return segs[0][1]


def _offsets(fpath):
    """Start offsets of every record in a segment."""
    data = open(fpath, "rb").read()
    pos, out = len(MAGIC), []
    while pos < len(data):
        out.append(pos)
        total = struct.unpack_from("<I", data, pos)[0]
        pos += 20 + total
    return out


def test_round_trip_dtypes(tmp_path):
    arrays = {
        "f": np.arange(6, dtype=np.float16).reshape(2, 3),
        "b": np.array([True, False]),
        "c": np.array([1 + 2j]),
        "u": np.array(["ab", "c"]),
        "s": np.array([b"xy"]),
        "e": np.zeros((0, 4)),
        "t": np.array(np.datetime64("2020-01-01")),
        "nc": np.arange(12).reshape(3, 4)[:, ::2],
    }
    write_records(str(tmp_path), [(3, {"a": [1, "z"]}, arrays)])
    (rec,) = list(read_log(str(tmp_path)))
    assert rec.lsn == 1 and rec.op == 3 and rec.meta == {"a": [1, "z"]}
    for k, v in arrays.items():
        assert rec.arrays[k].dtype == v.dtype and np.array_equal(rec.arrays[k], v), k


def test_object_arrays_are_refused():
    from replaystore.wal.log import check_arrays

    with pytest.raises(TypeError):
        check_arrays({"o": np.array([{}, None], dtype=object)})


def test_torn_tail_is_ignored_and_truncated(tmp_path):
    path = str(tmp_path)
    write_records(path, _records(5))
    fpath = _segment(path)
    offsets = _offsets(fpath)
    size = os.path.getsize(fpath)
    last = offsets[-1]
    for cut in (last + 3, last + 20, last + 40, size - 1):  # inside the frame, the head, the data
        shutil.copy(fpath, fpath + ".bak")
        with open(fpath, "r+b") as f:
            f.truncate(cut)
        assert [r.lsn for r in read_log(path)] == [1, 2, 3, 4]
        wal, recs = WriteAheadLog.open(path, fsync="never")
        assert [r.lsn for r in recs] == [1, 2, 3, 4] and os.path.getsize(fpath) == last
        lsn = wal.append(1, {"i": 99})
        wal.wait(lsn, timeout=10)
        wal.close()
        assert lsn == 5 and [r.meta["i"] for r in read_log(path)] == [0, 1, 2, 3, 99]
        os.replace(fpath + ".bak", fpath)


def test_zero_filled_tail_is_torn(tmp_path):
    path = str(tmp_path)
    write_records(path, _records(3))
    with open(_segment(path), "ab") as f:
        f.write(b"\0" * 4096)
    assert [r.lsn for r in read_log(path)] == [1, 2, 3]


def test_last_record_with_bad_checksum_is_torn_but_a_middle_one_is_corrupt(tmp_path):
    path = str(tmp_path)
    write_records(path, _records(4))
    fpath = _segment(path)
    offsets = _offsets(fpath)
    raw = bytearray(open(fpath, "rb").read())
    last = bytearray(raw)
    last[-3] ^= 0xFF  # in the last record's data
    open(fpath, "wb").write(last)
    assert [r.lsn for r in read_log(path)] == [1, 2, 3]
    for where in (offsets[1] + 2, offsets[1] + 25, offsets[1] + 60, len(MAGIC) + 8):  # frame, head, data
        bad = bytearray(raw)
        bad[where] ^= 0x01
        open(fpath, "wb").write(bad)
        with pytest.raises(WalCorrupt):
            list(read_log(path))
        with pytest.raises(WalCorrupt):
            WriteAheadLog.open(path)
    bad = bytearray(raw)
    bad[3] ^= 1  # the magic
    open(fpath, "wb").write(bad)
    with pytest.raises(WalCorrupt, match="magic"):
        list(read_log(path))


def _craft(lsn, doc, payload=b""):
    js = __import__("json").dumps(doc).encode()
    head = struct.pack("<QBI", lsn, 1, len(js)) + js
    frame16 = struct.pack("<IIII", len(head) + len(payload), len(head), zlib.crc32(head), zlib.crc32(payload))
    return frame16 + struct.pack("<I", zlib.crc32(frame16)) + head + payload


@pytest.mark.parametrize(
    "doc",
    [
        {"_h": [], "_d": [["x", "|O", [1], 0]]},  # an object array: never unpickled
        {"_h": [], "_d": [["x", "<f8", [1000], 0]]},  # claims more bytes than the record has
        {"_h": [], "_d": [["x", "<f8", [-1], 0]]},
        {"_h": [], "_d": [["x", "not a dtype", [1], 0]]},
        {"_h": [], "_d": "nonsense"},
        {"_h": [], "_d": [["x", [["a", "|O"]], [1], 0]]},
    ],
)
def test_tampered_records_with_valid_checksums_are_corrupt(tmp_path, doc):
    path = str(tmp_path)
    with open(os.path.join(path, f"wal-{1:020d}.log"), "wb") as f:
        f.write(MAGIC + _craft(1, doc, b"\x80\x04N." + b"\0" * 4) + _craft(2, {}))
    with pytest.raises(WalCorrupt):
        list(read_log(path))


def test_gaps_are_corrupt(tmp_path):
    path = str(tmp_path)
    with open(os.path.join(path, f"wal-{1:020d}.log"), "wb") as f:
        f.write(MAGIC + _craft(1, {}) + _craft(3, {}))
    with pytest.raises(WalCorrupt, match="expected 2"):
        list(read_log(path))
    other = tmp_path / "b"
    other.mkdir()
    for first, lsns in ((1, [1, 2]), (5, [5])):
        with open(other / f"wal-{first:020d}.log", "wb") as f:
            f.write(MAGIC + b"".join(_craft(i, {}) for i in lsns))
    with pytest.raises(WalCorrupt, match="segment starts at record 5"):
        list(read_log(str(other)))
    # the state is at record 0 but the log starts at 5: records are missing
    os.unlink(other / f"wal-{1:020d}.log")
    with pytest.raises(WalCorrupt, match="missing"):
        WriteAheadLog.open(str(other), after=0)


def test_group_commit_concurrent_appends(tmp_path):
    wal, _ = WriteAheadLog.open(str(tmp_path), fsync="always")
    n_threads, per = 8, 100
    acked = [[] for _ in range(n_threads)]

    def writer(t):
        for i in range(per):
            lsn = wal.append(1, {"t": t, "i": i}, data={"x": np.full(64, i, np.int16)})
            wal.wait(lsn, timeout=30)
            acked[t].append(lsn)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    stats = dict(wal.stats)
    wal.close()
    recs = list(read_log(str(tmp_path)))
    assert [r.lsn for r in recs] == list(range(1, n_threads * per + 1))
    assert stats["records"] == n_threads * per
    assert stats["groups"] == stats["fsyncs"] < stats["records"]  # concurrent calls shared writes
    for t in range(n_threads):  # each thread's records in its own order
        assert [r.meta["i"] for r in recs if r.meta["t"] == t] == list(range(per))


def test_fsync_interval_and_never(tmp_path):
    for policy in ("interval", "never"):
        wal, _ = WriteAheadLog.open(str(tmp_path / policy), fsync=policy, interval=0.05)
        for i in range(50):
            wal.wait(wal.append(1, {"i": i}), timeout=10)
        time.sleep(0.15)
        stats = dict(wal.stats)
        wal.close()
        assert stats["groups"] == 50
        if policy == "interval":
            assert 1 <= stats["fsyncs"] < 50
        else:
            assert stats["fsyncs"] == 0
        assert len(list(read_log(str(tmp_path / policy)))) == 50


def test_rotate_and_drop(tmp_path):
    wal, _ = WriteAheadLog.open(str(tmp_path), fsync="never")
    for i in range(3):
        wal.append(1, {"i": i})
    at = wal.rotate(timeout=10)
    for i in range(3, 5):
        wal.wait(wal.append(1, {"i": i}), timeout=10)
    assert at == 3 and len(list_segments(str(tmp_path))) == 2
    assert wal.drop_through(at) == 1
    wal.close()
    assert [r.lsn for r in read_log(str(tmp_path))] == [4, 5]
    wal2, recs = WriteAheadLog.open(str(tmp_path), after=3)
    assert [r.lsn for r in recs] == [4, 5] and wal2.last_lsn == 5
    wal2.close()
    # a state ahead of the whole log: the log restarts after it
    wal3, recs = WriteAheadLog.open(str(tmp_path), after=9)
    assert recs == [] and wal3.append(1) == 10
    wal3.close()


# -- the logged table ------------------------------------------------------------------------------------------
CONFIGS = {
    "uniform-fifo": dict(),
    "per-uniform-remover": dict(sampler=rs.Prioritized(0.6, 0.4), remover=rs.Uniform(), max_times_sampled=3),
    "without-replacement-minheap": dict(sampler=rs.WithoutReplacement(), remover=rs.MinHeap(), max_staleness=2),
    "queue": "queue",
    "lifo-ratio": dict(sampler=rs.Lifo(), remover=rs.Fifo(), rate_limiter=rs.SampleToInsertRatio(2.0, 1, 1000.0)),
}


def make_table(kind, capacity=40, seed=0):
    cfg = CONFIGS[kind]
    if cfg == "queue":
        return rs.Table.queue(capacity, seed=seed)
    cfg = dict(cfg)
    for k in ("sampler", "remover"):
        if k in cfg:  # a fresh selector per table
            cfg[k] = selector_from_config(cfg[k].config())
    return rs.Table(capacity, seed=seed, **cfg)


def batch(n, start):
    ids = np.arange(start, start + n)
    return {
        "obs": np.repeat(ids[:, None].astype(np.float32), 3, axis=1),
        "id": ids.astype(np.int64),
        "info": {"r": (ids * 0.5).tolist()},
    }


def assert_same(a: rs.Table, b: rs.Table):
    ka, kb = a.keys(), b.keys()
    assert np.array_equal(np.sort(ka), np.sort(kb))
    ia, ib = a.info(ka), b.info(ka)
    for k in ia:
        assert np.array_equal(ia[k], ib[k]), k
    if len(ka):
        da, db = a.get(ka)[0], b.get(ka)[0]
        assert np.array_equal(da["obs"], db["obs"]) and np.array_equal(da["info"]["r"], db["info"]["r"])
    sa, sb = a.stats(), b.stats()
    for k in set(sa) - {"insert_blocked_s", "sample_blocked_s"}:
        assert sa[k] == sb[k], (k, sa[k], sb[k])
    assert a.rate_limiter.state() == b.rate_limiter.state()
    assert a.version == b.version and a.max_priority == b.max_priority and a._next_key == b._next_key
    if isinstance(a.sampler, rs.WithoutReplacement):
        ea = a.sampler.export_state(a._index.key_of_slot)
        eb = b.sampler.export_state(b._index.key_of_slot)
        assert ea["epoch"] == eb["epoch"] and sorted(ea["remaining"]) == sorted(eb["remaining"])


def run_ops(lt: LoggedTable, ops, start=0):
    t = lt.table
    nid = start
    for op, arg in ops:
        try:
            if op == "extend":
                lt.durable("extend", batch(arg, nid), priorities=np.arange(arg) % 5 + 0.5, timeout=0)
                nid += arg
            elif op == "add":
                lt.durable("add", {"obs": np.zeros(3, np.float32), "id": nid, "info": {"r": 1.0}}, timeout=0)
                nid += 1
            elif op == "sample":
                lt.durable("sample", arg, timeout=0)
            elif op == "update":
                keys = t.keys()
                lt.durable("update_priorities", np.concatenate([keys[:arg], [10_000]]), 0.25 * (arg + 1))
            elif op == "delete":
                lt.durable("delete", t.keys()[::arg])
            elif op == "version":
                lt.durable("set_version", t.version + arg)
            elif op == "stale":
                lt.durable("extend", batch(2, nid), version=t.version - 5, timeout=0)
                nid += 2
            elif op == "clear":
                lt.durable("clear")
            elif op == "big":  # larger than the table: a FIFO table keeps the newest, others refuse
                try:
                    lt.durable("extend", batch(45, nid), timeout=0)
                    nid += 45
                except rs.ReplayError as e:
                    assert not isinstance(e, rs.DiskFull | rs.WalCorrupt)
        except rs.Timeout:
            pass
    return nid


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(1, 12)),
        st.tuples(st.just("add"), st.just(0)),
        st.tuples(st.just("sample"), st.integers(1, 6)),
        st.tuples(st.just("update"), st.integers(0, 4)),
        st.tuples(st.just("delete"), st.integers(2, 7)),
        st.tuples(st.just("version"), st.integers(0, 2)),
        st.tuples(st.just("stale"), st.just(0)),
        st.tuples(st.just("clear"), st.just(0)),
        st.tuples(st.just("big"), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(CONFIGS)), ops=OPS, ops2=OPS, checkpoint=st.booleans())
def test_replay_equals_original(kind, ops, ops2, checkpoint):
    d = tempfile.mkdtemp()
    try:
        cfg = WalConfig(dir=d, fsync="never")
        t, lt, restored, lt2, _ = log_then_replay(d, lambda: make_table(kind), run_ops, ops, ops2, checkpoint)
        assert_same(t, restored)
        assert restored.stats()["wal_lsn"] == lt.wal.last_lsn
        # the restored table keeps logging where the first left off
        run_ops(lt2, [("extend", 3), ("sample", 2)], 10_000)
        lt2.close()
        again = rs.Table.load(os.path.join(d, "ckpt")) if checkpoint else make_table(kind)
        LoggedTable.open(again, os.path.join(d, "wal"), cfg).close()
        assert_same(restored, again)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_checkpoint_truncates_the_log(tmp_path):
    cfg = WalConfig(dir=str(tmp_path), fsync="always")
    t = make_table("uniform-fifo", capacity=1000)
    lt = LoggedTable.open(t, str(tmp_path / "wal"), cfg)
    for i in range(20):
        lt.durable("extend", batch(10, 10 * i))
    before = lt.wal.nbytes
    lt.save(str(tmp_path / "ckpt"))
    lt.durable("extend", batch(10, 200))
    assert lt.wal.nbytes < before / 5
    lt.close()
    assert [r.lsn for r in read_log(str(tmp_path / "wal"))] == [21]
    t2 = rs.Table.load(str(tmp_path / "ckpt"))
    LoggedTable.open(t2, str(tmp_path / "wal"), cfg).close()
    assert_same(t, t2)
    # without the checkpoint the log no longer suffices, and says so
    with pytest.raises(WalCorrupt, match="missing"):
        LoggedTable.open(make_table("uniform-fifo", capacity=1000), str(tmp_path / "wal"), cfg)


def test_bad_input_changes_nothing_and_logs_nothing(tmp_path):
    t = make_table("uniform-fifo")
    lt = LoggedTable.open(t, str(tmp_path / "wal"), WalConfig(dir=str(tmp_path)))
    lt.durable("extend", batch(3, 0))
    with pytest.raises(rs.SpecError):
        lt.extend({"obs": np.zeros((2, 3), np.float32)})
    with pytest.raises(rs.SpecError):
        lt.extend({"obs": np.array([object(), object()], dtype=object)})
    with pytest.raises(rs.InvalidPriority):
        lt.extend(batch(2, 3), priorities=[np.nan, 1.0])
    with pytest.raises(rs.SpecError):
        lt.extend([1, 2])
    assert lt.wal.last_lsn == 1 and len(t) == 3
    with pytest.raises(rs.SpecError):
        LoggedTable.open(rs.Table(4, storage="objects"), str(tmp_path / "objs"))
    lt.close()


# -- faults ---------------------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_fs(tmpfs_factory):
    return str(tmpfs_factory("256k"))


def test_full_disk_fails_the_call_then_recovers(tiny_fs):
    cfg = WalConfig(dir=tiny_fs, fsync="always", retry_period=0.05)
    t = make_table("uniform-fifo", capacity=10_000)
    lt = LoggedTable.open(t, os.path.join(tiny_fs, "wal"), cfg)
    ballast = os.path.join(tiny_fs, "ballast")
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
    try:  # fill the file system, then leave a little
        while True:
            os.write(fd, b"\1" * 4096)
    except OSError:
        pass
    os.ftruncate(fd, os.fstat(fd).st_size - 8192)
    os.close(fd)
    acked = []
    failed = None
    for i in range(50):
        try:
            keys = lt.durable("extend", batch(4, 4 * i))
            acked.extend(keys.tolist())
        except DiskFull as e:
            failed = e
            break
    assert failed is not None and isinstance(failed, OSError) and isinstance(failed, rs.ReplayError)
    # while the log cannot write, new calls are refused before changing anything
    size, lsn = len(t), lt.wal.last_lsn
    with pytest.raises(DiskFull):
        lt.extend(batch(4, 1000))
    with pytest.raises(DiskFull):
        lt.sample(1)
    assert len(t) == size and lt.wal.last_lsn == lsn
    os.unlink(ballast)  # space returns: the queued records are written, in order
    deadline = time.monotonic() + 60
    while lt.wal.error is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    keys = lt.durable("extend", batch(4, 2000))
    acked.extend(keys.tolist())
    lt.close()
    t2 = make_table("uniform-fifo", capacity=10_000)
    LoggedTable.open(t2, os.path.join(tiny_fs, "wal"), cfg).close()
    assert set(acked) <= set(t2.keys().tolist())
    assert_same(t, t2)  # the un-acknowledged insert was written once space returned: no hole


_CHILD = r"""
import sys, numpy as np, replaystore as rs
from replaystore.wal.logged import LoggedTable
from replaystore.wal.log import WalConfig
d = sys.argv[1]
lt = LoggedTable.open(rs.Table(100_000, seed=0), d + "/wal", WalConfig(dir=d, fsync=sys.argv[2]))
i = 0
while True:
    n = 1 + i % 64
    ids = np.arange(i, i + n)
    keys = lt.durable("extend", {"id": ids, "x": np.repeat(ids[:, None], 256, axis=1).astype(np.float32)})
    if i % 7 == 0:
        lt.durable("sample", 3)
    sys.stdout.write(f"{ids[-1]}\n")
    sys.stdout.flush()
    i += n
"""


@pytest.mark.parametrize("policy", ["always", "never"])
def test_sigkill_mid_write_loses_nothing_acknowledged(tmp_path, policy):
    d = str(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for delay in (0.6, 1.1):
        shutil.rmtree(d + "/wal", ignore_errors=True)
        p = subprocess.Popen([sys.executable, "-c", _CHILD, d, policy], stdout=subprocess.PIPE, env=env)
        last = -1
        deadline = time.monotonic() + 60
        start = None
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            last = int(line)
            start = start or time.monotonic()
            if time.monotonic() - start > delay:
                os.kill(p.pid, signal.SIGKILL)
                break
        p.wait(30)
        assert last > 0
        t = rs.Table(100_000, seed=0)
        LoggedTable.open(t, d + "/wal", WalConfig(dir=d)).close()
        data, found = t.get(t.keys())
        ids = data["id"]
        # every acknowledged item is there, once; anything after it is a whole, consistent batch
        first = 0 if len(ids) < 100_000 else int(ids[0])  # FIFO eviction once full
        assert np.array_equal(ids, np.arange(first, first + len(ids))) and ids[-1] >= last
        assert np.array_equal(data["x"][:, 0], ids.astype(np.float32))


def test_one_writer_per_log(tmp_path):
    wal, _ = WriteAheadLog.open(str(tmp_path), fsync="never")
    t0 = time.monotonic()
    with pytest.raises(rs.InvalidState, match="in use"):
        WriteAheadLog.open(str(tmp_path), lock_timeout=0.2)
    assert time.monotonic() - t0 < 30
    wal.wait(wal.append(1, {"i": 1}), timeout=10)
    wal.close()  # releases the lock
    wal2, recs = WriteAheadLog.open(str(tmp_path), lock_timeout=0.2)
    assert [r.lsn for r in recs] == [1]
    wal2.close()


@pytest.fixture(scope="module")
def sample_log(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("sample-log"))
    write_records(path, [(1, {"i": i}, {"x": np.arange(i * 7 % 40, dtype=np.float64)}) for i in range(12)])
    fpath = _segment(path)
    return fpath, open(fpath, "rb").read(), _offsets(fpath)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10_000))
def test_any_cut_reads_as_the_records_before_it(tmp_path_factory, sample_log, cut):
    fpath, raw, offsets = sample_log
    cut = min(cut, len(raw))
    d = tmp_path_factory.mktemp("cut")
    with open(d / os.path.basename(fpath), "wb") as f:
        f.write(raw[:cut])
    whole = sum(1 for i, o in enumerate(offsets) if (offsets + [len(raw)])[i + 1] <= cut)
    recs = list(read_log(str(d)))
    assert [r.meta["i"] for r in recs] == list(range(whole))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(0, 10_000), flip=st.integers(1, 255))
def test_any_flipped_byte_is_detected(tmp_path_factory, sample_log, pos, flip):
    fpath, raw, offsets = sample_log
    pos = pos % len(raw)
    bad = bytearray(raw)
    bad[pos] ^= flip
    d = tmp_path_factory.mktemp("flip")
    with open(d / os.path.basename(fpath), "wb") as f:
        f.write(bytes(bad))
    hit = max(i for i, o in enumerate(offsets) if o <= pos) if pos >= offsets[0] else -1
    try:
        recs = list(read_log(str(d)))
    except WalCorrupt:
        return
    # accepted only as a torn tail: the damaged record was the last one and is dropped
    assert hit == len(offsets) - 1 and [r.meta["i"] for r in recs] == list(range(hit))


def test_log_samples_off(tmp_path):
    cfg = WalConfig(dir=str(tmp_path), fsync="never", log_samples=False)
    t = rs.Table.queue(50)
    lt = LoggedTable.open(t, str(tmp_path / "wal"), cfg)
    lt.durable("extend", batch(10, 0))
    s = lt.durable("sample", 4)
    assert len(s.keys) == 4 and len(t) == 6 and lt.wal.last_lsn == 1  # the sample was not logged
    lt.close()
    t2 = rs.Table.queue(50)
    LoggedTable.open(t2, str(tmp_path / "wal"), cfg).close()
    assert len(t2) == 10 and t2.stats()["samples"] == 0  # a restart forgets samples (documented)


def test_a_version_reset_replays(tmp_path):
    """``set_version(v, reset=True)`` below the current version is logged with its flag and replays."""
    import replaystore as rs
    from replaystore.wal.log import WalConfig
    from replaystore.wal.logged import LoggedTable

    cfg = WalConfig(dir=str(tmp_path), fsync="never")
    lt = LoggedTable.open(rs.Table(10, max_staleness=1), str(tmp_path / "wal"), cfg)
    lt.durable("extend", {"x": np.arange(3.0)}, version=[0, 4, 5])
    lt.durable("set_version", 5)
    with pytest.raises(rs.InvalidArgument):
        lt.durable("set_version", 2)
    assert lt.durable("set_version", 2, reset=True) == 0
    lt.close()
    with pytest.raises(rs.Closed):
        lt.durable("set_version", 3)
    again = LoggedTable.open(rs.Table(10, max_staleness=1), str(tmp_path / "wal"), cfg)
    assert again.table.version == 2 and len(again) == 2
    again.close()
