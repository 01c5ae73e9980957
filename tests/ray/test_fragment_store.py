"""FragmentStore (LMDB) and RefCounts: no Ray needed."""

import multiprocessing as mp
import pickle
import shutil
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("lmdb")

import replaystore as rs  # noqa: E402
from replaystore.storage.fragments import (  # noqa: E402
    FragmentStore,
    RefCounts,
    decode,
    encode,
    fragment_age,
    new_fragment_id,
)


@dataclass
class Frag:
    obs: dict
    state: list
    name: str


def make(i=0):
    rng = np.random.default_rng(i)
    return Frag(
        {"image": rng.integers(0, 255, (8, 16, 16, 3), dtype=np.uint8)},
        [np.full((1, 4, 8), i, np.float32), np.zeros((1, 1, 4), bool)],
        f"f{i}",
    )


def test_encode_roundtrip_writable_and_noncontiguous():
    v = {"a": np.arange(10.0)[::2], "b": np.ones((3, 3), np.int16).T, "s": "x", "n": [1, 2]}
    out = decode(encode(v))
    np.testing.assert_array_equal(out["a"], v["a"])
    np.testing.assert_array_equal(out["b"], v["b"])
    assert out["s"] == "x" and out["n"] == [1, 2]
    with pytest.raises(ValueError):
        decode(b"nope" + bytes(20))


def test_put_get_delete_len(tmp_path):
    with FragmentStore(tmp_path / "s", num_shards=3) as store:
        ids = [store.put(make(i)) for i in range(10)]
        assert len(store) == 10 and sorted(store.keys()) == sorted(ids)
        got = store.get(ids[3])
        assert got.name == "f3" and got.obs["image"].flags.writeable
        np.testing.assert_array_equal(got.obs["image"], make(3).obs["image"])
        assert ids[3] in store and "missing" not in store and 5 not in store
        assert store.delete(ids[:4] + ["missing"]) == 4
        assert len(store) == 6
        with pytest.raises(rs.KeyNotFound):
            store.get(ids[0])
        store.put("custom", fragment_id="mine")
        assert store.get("mine") == "custom"
        assert store.disk_usage() > 0
        store.clear()
        assert len(store) == 0
    with pytest.raises(rs.Closed):
        store.get("mine")


def test_two_handles_in_one_process_share_the_environment(tmp_path):
    a = FragmentStore(tmp_path, 2)
    b = FragmentStore(tmp_path, 2)
    fid = a.put(make(1))
    assert b.get(fid).name == "f1"
    a.close()
    assert b.get(fid).name == "f1"  # b still open
    b.close()


def test_pickles_as_arguments(tmp_path):
    store = FragmentStore(tmp_path, 2)
    clone = pickle.loads(pickle.dumps(store))
    fid = store.put(1)
    assert clone.get(fid) == 1 and clone.path == store.path
    clone.close()
    store.close()


def _child_write(path, n, q):
    s = FragmentStore(path, 2)
    q.put([s.put(make(i)) for i in range(n)])
    s.close()


def test_other_processes_write_and_read(tmp_path):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child_write, args=(str(tmp_path), 5, q)) for _ in range(2)]
    for p in procs:
        p.start()
    ids = q.get(timeout=60) + q.get(timeout=60)
    for p in procs:
        p.join(60)
    with FragmentStore(tmp_path, 2) as store:
        assert len(store) == 10
        assert {store.get(i).name for i in ids} == {f"f{i}" for i in range(5)}


def test_fragment_ids_are_unique_and_aged():
    ids = {new_fragment_id() for _ in range(1000)}
    assert len(ids) == 1000
    fid = next(iter(ids))
    assert 0 <= fragment_age(fid) < 5
    assert fragment_age("not-a-time-id") == float("inf")
    assert fragment_age("0123") == float("inf")


def test_refcounts():
    r = RefCounts()
    r.incref(["a", "b", "a"])
    assert r.count("a") == 2 and len(r) == 2 and "b" in r
    assert r.decref(["a"]) == []
    assert r.decref(["a", "b"]) == ["a", "b"]
    assert len(r) == 0
    r.incref(["c"])
    with pytest.raises(rs.KeyNotFound):
        r.decref(["c", "c"])
    assert r.count("c") == 1  # unchanged after the failed call


def test_a_directory_deleted_and_created_again_is_a_new_store(tmp_path):
    """An open handle must not make a later store at the same path read the deleted files."""
    path = tmp_path / "s"
    old = FragmentStore(path, num_shards=2)
    old_id = old.put({"x": np.arange(3)})
    shutil.rmtree(path)
    new = FragmentStore(path, num_shards=2)
    new_id = new.put({"x": np.arange(5)})
    assert new_id in new and old_id not in new
    np.testing.assert_array_equal(new.get(new_id)["x"], np.arange(5))
    old.close()  # the stale environment closes with its last handle; the new one stays usable
    np.testing.assert_array_equal(new.get(new_id)["x"], np.arange(5))
    new.close()
