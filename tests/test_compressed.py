"""CompressedColumnStorage: exact round trips, the Storage contract, accounting, checkpoints."""

import numpy as np
import pytest

import replaystore as rs

pytest.importorskip("zstandard")

from replaystore.storage.compressed import CompressedColumnStorage  # noqa: E402


def frames(n, seed=0):
    """Atari-like uint8 frames: a flat background with a few moving blocks (compressible)."""
    rng = np.random.default_rng(seed)
    out = np.full((n, 4, 84, 84), 87, dtype=np.uint8)
    for i in range(n):
        for _ in range(3):
            y, x = rng.integers(0, 76, 2)
            out[i, :, y : y + 8, x : x + 8] = rng.integers(0, 256)
    return out


def batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "obs": frames(n, seed),
        "action": rng.integers(0, 6, n),
        "reward": rng.normal(size=n).astype(np.float32),
        "done": rng.random(n) < 0.1,
    }


def make(capacity, **kw):
    return rs.Table(capacity, storage=CompressedColumnStorage(capacity, **kw), seed=0)


def test_round_trip_exact_and_only_large_fields_compressed():
    t = make(100)
    b = batch(60)
    keys = t.extend(b)
    st = t.storage
    assert set(st.compressed) == {"obs"} and set(st.columns) == {"action", "reward", "done"}
    data, found = t.get(keys)
    assert found.all()
    for k in b:
        assert data[k].dtype == b[k].dtype
        assert np.array_equal(data[k], b[k])
    assert data["obs"].flags.writeable
    s = t.sample(32)
    assert np.array_equal(s.data["obs"], b["obs"][s.keys])
    assert np.array_equal(s.data["reward"], b["reward"][s.keys])
    # compressible frames: far fewer bytes than raw
    raw = b["obs"].nbytes
    assert st.compressed_bytes("obs") < raw / 10
    assert st.nbytes == st.compressed_bytes("obs") + sum(c.nbytes for c in st.columns.values())


def test_reads_are_fresh_arrays():
    t = make(10)
    b = batch(5)
    t.extend(b)
    s = t.sample(4)
    s.data["obs"][:] = 0
    data, _ = t.get(np.arange(5))
    assert np.array_equal(data["obs"], b["obs"])


def test_single_adds_are_staged_and_round_trip():
    t = make(50)
    b = batch(20, seed=3)
    for i in range(20):
        t.add({k: v[i] for k, v in b.items()})
    data, found = t.get(np.arange(20))
    assert found.all()
    assert np.array_equal(data["obs"], b["obs"])
    assert np.array_equal(data["done"], b["done"])


def test_eviction_overwrites_and_release_frees_bytes():
    t = make(30)
    b1, b2 = batch(30, 1), batch(20, 2)
    t.extend(b1)
    before = t.storage.compressed_bytes("obs")
    keys2 = t.extend(b2)
    data, found = t.get(np.arange(50))
    assert found.tolist() == [False] * 20 + [True] * 30
    assert np.array_equal(data["obs"], np.concatenate([b1["obs"][20:], b2["obs"]]))
    assert t.delete(keys2[:10]) == 10
    after = t.storage.compressed_bytes("obs")
    assert after < before
    live = t.storage.blob_sizes["obs"] > 0
    assert live.sum() == 20


def test_bad_input_changes_nothing():
    t = make(10)
    t.extend(batch(4))
    before = (t.storage.nbytes, len(t), t.stats()["inserts"])
    bad = batch(2)
    bad["obs"] = bad["obs"].astype(np.float32)
    with pytest.raises(rs.SpecError):
        t.extend(bad)
    bad = batch(2)
    bad["obs"] = bad["obs"][:, :3]
    with pytest.raises(rs.SpecError):
        t.extend(bad)
    assert (t.storage.nbytes, len(t), t.stats()["inserts"]) == before


def test_explicit_fields_nested_and_unknown_field():
    t = rs.Table(10, storage=CompressedColumnStorage(10, compress=["obs/pixels"]))
    item = {"obs": {"pixels": np.arange(12, dtype=np.int16).reshape(3, 4), "state": np.ones(2)}, "r": 1.0}
    t.add(item)
    d, _ = t.get([0])
    assert np.array_equal(d["obs"]["pixels"][0], item["obs"]["pixels"])
    assert np.array_equal(d["obs"]["state"][0], item["obs"]["state"])
    assert list(t.storage.compressed) == ["obs/pixels"]
    t2 = rs.Table(10, storage=CompressedColumnStorage(10, compress=["image"]))
    with pytest.raises(rs.SpecError, match="image"):
        t2.add(item)
    assert len(t2) == 0 and t2.storage.spec is None
    with pytest.raises(rs.SpecError):
        CompressedColumnStorage(10, spec={"a": ((3,), "f4")}, compress=["b"])
    with pytest.raises(ValueError):
        CompressedColumnStorage(10, level=0)


def test_checkpoint_round_trip(tmp_path):
    t = make(40, level=5)
    b = batch(40, 4)
    t.extend(b)
    t.delete([3, 7])
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    assert isinstance(u.storage, CompressedColumnStorage)
    assert u.storage.level == 5 and list(u.storage.compressed) == ["obs"]
    assert np.array_equal(u.keys(), t.keys())
    d1, _ = t.get(t.keys())
    d2, _ = u.get(u.keys())
    for k in b:
        assert np.array_equal(d1[k], d2[k])
    assert u.storage.compressed_bytes("obs") == t.storage.compressed_bytes("obs")


# -- against the reference: a ColumnStorage table driven by the same operations -----------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ops = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(1, 12)),
        st.tuples(st.just("add"), st.just(1)),
        st.tuples(st.just("delete"), st.integers(0, 5)),
        st.tuples(st.just("sample"), st.integers(1, 9)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(ops, st.sampled_from(["fifo", "uniform"]))
def test_behaves_exactly_like_column_storage(operations, remover):
    def table(storage):
        rm = rs.Fifo() if remover == "fifo" else rs.Uniform()
        return rs.Table(16, remover=rm, storage=storage, seed=3)

    ref = table(rs.ColumnStorage(16))
    cmp_ = table(CompressedColumnStorage(16, min_bytes=64))
    rng = np.random.default_rng(0)
    for op, k in operations:
        if op == "extend":
            b = {"img": rng.integers(0, 4, (k, 8, 8), dtype=np.uint8), "r": rng.normal(size=k)}
            assert np.array_equal(ref.extend(b), cmp_.extend(b))
        elif op == "add":
            item = {"img": rng.integers(0, 4, (8, 8), dtype=np.uint8), "r": float(rng.normal())}
            assert ref.add(item) == cmp_.add(item)
        elif op == "delete":
            keys = ref.keys()[:k]
            assert ref.delete(keys) == cmp_.delete(keys)
        elif len(ref):
            a, b = ref.sample(k), cmp_.sample(k)
            assert np.array_equal(a.keys, b.keys)
            assert np.array_equal(a.data["img"], b.data["img"]) and np.array_equal(a.data["r"], b.data["r"])
    assert np.array_equal(ref.keys(), cmp_.keys())
    d1, _ = ref.get(ref.keys())
    d2, _ = cmp_.get(cmp_.keys())
    if len(ref):
        assert np.array_equal(d1["img"], d2["img"]) and np.array_equal(d1["r"], d2["r"])
    if cmp_.storage.spec is not None:
        live = cmp_.storage.blob_sizes["img"] > 0
        assert live.sum() == len(cmp_)  # freed slots hold no bytes
