"""Durable served Tables on a real local Ray: writers and a sampler run while the service's process
is killed (SIGKILL, and ``ray.kill`` with restart); after the restart every acknowledged insert is
there, nothing else is half there, and the log goes on."""

import functools
import os
import signal
import threading
import time

import numpy as np
import pytest
from ray_fixtures import start_ray, wait_restarted

import replaystore as rs

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray()
    yield ray
    ray.shutdown()


def until(cond, what, seconds=60.0):
    """Poll ``cond`` (the writer threads' progress) until true; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def rows(ids):
    ids = np.asarray(ids, dtype=np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 64, axis=1).astype(np.float32)}


def table_factory():
    return rs.Table(200_000, sampler=rs.Prioritized(0.6, 0.4), seed=0)


@pytest.mark.parametrize("how", ["sigkill", pytest.param("ray.kill", marks=pytest.mark.slow)])  # ray.kill restarts
# are also in the two tests below
def test_acknowledged_inserts_survive_a_crash(ray_local, tmp_path, how):
    from replaystore import ray as rsr

    name = f"svc-wal-{how.replace('.', '-')}"
    c = rsr.serve(
        {"t": table_factory},
        name=name,
        max_restarts=-1,
        checkpoint_dir=str(tmp_path / "ckpt"),
        wal=rsr.WalConfig(dir=str(tmp_path / "wal"), fsync="always"),
        rpc_grace=60,
    )
    acked: list[list[int]] = [[], []]
    sampled = [0]
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(w):
        i = 0
        while not stop.is_set():
            n = [1, 8, 64][i % 3]
            ids = [w * 10**8 + i + j for j in range(n)]
            try:
                c.extend(rows(ids), priorities=np.full(n, 1.0 + w), timeout=30)
            except (rs.Timeout, rs.Closed) as e:  # no answer: not acknowledged
                errors.append(e)
            else:
                acked[w].extend(ids)
            i += n

    def sampler():
        while not stop.is_set():
            try:
                s = c.sample(16, timeout=1)
            except (rs.Timeout, rs.Closed):
                continue
            sampled[0] += len(s.keys)
            c.update_priorities(s.keys, np.full(len(s.keys), 0.5))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)] + [threading.Thread(target=sampler)]
    for th in threads:
        th.start()
    try:  # (progress is polled, not slept for: a loaded machine may take seconds per call)
        until(lambda: min(len(a) for a in acked) > 0 and sampled[0] > 0, "the writers and the sampler")
        c.save()  # a checkpoint in the middle: the log is truncated, then grows again
        mark = [len(a) for a in acked]
        until(lambda: all(len(acked[w]) > mark[w] for w in range(2)), "writes after the checkpoint")
        before = (len(acked[0]), len(acked[1]))
        if how == "sigkill":
            os.kill(ray_local.get(c.actor.pid.remote(), timeout=30), signal.SIGKILL)
        else:
            ray_local.kill(c.actor, no_restart=False)
        wait_restarted(c)
        # writers go on against the restarted service (bounded: replaying the log may take a while)
        until(lambda: all(len(acked[w]) > before[w] for w in range(2)), "writes after the restart", 90)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    assert min(before) > 0 and len(acked[0]) > before[0]
    keys = c.keys()
    data, found = c.get(keys)
    assert found.all()
    ids = data["id"]
    have = set(ids.tolist())
    for w in range(2):
        missing = set(acked[w]) - have
        assert not missing, f"{len(missing)} acknowledged inserts of writer {w} lost, e.g. {sorted(missing)[:5]}"
    # every row is whole: its payload matches its id (nothing torn made it in)
    assert np.array_equal(data["obs"][:, 0], ids.astype(np.float32))
    assert np.array_equal(data["obs"][:, -1], ids.astype(np.float32))
    assert len(np.unique(keys)) == len(keys)
    # a call retried by Ray after the crash may run twice (at-least-once): duplicates are counted, not lost data
    dup = len(ids) - len(have)
    assert dup <= 64 * 3, dup
    st = c.stats()["t"]
    assert st["samples"] >= sampled[0] * 0.5  # samples logged too (times_sampled survives)
    assert st["wal"]["failing"] == 0 and st["wal"]["last_lsn"] >= st["wal"]["durable_lsn"] > 0
    c.shutdown()


def test_per_table_log_and_checkpoint_by_size(ray_local, tmp_path):
    from replaystore import ray as rsr

    wal = rsr.WalConfig(dir=str(tmp_path / "wal"), fsync="interval", interval=0.01, max_log_bytes=200_000)
    c = rsr.serve(
        {"logged": functools.partial(rs.Table, 10_000), "plain": functools.partial(rs.Table, 10_000)},
        name="svc-wal-tables",
        max_restarts=1,
        checkpoint_dir=str(tmp_path / "ckpt"),
        wal={"logged": wal},
    )
    for i in range(40):  # ~40 x 16 KB: the log passes max_log_bytes and the service checkpoints itself
        c.table("logged").extend(rows(np.arange(64 * i, 64 * (i + 1))), timeout=10)
        c.table("plain").extend(rows(np.arange(64 * i, 64 * (i + 1))), timeout=10)
    c.table("logged").delete(np.arange(10))
    c.table("logged").set_version(4)
    deadline = time.monotonic() + 30
    while not os.path.exists(tmp_path / "ckpt" / "logged" / "manifest.json"):
        assert time.monotonic() < deadline, "no checkpoint by size"
        time.sleep(0.1)
    st = c.stats()
    assert "wal" in st["logged"] and "wal" not in st["plain"]
    ray_local.kill(c.actor, no_restart=False)
    wait_restarted(c)
    assert len(c.table("logged")) == 40 * 64 - 10 and c.stats()["logged"]["version"] == 4
    assert len(c.table("plain")) == 0  # no log, no checkpoint: a restart forgets it
    assert c.stats()["logged"]["wal"]["log_bytes"] < 300_000
    c.shutdown()


def test_object_storage_cannot_be_logged(ray_local, tmp_path):
    from replaystore import ray as rsr

    with pytest.raises(rs.ReplayError):
        rsr.serve(
            {"objs": functools.partial(rs.Table, 10, storage="objects")},
            name="svc-wal-objects",
            wal=rsr.WalConfig(dir=str(tmp_path)),
            start_timeout=60,
        )
    deadline = time.monotonic() + 30
    while True:  # the failed service gave its name back: it can be served again, without the log
        try:
            c = rsr.serve({"objs": functools.partial(rs.Table, 10, storage="objects")}, name="svc-wal-objects")
            break
        except ValueError:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    c.add({"any": object.__name__})
    assert len(c) == 1
    c.shutdown()


@pytest.fixture
def tiny_fs(tmpfs_factory):
    return str(tmpfs_factory("512k"))


def test_full_disk_fails_calls_with_disk_full_and_recovers(ray_local, tmp_path, tiny_fs):
    from replaystore import ray as rsr

    c = rsr.serve(
        functools.partial(rs.Table, 10_000),
        name="svc-wal-full",
        max_restarts=1,
        checkpoint_dir=str(tmp_path),
        wal=rsr.WalConfig(dir=tiny_fs, retry_period=0.05),
    )
    acked = c.extend(rows(np.arange(8)), timeout=10).tolist()
    fd = os.open(os.path.join(tiny_fs, "ballast"), os.O_WRONLY | os.O_CREAT)
    try:  # fill the file system
        while True:
            os.write(fd, b"\1" * 4096)
    except OSError:
        pass
    os.close(fd)
    failed = 0
    for i in range(8, 200, 8):
        try:
            acked += c.extend(rows(np.arange(i, i + 8)), timeout=10).tolist()
        except rs.DiskFull as e:  # through Ray, as itself (also an OSError)
            assert isinstance(e, OSError) and "no space" in str(e)
            failed += 1
            if failed >= 3:
                break
    assert failed >= 3
    assert len(c.keys()) >= len(acked)  # reads go on
    assert c.stats()["default"]["wal"]["failing"] == 1
    os.unlink(os.path.join(tiny_fs, "ballast"))
    deadline = time.monotonic() + 20
    while True:  # the queued records are written once space returns; calls are accepted again
        try:
            acked += c.extend(rows(np.arange(1000, 1008)), timeout=10).tolist()
            break
        except rs.DiskFull:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    ray_local.kill(c.actor, no_restart=False)
    wait_restarted(c)
    assert set(acked) <= set(c.keys().tolist())
    data, _ = c.get(c.keys())
    assert np.array_equal(data["obs"][:, 0], data["id"].astype(np.float32))
    c.shutdown()
