import numpy as np
import pytest

import replaystore as rs
from conftest import transitions


def test_column_storage_preallocates_from_first_item():
    s = rs.ColumnStorage(100)
    assert s.spec is None
    prepared, n = s.prepare(transitions(3), batched=True)
    assert n == 3 and s.spec is None  # prepare changes nothing
    s.write(slice(0, 3), prepared)
    assert s.columns["obs"].shape == (100, 4) and s.columns["obs"].dtype == np.float32
    assert s.spec["action"] == rs.Field((), np.dtype(np.int64))


def test_read_returns_copies():
    t = rs.Table(10, seed=0)
    t.extend(transitions(3))
    s = t.sample(2)
    t.extend(transitions(10, 100))  # overwrite every slot
    assert np.all(s.data["id"] < 3)


def test_object_dtype_is_refused_by_column_storage():
    t = rs.Table(10)
    with pytest.raises(rs.SpecError, match="ObjectStorage"):
        t.extend({"x": np.array([object(), object()], dtype=object)})


def test_memmap_storage_reopens_after_restart(tmp_path):
    d = tmp_path / "mm"
    t = rs.Table(50, storage=f"memmap:{d}", seed=0)
    t.extend({"img": np.arange(30 * 8, dtype=np.uint8).reshape(30, 8), "x": {"y": np.ones((30, 2))}})
    t.storage.flush()
    expected = np.array(t.storage.columns["img"][:30])
    t.storage.close()
    del t
    reopened = rs.MemmapColumnStorage.open(d)
    assert reopened.capacity == 50
    assert np.array_equal(reopened.read(np.arange(30))["img"], expected)
    assert reopened.read(np.arange(2))["x"]["y"].shape == (2, 2)
    # a table can run on the reopened storage
    t2 = rs.Table(50, storage=reopened)
    t2.extend({"img": np.zeros((2, 8), np.uint8), "x": {"y": np.zeros((2, 2))}})
    assert len(t2) == 2


def test_memmap_storage_larger_spec_checked(tmp_path):
    d = tmp_path / "mm"
    rs.MemmapColumnStorage(10, d, spec={"a": ((3,), np.float32)})
    (d / "col000.npy").write_bytes(b"garbage")
    with pytest.raises(rs.CheckpointError, match="unreadable"):
        rs.MemmapColumnStorage.open(d)
    with pytest.raises(rs.CheckpointError, match="storage.json"):
        rs.MemmapColumnStorage.open(tmp_path / "nothing")


def test_spec_from_field_objects():
    t = rs.Table(5, spec={"obs": rs.Field.of(3, "uint8"), "nested": {"r": rs.Field.of((), "float32")}})
    assert t.storage.columns["obs"].shape == (5, 3)
    with pytest.raises(rs.SpecError, match="shape"):
        t.add({"obs": np.zeros(4, np.uint8), "nested": {"r": 1.0}})
