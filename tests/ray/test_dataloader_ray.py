"""ReplayDataset over the Ray service: spawned DataLoader workers sample the one shared table."""

import functools

import numpy as np
import pytest
from ray_fixtures import start_ray, transitions

import replaystore as rs

torch = pytest.importorskip("torch")

from replaystore.integrations.dataloader import ReplayDataset, WorkerSourceError, replay_loader  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def svc(ray_local):
    from replaystore import ray as rsr

    client = rsr.serve({"replay": functools.partial(rs.Table, 200, seed=0)}, name="svc-dataloader")
    yield client
    client.shutdown()


def test_client_without_workers(svc):
    svc.clear()
    svc.extend(transitions(100))
    calls = svc.stats()["replay"]["sample_calls"]
    batches = list(replay_loader(ReplayDataset(svc, batch_size=8, max_batches=5, prefetch=2)))
    assert len(batches) == 5
    for b in batches:
        assert torch.equal(b["data"]["obs"][:, 0].long(), b["data"]["id"])
    assert svc.stats()["replay"]["sample_calls"] - calls == 5


def test_spawned_workers_share_the_service(svc):
    svc.clear()
    svc.extend(transitions(200))
    before = svc.stats()["replay"]
    ds = ReplayDataset(svc, batch_size=16, max_batches=7, prefetch=2)
    loader = replay_loader(ds, num_workers=2, pin_memory=True)
    batches = list(loader)
    assert len(batches) == 7  # 4 from worker 0, 3 from worker 1: the total, not per worker
    after = svc.stats()["replay"]
    assert after["sample_calls"] - before["sample_calls"] == 7
    assert after["samples"] - before["samples"] == 7 * 16
    ids = torch.cat([b["data"]["id"] for b in batches])
    assert ids.min() >= 0 and ids.max() < 200
    # priority updates from the training loop reach the service
    keys = torch.unique(batches[0]["keys"])
    assert ds.update_priorities(keys, torch.full((len(keys),), 3.0)) == len(keys)
    # (a uniform table keeps no per-item priority: its items report 1.0, its max_priority moves)
    assert np.allclose(svc.info(keys.numpy())["priorities"], 1.0)
    assert svc.stats()["replay"]["max_priority_seen"] == 3.0


def test_workers_see_writes_made_while_they_run(svc):
    svc.clear()
    svc.extend(transitions(200))
    ds = ReplayDataset(svc, batch_size=32, prefetch=1)  # endless
    it = iter(replay_loader(ds, num_workers=2, prefetch_factor=1))
    first = next(it)
    assert (first["data"]["id"] < 200).all()
    svc.extend(transitions(200, start=10_000))  # FIFO capacity 200: every old item is evicted
    for _ in range(12):  # batches drawn before the write drain within a few
        b = next(it)
        if (b["data"]["id"] >= 10_000).all():
            break
    assert (b["data"]["id"] >= 10_000).all()
    del it


def test_fork_context_refused(svc):
    ds = ReplayDataset(svc, batch_size=4, max_batches=1)
    with pytest.raises(WorkerSourceError, match="spawn"):
        replay_loader(ds, num_workers=1, multiprocessing_context="fork")


def test_mixed_sampler_with_a_service_source(svc):
    svc.clear()
    svc.extend(transitions(50, start=5000))
    offline = rs.Table(100, seed=0)
    offline.extend(transitions(100))
    mix = rs.MixedSampler({"offline": offline, "online": svc}, ratios=(0.25, 0.75))
    s = mix.sample(40)
    assert s.counts.tolist() == [10, 30]
    assert (s.data["id"][s.rows("online")] >= 5000).all() and (s.data["id"][s.rows("offline")] < 100).all()
    assert mix.update_priorities(s, 2.0)["online"] == len(np.unique(s.keys[s.rows("online")]))
