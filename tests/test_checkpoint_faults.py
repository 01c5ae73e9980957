"""Checkpoints under faults: a saver SIGKILLed at every point of ``save``, and tampered directories.

Crash tests run ``save`` in a child process that kills itself (``SIGKILL``: no cleanup, no
``finally``) at a named point of :func:`replaystore.checkpoint.save_snapshot`, or in the middle of
writing a file. ``Table.load`` must then return exactly the previous table or exactly the new one.

Tamper tests alter a saved checkpoint. Most re-sign the manifest (recompute ``manifest.sha256``
and the per-file checksums, as an attacker could) so that the structural checks, not the
checksum, must catch the problem; every case must raise ``CheckpointError`` naming it.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore import checkpoint as ckpt

SRC = str(Path(rs.__file__).resolve().parents[1])

# builds the "old" (which=0) and "new" (which=1) tables, in the parent and in the child
BUILD = textwrap.dedent("""
    import numpy as np
    import replaystore as rs

    def build(which):
        t = rs.Table(16, sampler=rs.Prioritized(alpha=0.7), remover=rs.Fifo(),
                     rate_limiter=rs.SampleToInsertRatio(2.0, 2, 50.0), seed=3)
        n = 9 if which == 0 else 14
        ids = np.arange(100 * which, 100 * which + n)
        t.extend({"obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32), "id": ids,
                  "r": ids * 0.5}, priorities=np.linspace(0.5, 2.0, n), version=which)
        t.sample(4)
        if which:
            t.extend({"obs": np.zeros((5, 3), np.float32), "id": np.arange(900, 905), "r": np.ones(5)})
            t.delete(t.keys()[:2])
        return t
""")
namespace: dict = {}
exec(BUILD, namespace)
build = namespace["build"]

CHILD = BUILD + textwrap.dedent("""
    import os, signal, sys
    from replaystore import checkpoint as ckpt

    point, path = sys.argv[1], sys.argv[2]

    def die():
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    if point.startswith("torn:"):  # die halfway through writing that file
        target = point[5:]
        real = ckpt._write_file
        def write_file(p, write):
            if p.name != target:
                return real(p, write)
            with open(p, "xb") as f:
                w = ckpt._HashingWriter(f)
                write(w)
                f.flush()
            os.truncate(p, w.bytes // 2)
            die()
        ckpt._write_file = write_file
    else:
        ckpt._at = lambda name: die() if name == point else None
    build(1).save(path)
    print("finished")
""")


def snapshot(t):
    keys = t.keys()
    data, _ = t.get(keys)
    info = t.info(keys)
    st_ = t.stats()
    st_.pop("priority_mean")
    return {
        "keys": keys.tolist(),
        "data": {k: v.tolist() for k, v in data.items()},
        "info": {k: v.tolist() for k, v in info.items()},
        "stats": st_,
        "limiter": t.rate_limiter.state(),
        "next_key": t._next_key,
    }


OLD, NEW = snapshot(build(0)), snapshot(build(1))

# every named point of save_snapshot, and the table load must give after a kill there
FILES = [
    "meta_keys.npy",
    "meta_priorities.npy",
    "meta_times_sampled.npy",
    "meta_versions.npy",
    "col000.npy",
    "col001.npy",
    "col002.npy",
    "manifest.json",
    "manifest.sha256",
]
POINTS = [(f"file:{f}", "old") for f in FILES] + [
    ("torn:col001.npy", "old"),
    ("torn:manifest.json", "old"),
    ("torn:manifest.sha256", "old"),
    ("manifest", "old"),
    ("synced", "old"),
    ("old-aside", "new"),
    ("in-place", "new"),
    ("done", "new"),
    ("never", "new"),  # not killed: the save completes
]


def run_child(point, path):
    r = subprocess.run(
        [sys.executable, "-c", CHILD, point, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    return r


# the default run kills at one point of each phase; -m slow runs every point
FAST = {"file:col001.npy", "torn:col001.npy", "synced", "old-aside", "in-place", "never"}
POINT_PARAMS = [pytest.param(p, e, id=p, marks=() if p in FAST else pytest.mark.slow) for p, e in POINTS]


@pytest.mark.parametrize("point, expect", POINT_PARAMS)
def test_save_killed_at_any_point_leaves_the_old_or_the_new_table(tmp_path, point, expect):
    ck = tmp_path / "ck"
    build(0).save(ck)
    r = run_child(point, ck)
    if point == "never":
        assert r.returncode == 0 and "finished" in r.stdout, r.stderr
    else:
        assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    loaded = rs.Table.load(ck)
    assert snapshot(loaded) == (OLD if expect == "old" else NEW)
    assert ckpt.checkpoint_exists(ck)
    # the next save puts things in order: one checkpoint, no side copies, the newest state
    loaded.extend({"obs": np.ones((1, 3), np.float32), "id": np.array([777]), "r": np.ones(1)})
    loaded.save(ck)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert snapshot(rs.Table.load(ck)) == snapshot(loaded)


@pytest.mark.parametrize("point", ["file:col000.npy", "synced", pytest.param("in-place", marks=pytest.mark.slow)])
def test_first_save_killed_gives_nothing_or_the_new_table(tmp_path, point):
    ck = tmp_path / "ck"
    r = run_child(point, ck)
    assert r.returncode == -signal.SIGKILL
    if point == "in-place":
        assert snapshot(rs.Table.load(ck)) == NEW
    elif point == "synced":  # complete but not renamed: load finds the side copy
        assert not ck.exists()
        assert snapshot(rs.Table.load(ck)) == NEW
    else:
        with pytest.raises(rs.CheckpointError, match="no checkpoint"):
            rs.Table.load(ck)
        assert not ckpt.checkpoint_exists(ck)


def test_inspect_reads_the_copy_an_interrupted_save_left(tmp_path, capsys):
    from replaystore import cli

    ck = tmp_path / "ck"
    build(0).save(ck)
    assert run_child("old-aside", ck).returncode == -signal.SIGKILL
    assert not ck.exists() and ckpt.checkpoint_exists(ck)
    assert cli.main(["inspect", str(ck)]) == 0
    assert "14 / 16 items" in capsys.readouterr().out  # the new table's 14 live items


def test_a_second_interrupted_save_does_not_lose_the_recovered_copy(tmp_path):
    """Killed between the renames, then killed again early in the next save: still loadable."""
    ck = tmp_path / "ck"
    build(0).save(ck)
    assert run_child("old-aside", ck).returncode == -signal.SIGKILL
    assert not ck.exists()
    assert run_child("file:meta_keys.npy", ck).returncode == -signal.SIGKILL
    assert snapshot(rs.Table.load(ck)) == NEW  # the second save first put the new copy back in place
    assert ck.exists()


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    build(0).save(ck)

    def boom(name):
        if name == "old-aside":
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "_at", boom)
    with pytest.raises(rs.DiskFull) as e:
        build(1).save(ck)
    assert isinstance(e.value, OSError) and e.value.path == str(ck) and e.value.wanted > 0
    assert snapshot(rs.Table.load(ck)) == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


@pytest.fixture
def tmpfs(tmpfs_factory):
    """A fresh 2 MiB tmpfs (needs root; skipped otherwise)."""
    return tmpfs_factory("2m")


def test_save_on_a_full_disk_raises_diskfull_and_keeps_the_previous_checkpoint(tmpfs):
    big = rs.Table(1000, seed=0)
    big.extend({"x": np.random.default_rng(0).random((1000, 150))})  # 1.2 MB: old + new do not fit in 2 MiB
    small = rs.Table(1000, seed=0)
    small.extend({"x": np.ones((10, 150))})
    ck = tmpfs / "ck"
    small.save(ck)
    before = snapshot(rs.Table.load(ck))
    big.save(ck)  # the small old copy and the big new one fit together
    saved = snapshot(big)
    big.extend({"x": np.zeros((1, 150))})
    with pytest.raises(rs.DiskFull) as e:  # the big old copy and a big new one do not (2 x 1.2 MB)
        big.save(ck)
    assert e.value.path == str(ck) and e.value.wanted >= 1_200_000
    assert sorted(p.name for p in tmpfs.iterdir()) == ["ck"]  # no temporary copy left behind
    assert snapshot(rs.Table.load(ck)) == saved
    # once there is room again (the checkpoint of the small table replaces it), saving works
    small.save(ck)
    assert snapshot(rs.Table.load(ck)) == before


def test_save_refuses_to_replace_a_directory_that_is_not_a_checkpoint(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "precious.txt").write_text("keep me")
    with pytest.raises(rs.InvalidArgument, match="not a checkpoint"):
        build(0).save(d)
    assert (d / "precious.txt").read_text() == "keep me"


# -- tampering -----------------------------------------------------------------------------------------


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def resign(ck, change=None, rehash=True):
    """Apply ``change(manifest)``, recompute every listed file's checksum, rewrite the manifest checksum."""
    m = json.loads((ck / "manifest.json").read_text())
    if change is not None:
        change(m)
    if rehash and isinstance(m.get("files"), dict):
        for name, info in m["files"].items():
            f = ck / name
            if isinstance(info, dict) and f.is_file() and "/" not in name:
                info["bytes"], info["sha256"] = f.stat().st_size, sha(f)
    raw = json.dumps(m).encode()
    (ck / "manifest.json").write_bytes(raw)
    (ck / "manifest.sha256").write_text(hashlib.sha256(raw).hexdigest() + "  manifest.json\n")


@pytest.fixture
def ck(tmp_path):
    path = tmp_path / "ck"
    build(1).save(path)
    return path


def load_fails(ck, match, **kw):
    with pytest.raises(rs.CheckpointError, match=match):
        rs.Table.load(ck, **kw)


def test_flipped_digit_in_next_key_is_caught_by_the_manifest_checksum(ck):
    raw = (ck / "manifest.json").read_text()
    m = json.loads(raw)
    nk = m["table"]["next_key"]
    flipped = raw.replace(f'"next_key": {nk}', f'"next_key": {nk - 10}')
    assert flipped != raw
    (ck / "manifest.json").write_text(flipped)
    load_fails(ck, "manifest.sha256")


def test_resigned_next_key_below_a_stored_key_is_refused(ck):
    resign(ck, lambda m: m["table"].update(next_key=m["table"]["next_key"] - 3))
    load_fails(ck, "next_key.*collide")


def test_missing_manifest_checksum_is_refused(ck):
    (ck / "manifest.sha256").unlink()
    load_fails(ck, "manifest.sha256")


def test_column_path_with_dotdot_or_absolute_is_refused(ck, tmp_path):
    outside = tmp_path / "x.npy"
    np.save(outside, np.zeros((12, 3), np.float32))
    for bad in ("../x.npy", str(outside)):

        def change(m, bad=bad):
            col = next(iter(m["columns"]))
            m["columns"][col] = bad
            m["files"][bad] = {"bytes": outside.stat().st_size, "sha256": sha(outside)}

        build(1).save(ck)
        resign(ck, change)
        load_fails(ck, "not a plain file name")


def test_symlink_out_of_the_checkpoint_is_refused(ck, tmp_path):
    outside = tmp_path / "elsewhere.npy"
    outside.write_bytes((ck / "col000.npy").read_bytes())
    (ck / "col000.npy").unlink()
    (ck / "col000.npy").symlink_to(outside)
    load_fails(ck, "symbolic link")  # same bytes, same checksum: refused for being a link


def test_symlinked_manifest_is_refused(ck, tmp_path):
    outside = tmp_path / "m.json"
    outside.write_bytes((ck / "manifest.json").read_bytes())
    (ck / "manifest.json").unlink()
    (ck / "manifest.json").symlink_to(outside)
    load_fails(ck, "manifest.json")


def test_unlisted_column_is_refused(ck):
    def change(m):
        col = next(iter(m["columns"]))
        fname = m["columns"][col]
        del m["files"][fname]

    resign(ck, change)
    load_fails(ck, "not listed")


def test_missing_and_truncated_files(ck):
    (ck / "col001.npy").unlink()
    load_fails(ck, "missing col001.npy")
    build(1).save(ck)
    f = ck / "meta_versions.npy"
    f.write_bytes(f.read_bytes()[:-4])
    load_fails(ck, "truncated")
    build(1).save(ck)
    f.write_bytes(f.read_bytes()[:-4])
    resign(ck)  # checksums match the truncated file: np.load or the shape check must refuse it
    load_fails(ck, "meta_versions.npy")


@pytest.mark.parametrize(
    "where, value, match",
    [
        (("table", "capacity"), "16", "table.capacity must be an integer"),
        (("table", "capacity"), True, "table.capacity must be an integer"),
        (("table", "next_key"), None, "table.next_key"),
        (("table", "max_priority"), float("nan"), "table.max_priority"),
        (("table",), [1, 2], "table must be an object"),
        (("files",), [], "files must be an object"),
        (("size",), -1, "size"),
        (("size",), 99, "size"),
        (("table", "capacity"), 10**13, "memory"),
        (("table", "capacity"), 2**70, "memory"),
        (("storage", "kind"), "tape", "storage.kind"),
        (("storage", "spec"), None, "no storage.spec"),
        (("sampler", "config", "type"), "Nope", "invalid table configuration"),
        (("sampler", "config"), {"type": "Prioritized", "alpha": "x"}, "invalid table configuration"),
        (("remover", "config", "type"), "Prioritized", "invalid table configuration"),
        (("rate_limiter", "state", "inserts"), -3, "inserts is negative"),
        (("rate_limiter", "state"), {}, "rate_limiter.state.inserts is missing"),
        (("table", "counters", "wal_lsn"), -0.5, "table.counters.wal_lsn"),
        (("table", "counters", "inserts"), "many", "table.counters.inserts"),
        (("table", "rng"), {"bit_generator": "Nope"}, "inconsistent"),
        (("sampler", "state"), 7, "sampler.state must be an object"),
        (("version",), 99, "format version"),
        (("format",), "other", "not a replaystore checkpoint"),
    ],
)
def test_wrong_manifest_structure_is_a_named_checkpoint_error(ck, where, value, match):
    def change(m):
        d = m
        for k in where[:-1]:
            d = d[k]
        d[where[-1]] = value

    resign(ck, change)
    load_fails(ck, match)


def test_arrays_of_the_wrong_dtype_or_shape_are_refused(ck):
    np.save(ck / "meta_priorities.npy", np.ones(12, np.float32))
    resign(ck)
    load_fails(ck, "meta_priorities.npy holds float32")
    build(1).save(ck)
    np.save(ck / "col000.npy", np.zeros((12, 4), np.float32))
    resign(ck)
    load_fails(ck, "col000.npy holds")
    build(1).save(ck)
    keys = np.load(ck / "meta_keys.npy")
    np.save(ck / "meta_keys.npy", keys[::-1].copy())
    resign(ck)
    load_fails(ck, "distinct keys")
    build(1).save(ck)
    np.save(ck / "meta_keys.npy", np.array([None] * 12, dtype=object), allow_pickle=True)
    resign(ck)
    load_fails(ck, "meta_keys.npy is unreadable")  # object arrays never unpickle


def test_failed_load_into_memmap_dir_leaves_nothing(tmp_path):
    t = rs.Table(10, storage=f"memmap:{tmp_path / 'mm'}", seed=0)
    t.extend({"x": np.arange(6, dtype=np.float32)})
    ck = tmp_path / "ck"
    t.save(ck)
    # a problem found only at the very end, after the memmap files were created and filled
    resign(ck, lambda m: m["table"].update(rng={"bit_generator": "PCG64", "state": "bad"}))
    target = tmp_path / "mm2"
    load_fails(ck, "inconsistent", memmap_dir=str(target))
    assert not target.exists()
    target.mkdir()
    load_fails(ck, "inconsistent", memmap_dir=str(target))
    assert list(target.iterdir()) == []
    (target / "other.bin").write_bytes(b"x")
    load_fails(ck, "memmap_dir", memmap_dir=str(target))
    assert [p.name for p in target.iterdir()] == ["other.bin"]


def test_load_never_unpickles_without_allow_pickle(tmp_path):
    t = rs.Table(4, storage="objects", seed=0)
    t.extend([{"a": 1}])
    t.save(tmp_path / "ck")
    load_fails(tmp_path / "ck", "allow_pickle")
    assert rs.Table.load(tmp_path / "ck", allow_pickle=True).get(t.keys())[0] == [{"a": 1}]


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(obj, list) and obj and len(obj) < 8:
        for i, v in enumerate(obj):
            yield from _leaves(v, (*path, i))
    yield path


# integers: small ones, and absurd ones the loader must refuse; not a legitimate capacity of
# millions of items, which loads (slowly: it preallocates gigabytes) and proves nothing here
JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 10**4),
    st.integers(2**60, 2**70),
    st.floats(allow_nan=False, max_value=1e4),
    st.text(max_size=8),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(-3, 3), max_size=2),
)


@settings(
    max_examples=int(os.environ.get("RS_FUZZ_EXAMPLES", 40)),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_fuzzed_manifest_loads_or_raises_checkpoint_error(tmp_path_factory, data):
    template = tmp_path_factory.getbasetemp() / "fuzz-template"
    if not template.exists():  # one save (its fsyncs are slow on a busy disk), then copies
        build(1).save(template)
    ck = tmp_path_factory.mktemp("fuzz") / "ck"
    shutil.copytree(template, ck)
    m = json.loads((ck / "manifest.json").read_text())
    paths = [p for p in _leaves(m) if p]
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        path = data.draw(st.sampled_from(paths), label="where")
        value = data.draw(JSON_VALUES, label="value")
        d = m
        try:
            for k in path[:-1]:
                d = d[k]
            d[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    resign(ck, lambda mm: (mm.clear(), mm.update(m)), rehash=False)
    try:
        t = rs.Table.load(ck)
    except rs.CheckpointError:
        return
    # a mutation the loader accepted leaves a working table
    assert len(t) == len(t.keys())
    t.extend({"obs": np.ones((1, 3), np.float32), "id": np.array([1]), "r": np.ones(1)})
