"""MineStudio compat on a real local Ray instance: producers, a trainer, version updates."""

import threading
import time
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("lmdb")

from test_minestudio_helpers import Producer, config, make_fragment, start_ray  # noqa: E402

import replaystore as rs  # noqa: E402
from replaystore.compat.minestudio import (  # noqa: E402
    FragmentIndex,
    FragmentMetadata,
    ReplayBufferInterface,
    create_loader_pool,
    data_iter,
)
from replaystore.storage.fragments import FragmentStore  # noqa: E402

pytestmark = pytest.mark.timeout(240)
S1, S2 = "session-1", "session-2"


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray(resources={"database": 1})
    yield ray
    ray.shutdown()


@pytest.fixture
def buffer(ray_local, tmp_path):
    buf = ReplayBufferInterface(config(tmp_path))
    yield buf
    buf.client.shutdown()


def test_create_and_connect_errors(buffer, tmp_path):
    with pytest.raises(ValueError, match="already initialized"):
        ReplayBufferInterface(config(tmp_path / "other"))
    other = ReplayBufferInterface()
    assert other.database_config == {"path": str(tmp_path), "num_shards": 2}
    assert other.store.local


def test_not_initialized(ray_local):
    with pytest.raises(ValueError, match="not initialized"):
        ReplayBufferInterface()


def test_online_run_staleness_reuse_eviction(ray_local, buffer, tmp_path):
    """Three producer actors write 64-step 128x128x3 fragments while the trainer fetches."""
    producers = [ray_local.remote(num_cpus=0)(Producer).remote(2) for _ in range(3)]
    buffer.update_model_version(S1, 0)
    pool = create_loader_pool(2, 0.1)
    seen = Counter()
    fetched_versions = []
    for version in range(4):
        refs = [p.produce.remote(2, version, S1) for p in producers]  # 2 fragments x 2 envs each
        records = buffer.fetch_fragments(4, timeout=120)
        assert len(records) == 4 and all(isinstance(i, FragmentIndex) for i, _ in records)
        assert buffer.prepared_fragments() == list(records)
        n = 0
        for batch in data_iter(pool, records, batch_size=3, prefetch_batches=1, seed=version, timeout=60):
            for idx, frag in zip(batch["index"], batch["fragment"]):
                assert frag.index == idx and frag.obs["image"].shape == (64, 128, 128, 3)
                assert frag.obs["image"].flags.writeable  # copied out of Ray's object store
                fetched_versions.append((version, int(frag.reward[0])))
                seen[idx] += 1
                n += 1
        assert n == 4
        ray_local.get(refs, timeout=120)
        buffer.update_model_version(S1, version + 1)
    # staleness: a fragment fetched while the model was at v has version >= v - max_staleness
    assert all(fv >= v - 1 for v, fv in fetched_versions)
    # reuse: no fragment fetched more than max_reuse times
    assert max(seen.values()) <= 2
    st = buffer.stats()
    assert st["replay_buffer_size_chunks"] <= 12
    assert st["fragments_added"] == 4 * 3 * 2 * 2
    assert st["chunks_dropped_stale"] + st["chunks_evicted"] + st["chunks_retired"] > 0
    # eviction: fill beyond max_chunks
    ray_local.get([p.produce.remote(10, 4, S1) for p in producers], timeout=180)
    st = buffer.stats()
    assert st["replay_buffer_size_chunks"] == 12 and st["chunks_evicted"] > 0
    for p in producers:
        ray_local.kill(p)


def test_session_change_and_timeout(ray_local, buffer):
    buffer.update_model_version(S1, 0)
    w = "env-0"
    for fid in range(4):
        buffer.add_fragment(make_fragment(w, fid, 0, t=4, img=(8, 8, 3)), FragmentMetadata(0, S1, w, fid))
    assert buffer.stats()["replay_buffer_size_chunks"] == 2
    assert buffer.update_model_version(S2, 0) == 2  # another session: every chunk dropped
    status = buffer.add_fragment(make_fragment(w, 4, 0, t=4, img=(8, 8, 3)), FragmentMetadata(0, S1, w, 4))
    assert status == "stale"
    t0 = time.monotonic()
    with pytest.raises(rs.Timeout):
        buffer.fetch_fragments(2, timeout=1.0)
    assert time.monotonic() - t0 < 60  # the 1 s timeout ended the wait
    with pytest.raises(ValueError):
        buffer.fetch_fragments(3)  # not a multiple of fragments_per_chunk


def test_out_of_order_and_duplicates_do_not_kill_the_caller(ray_local, buffer):
    buffer.update_model_version(S1, 0)
    w = "env-x"

    def add(fid):
        return buffer.add_fragment(make_fragment(w, fid, 0, t=4, img=(8, 8, 3)), FragmentMetadata(0, S1, w, fid))

    assert add(0) == "pending"
    assert add(0) == "duplicate"  # a retry after a crash
    assert add(3) == "pending"  # a gap: the partial chunk restarts at 3
    assert add(4) == "chunk"
    assert add(2) == "duplicate"  # late and out of order
    st = buffer.stats()
    assert st["duplicates"] == 2 and st["gaps"] == 1 and st["fragments_dropped_gap"] == 1
    records = buffer.fetch_fragments(2, timeout=10)
    assert [i.fid_in_worker for i, _ in records] == [3, 4]


def test_concurrent_fetchers_keep_their_own_fragments(ray_local, buffer, tmp_path):
    buffer.update_model_version(S1, 0)
    for k in range(6):
        w = f"env-{k}"
        for fid in range(2):
            buffer.add_fragment(make_fragment(w, fid, 0, t=4, img=(8, 8, 3)), FragmentMetadata(0, S1, w, fid))
    other = ReplayBufferInterface()
    results = {}

    def fetch(name, iface):
        results[name] = iface.fetch_fragments(4, timeout=30)

    threads = [threading.Thread(target=fetch, args=(n, i)) for n, i in (("a", buffer), ("b", other))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    a, b = results["a"], results["b"]
    assert buffer.prepared_fragments(a) == list(a) and other.prepared_fragments(b) == list(b)
    assert buffer.prepared_fragments() in (list(a), list(b))  # the original's "last fetch"
    # both stay readable, whoever fetched last
    for _, fid in list(a) + list(b):
        assert buffer.load_fragment(fid).obs["image"].shape == (4, 8, 8, 3)
    # a's next fetch releases a's previous lease only
    buffer.fetch_fragments(2, timeout=30)
    for _, fid in b:
        other.load_fragment(fid)
    assert other.release(b) == 4
    with pytest.raises(rs.KeyNotFound):
        other.release(b)


def test_no_file_left_behind_after_drain(ray_local, tmp_path):
    buf = ReplayBufferInterface(config(tmp_path, max_reuse=1))
    buf.update_model_version(S1, 0)
    for k in range(4):
        for fid in range(3):  # the third fragment of each stream stays in a partial chunk
            buf.add_fragment(make_fragment(f"e{k}", fid, 0, t=4, img=(8, 8, 3)), FragmentMetadata(0, S1, f"e{k}", fid))
    orphan = buf.store.add_fragment("written but never acknowledged")
    fetched = buf.fetch_fragments(4, timeout=10)  # retired at once (max_reuse=1) but leased
    assert all(buf.load_fragment(fid) is not None for _, fid in fetched)
    assert buf.stats()["referenced_payloads"] == 12
    buf.fragments.drain()
    buf.fragments.housekeeping()  # orphans older than orphan_grace (0 s here) go too
    with FragmentStore(tmp_path, 2) as store:
        assert len(store) == 0, list(store.keys())
    with pytest.raises(rs.KeyNotFound):
        buf.load_fragment(orphan)
    buf.client.shutdown()


@pytest.mark.parametrize("local", [False, True], ids=["actor-loaders", "local-threads"])
def test_loader_iterator_contract(ray_local, buffer, local):
    buffer.update_model_version(S1, 0)
    for k in range(5):
        for fid in range(2):
            buffer.add_fragment(
                make_fragment(f"L{k}", fid, 0, t=4, img=(8, 8, 3)), FragmentMetadata(0, S1, f"L{k}", fid)
            )
    records = buffer.fetch_fragments(10, timeout=10)
    pool = create_loader_pool(2, 0.1, local=local)
    sizes = [len(b["index"]) for b in data_iter(pool, records, 4, 1, seed=1, timeout=30)]
    assert sizes == [4, 4, 2]  # the final partial batch is included
    # early close leaves the pool usable
    it = data_iter(pool, records, 2, 2, seed=1, timeout=30)
    next(it)
    it.close()
    assert sum(len(b["index"]) for b in data_iter(pool, records, 5, 0, timeout=30)) == 10
    stacked = next(iter(data_iter(pool, records[:2], 2, 0, timeout=30)))
    assert isinstance(stacked["fragment"], list) and np.all([f.first[0] for f in stacked["fragment"]])
    f = stacked["fragment"][0]
    assert f.obs["image"].flags.writeable and f.action["camera"].flags.writeable  # owned, not views of shared memory
    buffer.release(records)
    buffer.fragments.drain()  # the chunks held the payloads too (max_reuse=2)
    with pytest.raises(rs.KeyNotFound):
        list(data_iter(pool, records, 2, 0, timeout=30))
    assert sum(1 for _ in data_iter(pool, [], 2, 0, timeout=30)) == 0  # the pool is still usable
    if local:
        pool.close()
