"""Faults of the fragment service: leases whose holder died, and a full disk.

Leases expire: a fetch's lease whose holder stopped renewing is released and counted. The buffer
logic first (explicit clocks, no Ray), then the service on a real local Ray instance: a trainer
actor that fetches and is killed with ``ray.kill``, and a live holder that keeps renewing.

Full disk (a real tmpfs): producers write until the disk is full and get ``rs.DiskFull`` (from the
store, or from the service refusing to acknowledge what its journal cannot record); the service
keeps answering fetches, releases and version updates, and accepts writes again once space is back.
One ``ray.init`` serves the whole module.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("lmdb")

import replaystore as rs  # noqa: E402
from replaystore.fragments.buffer import FragmentBuffer, FragmentBufferConfig  # noqa: E402

pytestmark = pytest.mark.timeout(180)
S = "session"


def make_buffer(path, **kw) -> FragmentBuffer:
    cfg = dict(
        max_chunks=8,
        max_staleness=10,
        max_reuse=100,
        fragments_per_chunk=1,
        path=str(path),
        num_shards=1,
        seed=0,
        lease_ttl=10.0,
        orphan_grace=0.0,
        journal_reserve=0,
    )
    cfg.update(kw)
    buf = FragmentBuffer(FragmentBufferConfig(**cfg))
    buf.set_version(S, 0)
    return buf


def fill(buf: FragmentBuffer, n: int) -> list[str]:
    ids = [buf.store.put({"seq": i}) for i in range(n)]
    for i, fid in enumerate(ids):
        buf.add(fid, "env", i, 0, S)
    return ids


# -- the logic ----------------------------------------------------------------------------------------------
def test_unrenewed_lease_is_released_and_counted(tmp_path):
    buf = make_buffer(tmp_path)
    fill(buf, 4)
    lease = buf.fetch(2, client="trainer", now=100.0)
    assert lease.expires == 110.0
    buf.expire(now=109.0)
    assert buf.stats()["leases"] == 1 and buf.counters["leases_expired"] == 0
    buf.expire(now=110.5)
    st = buf.stats()
    assert st["leases"] == 0 and st["leases_expired"] == 1 and st["leases_released"] == 0
    assert len(buf.refs) == 4  # only the chunks hold their payloads now
    with pytest.raises(rs.KeyNotFound):
        buf.renew(lease.lease_id)
    with pytest.raises(rs.KeyNotFound):
        buf.release(lease.lease_id)


def test_renewal_and_fetches_keep_a_lease(tmp_path):
    buf = make_buffer(tmp_path, max_reuse=1)  # chunks retire at once: only the lease holds the payloads
    ids = fill(buf, 4)
    a = buf.fetch(2, client=None, now=0.0)
    assert buf.renew(a.lease_id, now=8.0) == 10.0
    buf.expire(now=15.0)
    assert a.lease_id in buf._leases
    # a client that fetches again renews its other leases (without auto release: client=None per lease,
    # so use a named client with two leases held explicitly)
    b = buf.fetch(1, client="t", now=15.0)
    buf._client_lease.pop("t")  # keep b held when t fetches again (what auto_release=False does)
    c = buf.fetch(1, client="t", now=24.0)
    buf.expire(now=30.0)
    assert b.lease_id in buf._leases and c.lease_id in buf._leases and a.lease_id not in buf._leases
    assert buf.counters["leases_expired"] == 1 and buf.counters["lease_renewals"] == 1
    buf.expire(now=40.0)
    assert buf.stats()["leases"] == 0 and buf.counters["leases_expired"] == 3
    buf.collect_orphans(now=1e12)
    assert len(buf.store) == 0 and not set(ids) & set(buf.store.keys())  # every payload deleted


def test_lease_expiry_survives_a_restart(tmp_path):
    buf = make_buffer(tmp_path)
    fill(buf, 2)
    t = time.time()
    lease = buf.fetch(1, client="x", now=t)
    buf.close()
    again = make_buffer(tmp_path)
    assert again._leases[lease.lease_id].expires == pytest.approx(t + 10.0)
    again.expire(now=t + 11.0)
    assert again.counters["leases_expired"] == 1 and not again._leases
    again.close()


def test_no_ttl_means_leases_never_expire(tmp_path):
    buf = make_buffer(tmp_path, lease_ttl=None)
    fill(buf, 2)
    lease = buf.fetch(1, now=0.0)
    assert lease.expires is None and buf.renew(lease.lease_id) == float("inf")
    buf.expire(now=1e12)
    assert lease.lease_id in buf._leases
    with pytest.raises(ValueError):
        FragmentBufferConfig(max_chunks=1, max_staleness=0, max_reuse=1, lease_ttl=0)


# -- the service on Ray: a killed trainer, a live one -----------------------------------------------------------
@pytest.fixture(scope="module")
def ray_local():
    from ray_fixtures import start_ray

    ray = start_ray()
    yield ray
    ray.shutdown()


class Trainer:
    """A trainer actor that fetches and holds the lease (until it is killed)."""

    def __init__(self, service: str) -> None:
        from replaystore import ray as rsr

        self.fc = rsr.connect(service).fragments

    def fetch(self, n: int) -> str:
        return self.fc.fetch(n, timeout=30).lease_id


@pytest.fixture
def lease_ttl():
    """The service's lease time-to-live (seconds); a test may override it."""
    return 1.5


@pytest.fixture
def service(ray_local, tmp_path, lease_ttl):
    from replaystore import ray as rsr

    cfg = FragmentBufferConfig(
        max_chunks=16,
        max_staleness=10,
        max_reuse=100,
        fragments_per_chunk=1,
        path=str(tmp_path / "store"),
        num_shards=1,
        seed=0,
        lease_ttl=lease_ttl,
        journal_reserve=1 << 20,
    )
    client = rsr.serve(name="lease-test", fragments=cfg, housekeeping_period=0.25)
    fc = client.fragments
    fc.update_model_version(S, 0)
    for i in range(4):
        fc.write({"obs": np.full(1000, i, np.uint8)}, "env", i, 0, S)
    yield client
    client.shutdown()


def wait_for(predicate, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def test_killed_trainer_lease_is_released_after_the_ttl(ray_local, service):
    fc = service.fragments
    trainer = ray_local.remote(num_cpus=0)(Trainer).remote("lease-test")
    lease = ray_local.get(trainer.fetch.remote(2), timeout=60)
    st = fc.stats()
    assert st["leases"] == 1 and st["leases_expired"] == 0 and st["referenced_payloads"] == 4
    ray_local.kill(trainer)
    t0 = time.monotonic()
    st = wait_for(lambda: (s := fc.stats())["leases_expired"] == 1 and s, 60, "the dead trainer's lease to expire")
    assert time.monotonic() - t0 >= 0.5  # not before its time-to-live (1.5 s from the fetch)
    assert st["leases"] == 0 and st["leases_released"] == 0
    with pytest.raises(rs.KeyNotFound):
        fc.renew(lease)


@pytest.mark.parametrize("lease_ttl", [3.0])  # a renewal may be late by ttl - period: 2.75 s on a loaded machine
def test_live_holder_keeps_its_lease_by_renewing(ray_local, service):
    from replaystore import ray as rsr

    fc = rsr.connect("lease-test").fragments
    fetch = fc.fetch(2, timeout=30)
    t0 = time.monotonic()
    with fc.keep_alive(fetch, period=0.25):
        # well past the 3 s time-to-live, and renewed several times (however slow the calls are)
        wait_for(lambda: time.monotonic() - t0 > 7.0 and fc.stats()["lease_renewals"] >= 4, 60, "renewals")
        st = fc.stats()
        assert st["leases"] == 1 and st["leases_expired"] == 0
        assert all(fc.load(r.fragment_id)["obs"][0] == r.seq for r in fetch.records)
    wait_for(lambda: fc.stats()["leases_expired"] == 1, 60, "the lease to expire once renewals stop")


# -- the service on a full disk --------------------------------------------------------------------------
@pytest.fixture
def tmpfs(tmpfs_factory):
    return tmpfs_factory("3m")


def test_service_on_a_full_disk(ray_local, tmpfs):
    from replaystore import ray as rsr

    cfg = FragmentBufferConfig(
        max_chunks=1000,
        max_staleness=10_000,
        max_reuse=1000,
        fragments_per_chunk=1,
        path=str(tmpfs / "store"),
        num_shards=1,
        seed=0,
        lease_ttl=None,
        journal_reserve=128 << 10,
    )
    client = rsr.serve(name="full-disk", fragments=cfg, housekeeping_period=0)
    try:
        fc = client.fragments
        fc.update_model_version(S, 0)
        acked = []
        with pytest.raises(rs.DiskFull) as info:
            for seq in range(1000):
                acked.append(fc.write({"seq": seq, "obs": np.full(150_000, seq % 251, np.uint8)}, "env", seq, 0, S))
        assert info.value.errno == 28 and info.value.path.startswith(str(tmpfs))
        assert len(acked) >= 5
        # the journal's reserve still records acknowledgements of payloads already stored ...
        assert fc.stats()["replay_buffer_size_chunks"] == len(acked)
        # ... until it cannot be kept: then the service refuses (DiskFull through Ray), never acknowledges
        with pytest.raises(rs.DiskFull, match="journal"):
            for seq in range(len(acked), len(acked) + 5000):
                fc.add(f"no-payload-{seq:05d}-{'x' * 300}", "meta-only", seq, 0, S)
        st = fc.stats()
        assert st["journal_low_space"] is True
        n_chunks = st["replay_buffer_size_chunks"]
        # the service keeps serving: ping, stats, fetch (recorded from the reserve), loads, release
        assert client.ping()["fragments"]
        fetch = fc.fetch(4, timeout=30)
        for r in fetch.records:
            if r.stream == "env":
                assert fc.load(r.fragment_id)["seq"] == r.seq
        assert fc.release(fetch) == 4
        assert fc.stats()["replay_buffer_size_chunks"] == n_chunks
        # space comes back when the trainer moves on: stale chunks dropped, payloads deleted
        fc.update_model_version(S, 100_000)
        st = fc.stats()
        assert st["replay_buffer_size_chunks"] == 0 and st["payloads_deleted"] >= len(acked)
        fid = fc.write({"seq": 0, "obs": np.zeros(150_000, np.uint8)}, "env-2", 0, 100_000, S)
        assert fc.load(fid)["seq"] == 0 and fc.stats()["journal_low_space"] is False
    finally:
        client.shutdown()
