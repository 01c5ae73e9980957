"""Crash and restart: the buffer actor is killed mid-run and resumes from its journal."""

import time

import pytest

pytest.importorskip("ray")
pytest.importorskip("lmdb")

from test_minestudio_helpers import Producer, config, start_ray  # noqa: E402

from replaystore.compat.minestudio import ReplayBufferInterface, create_loader_pool, data_iter  # noqa: E402
from replaystore.storage.fragments import FragmentStore  # noqa: E402

pytestmark = pytest.mark.timeout(240)
S = "session-1"


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray(resources={"database": 1})
    yield ray
    ray.shutdown()


def wait_restarted(buf, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if buf.client.ping()["restarted"]:
            return
        time.sleep(0.2)
    raise AssertionError("the buffer actor did not restart")


def test_kill_mid_run_and_resume(ray_local, tmp_path):
    # clear_on_start=True: a fresh buffer wipes the store, a restarted one must not
    buf = ReplayBufferInterface(
        config(tmp_path, max_restarts=3, max_chunks=100, max_reuse=5, clear_on_start=True, orphan_grace=300.0)
    )
    buf.update_model_version(S, 3)
    producer = ray_local.remote(num_cpus=0)(Producer).remote(3, t=16, img=(32, 32, 3))
    statuses = ray_local.get(producer.produce.remote(3, 3, S), timeout=120)  # 3 x 3 fragments
    assert statuses.count("chunk") == 3
    fetched = buf.fetch_fragments(2, timeout=30)
    before = buf.stats()
    assert before["replay_buffer_size_chunks"] == 3 and before["pending_fragments"] == 3

    # kill the actor while the producer is writing; its calls are retried after the restart
    running = producer.produce.remote(8, 3, S)
    time.sleep(0.3)
    ray_local.kill(buf.actor, no_restart=False)
    statuses = ray_local.get(running, timeout=180)
    assert len(statuses) == 24  # the producer never saw an error
    wait_restarted(buf)
    after = buf.stats()
    assert after["restarts"] == 1
    # every acknowledged fragment survived; retried calls were recognised as duplicates
    assert after["fragments_added"] == before["fragments_added"] + 24
    assert after["model_version"] == 3 and after["session_id"] == S
    # per stream 11 fragments: 5 chunks of 2 and one pending
    assert after["replay_buffer_size_chunks"] == 15 and after["pending_fragments"] == 3
    # the lease handed out before the crash still protects its payloads
    assert buf.prepared_fragments(fetched) == list(fetched)
    for _, fid in fetched:
        assert buf.load_fragment(fid).obs["image"].shape == (16, 32, 32, 3)

    # the run goes on: fetch through loaders, move the version, produce more
    pool = create_loader_pool(2, 0.1)
    records = buf.fetch_fragments(6, timeout=30)
    assert sum(len(b["index"]) for b in data_iter(pool, records, 3, 1, seed=0, timeout=60)) == 6
    buf.update_model_version(S, 4)
    ray_local.get(producer.produce.remote(2, 4, S), timeout=120)
    assert buf.stats()["replay_buffer_size_chunks"] >= 12

    buf.fragments.drain()
    buf.client.shutdown()
    with FragmentStore(tmp_path, 2) as store:
        assert len(store) == 0
    ray_local.kill(producer)
