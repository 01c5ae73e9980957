"""A shard killed (SIGKILL) while writers and a learner run: waited for, or skipped.

Each shard has its own write-ahead log; Ray restarts the killed shard, which replays its log, so
every insert acknowledged to a writer is there afterwards. With ``on_dead="skip"`` the writers and
the learner go on with the other shard while it is down.
"""

import os
import signal
import threading
import time
import uuid

import numpy as np
import pytest
from ray_fixtures import start_ray, wait_restarted

import replaystore as rs
from replaystore import ray as rsr

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray(namespace=f"sharded-faults-{uuid.uuid4().hex[:8]}")
    yield ray
    ray.shutdown()


def rows(ids):
    ids = np.asarray(ids, dtype=np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 8, axis=1).astype(np.float32)}


def factory():
    return rs.Table(100_000, sampler=rs.Prioritized(0.6, 0.4), seed=0)


@pytest.mark.parametrize("on_dead", ["wait", pytest.param("skip", marks=pytest.mark.slow)])  # skip: also in
# test_sharded_cluster.py (a removed node), slow
def test_sigkilled_shard_loses_no_acknowledged_insert(ray_local, tmp_path, on_dead):
    c = rsr.serve_sharded(
        factory,
        2,
        name=f"kill-{uuid.uuid4().hex[:6]}",
        max_restarts=-1,
        checkpoint_dir=str(tmp_path / "ck"),
        on_dead=on_dead,
        skip_after=0.5,
        seed=0,
        wal=rsr.WalConfig(dir=str(tmp_path / "wal"), fsync="never"),
    )
    acked: dict[int, int] = {}  # global key -> id
    errors: list[BaseException] = []
    stop = threading.Event()
    killed = threading.Event()
    during: list[np.ndarray] = []  # keys sampled while the shard was down (skip mode)
    lock = threading.Lock()

    def writer(w):
        i = 0
        while not stop.is_set():
            ids = np.arange(w * 10**6 + i, w * 10**6 + i + 16)
            try:
                keys = c.extend(rows(ids), priorities=np.ones(16), timeout=60)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                return
            with lock:
                acked.update(zip(keys.tolist(), ids.tolist()))
            i += 16

    def learner():
        while not stop.is_set():
            try:
                s = c.sample(32, timeout=60)
                if killed.is_set():
                    during.append(s.keys)
                c.update_priorities(s.keys, np.full(len(s.keys), 2.0))
            except rs.KeyNotFound:
                pass
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                return

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)] + [threading.Thread(target=learner)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60  # some inserts acknowledged (polled: a loaded machine is slow)
        while len(acked) < 64:
            assert time.monotonic() < deadline and not errors, errors
            time.sleep(0.05)
        pid = c.shards[1].actor.pid.remote()
        import ray

        os.kill(ray.get(pid, timeout=30), signal.SIGKILL)
        killed.set()
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a writer or the learner hung"
        assert not errors, errors
        wait_restarted(c.shards[1])
        keys = np.array(sorted(acked), dtype=np.int64)
        assert len(keys) > 0
        data, found = c.get(keys)
        assert found.all(), f"{(~found).sum()} acknowledged inserts lost"
        np.testing.assert_array_equal(data["id"], [acked[k] for k in keys.tolist()])
        np.testing.assert_array_equal(data["obs"][:, 0], data["id"].astype(np.float32))
        st = c.stats()
        assert st["total"]["size"] == sum(x["size"] for x in st["shards"]) >= len(keys)
        if on_dead == "skip":
            assert during, "the learner sampled nothing while a shard was down"
        c.sample(64, timeout=30)  # both shards serve again
    finally:
        stop.set()
        c.shutdown()
