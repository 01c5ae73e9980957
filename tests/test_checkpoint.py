import json

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions

SAMPLERS = [
    lambda: rs.Uniform(),
    lambda: rs.Prioritized(alpha=0.6, beta=0.4),
    lambda: rs.Fifo(),
    lambda: rs.Lifo(),
    lambda: rs.MaxHeap(),
    lambda: rs.MinHeap(),
    lambda: rs.WithoutReplacement(),
]


@pytest.mark.parametrize("make_sampler", SAMPLERS)
def test_round_trip_restores_items_metadata_and_counters(tmp_path, make_sampler):
    t = rs.Table(
        20,
        sampler=make_sampler(),
        remover=rs.Fifo(),
        rate_limiter=rs.SampleToInsertRatio(2.0, 3, 100.0),
        max_times_sampled=5,
        seed=0,
    )
    t.extend(transitions(15), priorities=np.linspace(0.5, 3, 15), version=2)
    t.extend(transitions(10, 15), priorities=np.linspace(0.7, 2, 10), version=3)
    t.delete([7])
    s = t.sample(6)
    t.update_priorities(s.keys, np.full(6, 2.0))
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    assert u.keys().tolist() == t.keys().tolist()
    for field in ("priorities", "times_sampled", "versions"):
        assert np.array_equal(u.info(u.keys())[field], t.info(t.keys())[field])
    a, _ = t.get(t.keys())
    b, _ = u.get(u.keys())
    for k in a:
        assert np.array_equal(a[k], b[k])
    su, st = u.stats(), t.stats()
    assert su.pop("priority_mean") == pytest.approx(st.pop("priority_mean"), rel=1e-12)
    assert su == st
    assert u.rate_limiter.state() == t.rate_limiter.state()
    assert type(u.sampler) is type(t.sampler) and u.max_times_sampled == 5
    # both continue identically: same next key; deterministic samplers give the same keys
    assert u.extend(transitions(1, 99)).tolist() == t.extend(transitions(1, 99)).tolist()
    if isinstance(t.sampler, (rs.Fifo, rs.Lifo, rs.MaxHeap, rs.MinHeap)):
        assert u.sample(4).keys.tolist() == t.sample(4).keys.tolist()


def test_prioritized_checkpoint_samples_same_distribution(tmp_path):
    t = rs.Table(100, sampler=rs.Prioritized(alpha=0.8), seed=1)
    prios = np.random.default_rng(0).uniform(0.1, 5, 50)
    t.extend(transitions(50), priorities=prios)
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    keys = u.keys()
    p_t = t.sampler.probabilities(t._index.lookup(keys))
    p_u = u.sampler.probabilities(u._index.lookup(keys))
    np.testing.assert_allclose(p_u, p_t, rtol=1e-12)
    expected = prios**0.8 / (prios**0.8).sum()
    np.testing.assert_allclose(p_u, expected, rtol=1e-12)


def test_without_replacement_epoch_survives_checkpoint(tmp_path):
    t = rs.Table(10, sampler=rs.WithoutReplacement(), seed=0)
    t.extend(transitions(6))
    first = set(t.sample(4).keys.tolist())
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    rest = set(u.sample(2).keys.tolist())
    assert rest == set(range(6)) - first


def test_save_replaces_existing_checkpoint_and_leaves_no_temp(tmp_path):
    t = rs.Table(10, seed=0)
    t.extend(transitions(3))
    t.save(tmp_path / "ck")
    t.extend(transitions(2, 3))
    t.save(tmp_path / "ck")
    assert len(rs.Table.load(tmp_path / "ck")) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_corrupted_file_is_detected(tmp_path):
    t = rs.Table(10, seed=0)
    t.extend(transitions(5))
    t.save(tmp_path / "ck")
    col = tmp_path / "ck" / "col000.npy"
    raw = bytearray(col.read_bytes())
    raw[-1] ^= 0xFF
    col.write_bytes(bytes(raw))
    with pytest.raises(rs.CheckpointError, match="corrupted"):
        rs.Table.load(tmp_path / "ck")


def test_truncated_file_is_detected(tmp_path):
    t = rs.Table(10, seed=0)
    t.extend(transitions(5))
    t.save(tmp_path / "ck")
    f = tmp_path / "ck" / "meta_keys.npy"
    f.write_bytes(f.read_bytes()[:-8])
    with pytest.raises(rs.CheckpointError, match="truncated"):
        rs.Table.load(tmp_path / "ck")


def test_missing_or_garbled_manifest(tmp_path):
    with pytest.raises(rs.CheckpointError, match="no checkpoint"):
        rs.Table.load(tmp_path / "nope")
    t = rs.Table(10, seed=0)
    t.extend(transitions(2))
    t.save(tmp_path / "ck")
    m = tmp_path / "ck" / "manifest.json"
    m.write_text(m.read_text()[:40])
    with pytest.raises(rs.CheckpointError, match="manifest"):
        rs.Table.load(tmp_path / "ck")
    m.write_text(json.dumps({"format": "other"}))
    with pytest.raises(rs.CheckpointError, match="not a replaystore checkpoint"):
        rs.Table.load(tmp_path / "ck")


def test_object_storage_checkpoint_needs_allow_pickle(tmp_path):
    t = rs.Table(5, storage="objects", seed=0)
    t.extend([{"a": 1}, [2, 3]])
    t.save(tmp_path / "ck")
    with pytest.raises(rs.CheckpointError, match="allow_pickle"):
        rs.Table.load(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck", allow_pickle=True)
    assert u.get(u.keys())[0] == [{"a": 1}, [2, 3]]


def test_memmap_table_checkpoint(tmp_path):
    t = rs.Table(10, storage=f"memmap:{tmp_path / 'mm'}", seed=0)
    t.extend({"x": np.arange(6, dtype=np.float32)})
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck", memmap_dir=str(tmp_path / "mm2"))
    assert isinstance(u.storage, rs.MemmapColumnStorage)
    assert u.get(u.keys())[0]["x"].tolist() == list(range(6))
    v = rs.Table.load(tmp_path / "ck")
    assert type(v.storage) is rs.ColumnStorage


def test_empty_table_round_trip(tmp_path):
    t = rs.Table(10, sampler=rs.Prioritized(), seed=0)
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    assert len(u) == 0
    u.extend(transitions(2))
    assert len(u.sample(3)) == 3
