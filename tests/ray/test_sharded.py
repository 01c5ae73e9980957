"""Sharded tables on a real local Ray: one logical table over N shard services.

The distribution test compares the sharded table with one Table holding the same items (fixed
seeds, static contents): a chi-square goodness of fit against the exact probabilities, a
chi-square homogeneity test against the single Table's own draws, and the reported probabilities
and importance weights item by item.
"""

import functools
import uuid

import numpy as np
import pytest
from ray_fixtures import start_ray, transitions

import replaystore as rs
from replaystore import ray as rsr

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray(namespace=f"sharded-{uuid.uuid4().hex[:8]}")
    yield ray
    ray.shutdown()


def unique(prefix="sh"):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def chi2_upper(df, z=4.7534):
    """Wilson-Hilferty approximation of the chi-square quantile at one-sided p = 1e-6."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def make_table(kind, capacity=1000, seed=3, **kw):
    sampler = rs.Prioritized(0.6, 0.4) if kind == "prioritized" else rs.Uniform()
    return rs.Table(capacity, sampler=sampler, seed=seed, **kw)


@pytest.mark.parametrize("kind", ["prioritized", "uniform"])
def test_samples_are_distributed_as_one_table(ray_local, kind):
    n_items, batch, rounds = 60, 128, 120
    ids = np.arange(n_items)
    prios = 1.0 + (ids * 7 % 11).astype(float)  # 1..11, unevenly spread over the shards
    route = np.repeat([0, 1, 2], [30, 20, 10])  # unequal shard sizes and masses
    single = make_table(kind)
    single.extend(transitions(n_items), priorities=prios)
    c = rsr.serve_sharded(functools.partial(make_table, kind), 3, name=unique(), seed=11)
    try:
        keys = c.extend(transitions(n_items), priorities=prios, route=route)
        assert np.array_equal(c.get(keys)[0]["id"], ids)
        scaled = prios**0.6 if kind == "prioritized" else np.ones(n_items)
        expected_p = scaled / scaled.sum()
        expected_w = (expected_p / expected_p.min()) ** -0.4 if kind == "prioritized" else np.ones(n_items)
        counts = np.zeros(n_items)
        single_counts = np.zeros(n_items)
        for _ in range(rounds):
            s = c.sample(batch)
            got = s.data["id"]
            counts += np.bincount(got, minlength=n_items)
            # every draw reports the probability and weight one table would give that item
            np.testing.assert_allclose(s.probabilities, expected_p[got], rtol=1e-9)
            np.testing.assert_allclose(s.weights, expected_w[got], rtol=1e-9)
            assert np.array_equal(s.keys, keys[got])
            ss = single.sample(batch)
            single_counts += np.bincount(ss.data["id"], minlength=n_items)
            np.testing.assert_allclose(ss.probabilities, expected_p[ss.data["id"]], rtol=1e-9)
            np.testing.assert_allclose(ss.weights, expected_w[ss.data["id"]], rtol=1e-9)
        total = batch * rounds
        exp = expected_p * total
        assert ((counts - exp) ** 2 / exp).sum() < chi2_upper(n_items - 1)
        # homogeneity with the single Table's own draws (2 x n contingency table)
        both = counts + single_counts
        e1, e2 = both / 2, both / 2
        homog = ((counts - e1) ** 2 / e1 + (single_counts - e2) ** 2 / e2).sum()
        assert homog < chi2_upper(n_items - 1)
        st = c.stats()
        assert st["total"]["samples"] == total and st["total"]["size"] == n_items
        assert sum(x["samples"] for x in st["shards"]) == total
    finally:
        c.shutdown()


def test_keys_route_to_their_shard_and_foreign_keys_are_refused(ray_local):
    c = rsr.serve_sharded(functools.partial(make_table, "prioritized"), 2, name=unique())
    other = rsr.serve_sharded(functools.partial(make_table, "prioritized"), 2, name=unique())
    try:
        k0 = c.extend(transitions(4), priorities=np.ones(4))  # round robin: shard 0, then 1
        k1 = c.extend(transitions(4, 4), priorities=np.ones(4))
        assert len(c) == 8 and len(set(k0.tolist() + k1.tolist())) == 8
        assert c.update_priorities(np.concatenate([k1[:2], k0[:1]]), [5.0, 6.0, 7.0]) == 3
        info = c.info(np.concatenate([k0, k1]))
        assert info["found"].all()
        np.testing.assert_array_equal(info["priorities"], [7, 1, 1, 1, 5, 6, 1, 1])
        before = c.stats()["total"]
        foreign = other.extend(transitions(2), priorities=np.ones(2))
        for bad in (foreign, np.array([3]), np.array([k0[0], foreign[0]])):
            with pytest.raises(rsr.ForeignKey, match="does not belong"):
                c.update_priorities(bad, np.ones(len(bad)))
            with pytest.raises(rsr.ForeignKey):
                c.delete(bad)
            with pytest.raises(rsr.ForeignKey):
                c.get(bad)
        with pytest.raises(rs.InvalidPriority, match="3 values for 2 keys"):  # the Table's class
            c.update_priorities(k0[:2], [1.0, 2.0, 3.0])
        assert c.stats()["total"] == before  # nothing changed, counters included
        np.testing.assert_array_equal(c.info(k0)["priorities"], [7, 1, 1, 1])
        assert c.delete(k0[:3]) == 3 and len(c) == 5
        data, found = c.get(np.concatenate([k1, k0]))
        np.testing.assert_array_equal(found, [True] * 4 + [False] * 3 + [True])
        np.testing.assert_array_equal(data["id"], [4, 5, 6, 7, 3])
        assert sorted(c.keys().tolist()) == sorted(np.concatenate([k0[3:], k1]).tolist())
        # another client, exact mode: masses asked before each sample, so writes by others count at once
        exact = rsr.connect_sharded(c.name, consistency="exact", seed=0)
        for _ in range(2):
            c.extend(transitions(3, 100), priorities=np.full(3, 2.0))
            prio = c.info(c.keys())["priorities"] ** 0.6
            s = exact.sample(8)
            np.testing.assert_allclose(s.probabilities, c.info(s.keys)["priorities"] ** 0.6 / prio.sum(), rtol=1e-9)
    finally:
        c.shutdown()
        other.shutdown()


def test_fetches_of_depth_batches_and_updates_riding_on_them(ray_local):
    """depth=4: one call per shard per 4 batches; queued updates reach a shard with its next fetch."""
    c = rsr.serve_sharded(functools.partial(make_table, "prioritized"), 2, name=unique(), seed=0, depth=4)
    try:
        keys = c.extend(transitions(40), priorities=np.ones(40), route=np.arange(40))
        watcher = rsr.connect_sharded(c.name, defer_updates=False)  # sees the shards, not c's queue
        first = c.sample(8)
        assert watcher.stats()["total"]["samples"] == 32  # four batches fetched at once
        rest = [c.sample(8) for _ in range(3)]  # handed out from the fetch: no call
        assert watcher.stats()["total"]["samples"] == 32
        assert all(len(b.keys) == 8 and set(b.keys.tolist()) <= set(keys.tolist()) for b in [first, *rest])
        assert c.update_priorities(keys[:4], 9.0) == 4  # queued
        with pytest.raises(rs.InvalidPriority):
            c.update_priorities(keys[:2], [1.0, np.nan])
        np.testing.assert_array_equal(watcher.info(keys[:4])["priorities"], 1.0)
        c.sample(8)  # the next fetch carries the updates, applied before the draw
        np.testing.assert_array_equal(watcher.info(keys[:4])["priorities"], 9.0)
        assert watcher.stats()["total"]["samples"] == 64
        c.update_priorities(keys[4:6], 3.0)
        np.testing.assert_array_equal(c.info(keys[4:6])["priorities"], 3.0)  # by-key calls send the queue first
        assert c.delete(keys[:30]) == 30  # fetched batches that may hold deleted items are dropped
        assert set(c.sample(8).keys.tolist()) <= set(keys[30:].tolist())
        assert watcher.stats()["total"]["samples"] == 96
        assert len(c.sample(4).keys) == 4  # another shape: a fetch of its own (the 8s are dropped)
        assert len(c.sample(8).keys) == 8 and watcher.stats()["total"]["samples"] == 96 + 16 + 32
        w = rsr.BatchingWriter(c, rows_per_call=6)  # rows wait in the writer, then go as one call
        assert len(w.extend(transitions(4, 100), priorities=np.ones(4))) == 0 and len(c) == 10
        sent = w.extend(transitions(4, 104), priorities=np.ones(4))
        assert c.get(sent)[0]["id"].tolist() == list(range(100, 108)) and len(c) == 18
    finally:
        c.shutdown()


def test_bad_shard_counts_and_placements(ray_local):
    factory = functools.partial(make_table, "uniform")
    for bad in (0, -1, 257, 2.0, True):
        with pytest.raises(rs.InvalidArgument, match="num_shards"):
            rsr.serve_sharded(factory, bad, name=unique())
    with pytest.raises(rs.InvalidArgument, match="placement"):
        rsr.serve_sharded(factory, 2, name=unique(), placement="everywhere")
    name = unique()
    import time

    start = time.monotonic()
    with pytest.raises(rsr.PlacementError, match="STRICT_SPREAD"):  # one node: two shards cannot spread
        rsr.serve_sharded(factory, 2, name=name, placement="spread", placement_timeout=2)
    with pytest.raises(rsr.PlacementError, match="not placed"):  # a resource no node has
        rsr.serve_sharded(factory, 2, name=name, resources={"gpu_of_dreams": 1}, placement_timeout=3)
    with pytest.raises(rsr.PlacementError, match="not alive"):
        rsr.serve_sharded(factory, 1, name=name, placement=["ab" * 28])
    assert time.monotonic() - start < 60
    with pytest.raises(rs.InvalidArgument, match="no sharded table"):  # nothing was left running
        rsr.connect_sharded(name)
    with pytest.raises(rs.InvalidArgument, match="Uniform or Prioritized"):
        rsr.serve_sharded(functools.partial(rs.Table, 10, sampler=rs.Fifo()), 2, name=name)
    with pytest.raises(rs.InvalidArgument, match="no sharded table"):
        rsr.connect_sharded(name)


def test_rate_limit_staleness_and_retirement_across_shards(ray_local):
    spi, min_size, err, shards = 2.0, 8, 200.0, 4
    # each shard gets min_size 2 and diff range [min_diff/4, max_diff/4] = [-46, 54]: a batch of 10
    # (20 of diff) fits; the whole keeps inserts * spi - samples within [-184, 216]
    factory = functools.partial(
        make_table,
        "uniform",
        rate_limiter=rs.SampleToInsertRatio(spi, min_size, err),
        max_staleness=1,
        max_times_sampled=0,
    )
    c = rsr.serve_sharded(factory, shards, name=unique(), seed=0)
    try:
        with pytest.raises(rs.Timeout):  # empty: a sample waits, then times out
            c.sample(1, timeout=0.2)
        for v in range(3):
            c.extend(transitions(10, 10 * v), version=v, timeout=10)
        drawn = 0
        while True:
            try:
                drawn += len(c.sample(4, timeout=0))
            except rs.Timeout:
                break
        st = c.stats()["total"]
        min_diff = spi * min_size - err
        assert st["samples"] >= drawn  # the refused call may have drawn on some shards
        assert st["samples"] <= st["inserts"] * spi - min_diff  # the global bound holds
        assert drawn >= 0.5 * (st["inserts"] * spi - min_diff)
        assert c.set_version(3) == 20  # versions 0 and 1 are now stale, on whichever shard they are
        assert sorted(c.get(c.keys())[0]["id"].tolist()) == list(range(20, 30))
    finally:
        c.shutdown()
    c = rsr.serve_sharded(functools.partial(make_table, "uniform", max_times_sampled=1), 2, name=unique(), seed=1)
    try:
        c.extend(transitions(10))
        c.extend(transitions(10, 10))
        s = c.sample(5)
        assert c.stats()["total"]["retired"] == len(set(s.keys.tolist()))
        assert len(c) == 20 - len(set(s.keys.tolist()))
    finally:
        c.shutdown()


def test_episodes_stay_on_their_stream_shard(ray_local):
    factory = functools.partial(rs.Table, 1000, seed=0, episodes=rs.Episodes())
    c = rsr.serve_sharded(factory, 2, name=unique(), seed=0)
    try:
        for t in range(6):
            steps = {"obs": np.full((4, 2), t, np.float32), "reward": np.ones(4, np.float32), "stream_id": np.arange(4)}
            keys = c.extend_steps(steps, streams=np.arange(4), terminated=np.full(4, t == 5))
            shards = (keys >> 40) & 0xFF
            np.testing.assert_array_equal(shards, np.arange(4) % 2)
        s = c.sample_nstep(16, 3, 0.9)
        assert len(s.keys) == 16 and np.all(s.steps >= 1)
        np.testing.assert_array_equal((s.keys >> 40) & 0xFF, s.data["stream_id"] % 2)
        np.testing.assert_allclose(s.probabilities, 1 / 24)
        q = c.sample_sequences(8, 3)
        assert q.data["obs"].shape == (8, 3, 2)
    finally:
        c.shutdown()


def test_checkpoint_manifest_and_restore(ray_local, tmp_path):
    name = unique()
    factory = functools.partial(make_table, "prioritized")
    c = rsr.serve_sharded(factory, 3, name=name, checkpoint_dir=str(tmp_path))
    keys = c.extend(transitions(30), priorities=np.arange(1, 31, dtype=float), route=np.arange(30))
    manifest = c.save()
    c.shutdown()
    import json

    m = json.loads(open(manifest).read())
    assert m["num_shards"] == 3 and len(m["shards"]) == 3 and m["tag"] == c.tag
    with pytest.raises(rs.InvalidArgument, match="records 3 shards"):
        rsr.serve_sharded(factory, 2, name=name, checkpoint_dir=str(tmp_path))
    c = rsr.serve_sharded(factory, 3, name=name, checkpoint_dir=str(tmp_path))
    try:
        data, found = c.get(keys)  # the keys of before the restart still name their items
        assert found.all() and np.array_equal(data["id"], np.arange(30))
        np.testing.assert_array_equal(c.info(keys)["priorities"], np.arange(1, 31))
        assert rsr.connect_sharded(name).num_shards == 3
        batches = list(c.iterate(8, prefetch=3, max_batches=4))  # 3 samples in flight while one is used
        assert len(batches) == 4 and all(c.get(b.keys)[1].all() for b in batches)
        assert c.stats()["total"]["samples"] == 32
        with pytest.raises(rs.InvalidArgument, match="prefetch"):
            next(c.iterate(8, prefetch=0))
    finally:
        c.shutdown()


# -- against a plain model: a dict of key -> (id, priority) ----------------------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(1, 6), st.booleans()),
        st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(0, 4)),
        st.tuples(st.just("update"), st.integers(0, 10**6), st.integers(1, 4)),
        st.tuples(st.just("get"), st.integers(0, 10**6), st.integers(1, 5)),
        st.tuples(st.just("sample"), st.integers(1, 8), st.just(0)),
    ),
    min_size=1,
    max_size=12,
)


@pytest.fixture(scope="module")
def model_client(ray_local):
    c = rsr.serve_sharded(functools.partial(make_table, "prioritized"), 3, name=unique("model"), seed=0)
    yield c
    c.shutdown()


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_sharded_client_matches_a_dict_model(model_client, ops):
    c = model_client
    c.clear()
    model: dict[int, tuple[int, float]] = {}
    next_id = 0
    for op, a, b in ops:
        live = sorted(model)
        if op == "extend":
            ids = np.arange(next_id, next_id + a)
            next_id += a
            prios = 1.0 + ids % 5
            keys = c.extend(transitions(a, int(ids[0])), priorities=prios, route=ids * 7 if b else None)
            assert len(set(keys.tolist()) | set(model)) == len(model) + a  # new, distinct keys
            model.update({int(k): (int(i), float(p)) for k, i, p in zip(keys, ids, prios)})
        elif op == "delete" and live:
            pick = [live[(a + j) % len(live)] for j in range(b)]
            assert c.delete(pick) == len(set(pick))
            for k in pick:
                model.pop(k, None)
        elif op == "update" and live:
            pick = sorted({live[(a + j) % len(live)] for j in range(b)})
            assert c.update_priorities(pick, np.full(len(pick), 9.0)) == len(pick)
            for k in pick:
                model[k] = (model[k][0], 9.0)
        elif op == "get" and live:
            pick = [live[(a + j) % len(live)] for j in range(b)]
            data, found = c.get(pick)
            assert found.all()
            assert data["id"].tolist() == [model[k][0] for k in pick]
            assert c.info(pick)["priorities"].tolist() == [model[k][1] for k in pick]
        elif op == "sample" and live:
            s = c.sample(a, timeout=10)
            assert set(s.keys.tolist()) <= set(model)
            assert [model[k][0] for k in s.keys.tolist()] == s.data["id"].tolist()
        assert len(c) == len(model)
    assert sorted(c.keys().tolist()) == sorted(model)
