"""ReplayDataset over an in-process Table: DataLoader with num_workers=0, pin_memory, worker errors."""

import warnings

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions

torch = pytest.importorskip("torch")

from replaystore.integrations.dataloader import (  # noqa: E402
    ReplayDataset,
    WorkerSourceError,
    replay_loader,
)


def test_table_batches_are_tensors_of_sampled_items():
    t = rs.Table(1000, sampler=rs.Prioritized(0.6, 0.4), seed=0)
    t.extend(transitions(500))
    ds = ReplayDataset(t, batch_size=32, max_batches=7, prefetch=3)
    batches = list(replay_loader(ds))
    assert len(batches) == 7
    for b in batches:
        assert set(b) == {
            "data",
            "keys",
            "indices",
            "probabilities",
            "weights",
            "priorities",
            "times_sampled",
            "versions",
        }
        assert b["data"]["obs"].shape == (32, 4) and b["data"]["obs"].dtype == torch.float32
        assert b["keys"].dtype == torch.int64 and b["weights"].dtype == torch.float64
        # the data row is the item of its key (ids were inserted as keys 0..499)
        assert torch.equal(b["data"]["id"], b["keys"])
        assert torch.equal(b["data"]["obs"][:, 0], b["keys"].float())
    assert t.stats()["sample_calls"] == 7
    assert t.stats()["samples"] == 7 * 32


def test_priority_updates_go_back_to_the_table():
    t = rs.Table(100, sampler=rs.Prioritized(1.0, 0.4), seed=0)
    t.extend(transitions(10))
    ds = ReplayDataset(t, batch_size=8, max_batches=1)
    b = next(iter(replay_loader(ds)))
    keys = torch.unique(b["keys"])
    assert ds.update_priorities(keys, torch.full((len(keys),), 5.0)) == len(keys)
    assert np.allclose(t.info(keys.numpy())["priorities"], 5.0)


def test_loader_sees_items_written_while_it_runs():
    t = rs.Table(50, seed=1)
    t.extend(transitions(50))
    ds = ReplayDataset(t, batch_size=16, prefetch=1)
    it = iter(replay_loader(ds))
    next(it)
    t.extend(transitions(50, start=1000))  # evicts every old item (FIFO, capacity 50)
    for _ in range(5):  # at most prefetch + 1 batches drawn before the write
        b = next(it)
    assert (b["data"]["id"] >= 1000).all()
    del it


def test_pin_memory_without_accelerator_is_passed_through_and_warns():
    assert not torch.cuda.is_available()
    t = rs.Table(100, seed=0)
    t.extend(transitions(100))
    loader = replay_loader(ReplayDataset(t, batch_size=4, max_batches=2), pin_memory=True)
    assert loader.pin_memory is True
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        batches = list(loader)
    assert len(batches) == 2
    assert not batches[0]["data"]["obs"].is_pinned()
    assert any("pin_memory" in str(x.message) for x in w)


def test_table_with_workers_raises_named_error():
    t = rs.Table(100, seed=0)
    t.extend(transitions(100))
    ds = ReplayDataset(t, batch_size=4, max_batches=2)
    with pytest.raises(WorkerSourceError, match="num_workers=2"):
        replay_loader(ds, num_workers=2)
    # a hand-built DataLoader with (forked) workers: the worker raises, the loader re-raises it
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(WorkerSourceError, match="worker"):
        list(loader)
    assert t.stats()["sample_calls"] == 0


def test_bad_arguments():
    t = rs.Table(10)
    with pytest.raises(TypeError):
        ReplayDataset({"not": "a table"}, batch_size=4)
    for kw in ({"batch_size": 0}, {"batch_size": 4, "prefetch": 0}, {"batch_size": 4, "max_batches": -1}):
        with pytest.raises(ValueError):
            ReplayDataset(t, **kw)


def test_timeout_surfaces_from_the_loader():
    t = rs.Table(10, rate_limiter=rs.MinSize(5))
    ds = ReplayDataset(t, batch_size=2, max_batches=1, timeout=0.2)
    with pytest.raises(rs.Timeout):
        list(replay_loader(ds))


def test_mixed_sampler_source_offline_to_online():
    offline = rs.Table(1000, seed=0)
    offline.extend(transitions(300))
    online = rs.Table(1000, sampler=rs.Prioritized(1.0, 0.4), seed=1)
    online.extend(transitions(50, start=5000))
    mix = rs.MixedSampler({"offline": offline, "online": online}, ratios=(0.5, 0.5))
    ds = ReplayDataset(mix, batch_size=10, max_batches=4)
    batches = list(replay_loader(ds))
    assert len(batches) == 4
    for b in batches:
        assert b["counts"].tolist() == [5, 5] and list(b["names"]) == ["offline", "online"]
        assert (b["data"]["id"][b["source"] == 0] < 300).all() and (b["data"]["id"][b["source"] == 1] >= 5000).all()
    assert offline.stats()["samples"] == 20 and online.stats()["samples"] == 20
    b = batches[-1]
    applied = ds.update_priorities(b, torch.full((10,), 4.0))
    assert applied == {"offline": len(torch.unique(b["keys"][:5])), "online": len(torch.unique(b["keys"][5:]))}
    assert np.allclose(online.info(b["keys"][5:].numpy())["priorities"], 4.0)
    with pytest.raises(rs.InvalidPriority):
        ds.update_priorities(b, torch.full((10,), float("nan")))
    with pytest.raises(rs.InvalidArgument):
        ds.update_priorities(b["keys"], torch.ones(10))
    with pytest.raises(WorkerSourceError):
        replay_loader(ds, num_workers=1)
