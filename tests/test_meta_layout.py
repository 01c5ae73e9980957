"""The Table's metadata row (issue 36 item 2): 16 bytes a slot (no key), int32 counts and versions.

What the smaller row changes that a user could see, and what it must not: versions outside int32
are refused with a named error that leaves the table as it was (every path: the compiled single
add, the Python one, ``extend``, ``set_version``, a checkpoint), ``times_sampled`` saturates
instead of wrapping, a sample's metadata keeps its int64 dtypes, and a shared segment of the old
32-byte layout does not open (``LayoutMismatch`` names the region).
"""

import hashlib
import json

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions
from replaystore import rows
from replaystore.placement import allocate
from replaystore.shared import LayoutMismatch, SharedTable
from replaystore.table import core as table_core

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}
ITEM = {"obs": np.ones(4, np.float32), "action": 1, "reward": 0.5, "id": 7}


def test_the_row_is_two_words_and_samples_keep_int64_metadata():
    t = rs.Table(100, sampler=rs.Prioritized(0.6, 0.4), spec=SPEC)  # (a table that keeps priorities)
    t.extend(transitions(10), version=-5)
    t.add(ITEM, version=2**31 - 1, priority=0.25)
    assert t._meta.shape == (100, rows.META_WIDTH) and t._meta.nbytes == 100 * 16
    s = t.sample(64)
    for name in ("keys", "times_sampled", "versions"):
        assert getattr(s, name).dtype == np.int64, name
    assert s.priorities.dtype == np.float64
    by_key = dict(zip(s.keys.tolist(), s.versions.tolist()))
    assert by_key.get(10, 2**31 - 1) == 2**31 - 1 and all(by_key[k] == -5 for k in by_key if k < 10)
    info = t.info(np.arange(11))
    assert info["versions"].dtype == np.int64 and info["versions"].tolist() == [-5] * 10 + [2**31 - 1]
    assert info["times_sampled"].dtype == np.int64 and info["times_sampled"].sum() == 64
    assert info["priorities"][10] == 0.25
    st = t.stats()
    assert st["times_sampled_max"] >= 1 and st["priority_min"] == 0.25


class PyTable(rs.Table):
    """The Table with its Python add / extend (the reference; as tests/test_ring_compiled.py)."""

    if rows.FastMethod is not None:
        add = rs.Table.add.__wrapped__
        extend = rs.Table.extend.__wrapped__


@pytest.mark.parametrize("cls", [rs.Table, PyTable], ids=["table", "python-methods"])
def test_versions_outside_int32_are_refused_and_change_nothing(cls):
    t = cls(8, spec=SPEC)
    t.extend(transitions(3), version=4)
    before = (t._meta.copy(), t.stats(), t.keys().tolist())
    for bad in (2**31, -(2**31) - 1, 2**40):
        with pytest.raises(rs.SpecError, match="int32"):
            t.add(ITEM, version=bad)
        with pytest.raises(rs.SpecError, match="int32"):
            t.extend(transitions(2), version=bad)
        with pytest.raises(rs.SpecError, match="int32"):
            t.extend(transitions(2), version=np.array([0, bad]))
        with pytest.raises(rs.InvalidArgument, match="int32"):
            t.set_version(bad)
        with pytest.raises(rs.InvalidArgument, match="int32"):
            t.set_version(bad, reset=True)
        with pytest.raises(rs.InvalidArgument, match="int32"):
            t.version = bad
    assert np.array_equal(t._meta, before[0]) and t.stats() == before[1] and t.keys().tolist() == before[2]
    assert t.set_version(2**31 - 1) == 0 and t.add(ITEM) == 3  # the largest version is fine
    assert t.info([3])["versions"].tolist() == [2**31 - 1]


def test_times_sampled_saturates_at_int32():
    t = rs.Table(4, spec=SPEC)
    t.extend(transitions(2))
    t._times_sampled[:] = rows.TIMES_SAMPLED_MAX - 1
    s = t.sample(8)
    assert (s.times_sampled == rows.TIMES_SAMPLED_MAX).all()
    assert t.info([0, 1])["times_sampled"].tolist() == [rows.TIMES_SAMPLED_MAX] * 2


def test_checkpoints_keep_their_format_and_refuse_versions_outside_int32(tmp_path):
    t = rs.Table(16, spec=SPEC)
    t.extend(transitions(5), version=3)
    t.sample(4)
    t.save(tmp_path / "ok")
    # one int64 file per field, as before the row shrank (checkpoints of either layout load)
    for name in ("keys", "times_sampled", "versions"):
        assert np.load(tmp_path / "ok" / f"meta_{name}.npy").dtype == np.int64
    u = rs.Table.load(tmp_path / "ok")
    assert u.info(np.arange(5))["versions"].tolist() == [3] * 5
    assert u.info(np.arange(5))["times_sampled"].tolist() == t.info(np.arange(5))["times_sampled"].tolist()
    # a checkpoint whose versions do not fit int32 (hand-made: the files are untrusted input)
    ck = tmp_path / "ok"
    np.save(ck / "meta_versions.npy", np.array([3, 3, 2**40, 3, 3], np.int64))
    resign(ck)
    with pytest.raises(rs.CheckpointError, match="meta_versions.npy.*int32"):
        rs.Table.load(ck)
    np.save(ck / "meta_versions.npy", np.full(5, 3, np.int64))
    resign(ck, lambda m: m["table"].update(model_version=2**31))
    with pytest.raises(rs.CheckpointError, match="model_version.*int32"):
        rs.Table.load(ck)
    resign(ck, lambda m: m["table"].update(model_version=3))
    assert rs.Table.load(ck).info([2])["versions"].tolist() == [3]


def resign(ck, change=None):
    """Apply ``change(manifest)`` and re-sign every file (as tests/test_checkpoint_faults.py does)."""
    m = json.loads((ck / "manifest.json").read_text())
    if change is not None:
        change(m)
    for name, info in m["files"].items():
        f = ck / name
        if f.is_file() and "/" not in name:
            info["bytes"], info["sha256"] = f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest()
    raw = json.dumps(m).encode()
    (ck / "manifest.json").write_bytes(raw)
    (ck / "manifest.sha256").write_text(hashlib.sha256(raw).hexdigest() + "  manifest.json\n")


def test_a_segment_of_the_old_32_byte_row_is_a_layout_mismatch(tmp_path, monkeypatch):
    with monkeypatch.context() as m:  # the layout before issue 36: (capacity, 4) int64
        old_rows = lambda cap, *_: allocate("table.meta", (cap, 4), np.int64, (-1, 0, 0, 0))  # noqa: E731
        m.setattr(table_core, "allocate_rows", old_rows)
        old = SharedTable.create("old", 8, SPEC, directory=tmp_path)
    try:
        assert old._segment.regions["table.meta"][1] == (8, 4)
        with pytest.raises(LayoutMismatch, match=r"table\.meta.*\(8, 4\).*\(8, 1\)"):
            SharedTable.attach("old", directory=tmp_path)
    finally:
        old.close()
    new = SharedTable.create("new", 8, SPEC, directory=tmp_path)
    try:
        assert new._segment.regions["table.meta"][1] == (8, rows.META_WIDTH_NO_PRIORITY)
        new.extend(transitions(5), version=7)
        assert SharedTable.attach("new", directory=tmp_path).sample(4).versions.tolist() == [7] * 4
    finally:
        new.close()
