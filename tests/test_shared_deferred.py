"""Deferred regions: a ring-mode shared table reserves no memory for its out-of-ring structures.

The key index, the free-slot stack, the selectors' own sets and the victims' notes are used only
once a table leaves ring mode; they lie at the end of the segment as a hole (no blocks) until the
first ``delete`` that needs them reserves and fills them. Checked here: what a table holds
(``st_blocks``) before and after, that ring-mode work (in this process, another process, a crash
recovery) never touches the hole, that a full file system makes that ``delete`` raise
``DiskFull`` with the table unchanged, a process killed while it reserves, and a tampered
configuration.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_shared_lock import HAVE_MUTEX
from test_shared_processes import ATTACH, consistent, run_python

import replaystore as rs
from conftest import transitions
from replaystore.shared import LayoutMismatch, SharedTable, list_segments
from replaystore.shared.header import W_DEFERRED, W_JSON_LEN, W_JSON_OFF

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}


def held(t: SharedTable) -> int:
    """Bytes the file system holds for the table's segment."""
    return os.stat(os.path.join(t.path, "segment")).st_blocks * 512


def size(t: SharedTable) -> int:
    return os.path.getsize(os.path.join(t.path, "segment"))


SAMPLERS = {"Uniform": rs.Uniform, "Prioritized": rs.Prioritized, "Fifo": rs.Fifo}


@pytest.mark.parametrize("lock", ["mutex", "flock"])
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_ring_work_never_touches_the_deferred_regions(tmp_path, sampler, lock):
    if lock == "mutex" and not HAVE_MUTEX:
        pytest.skip("_sync not built")
    t = SharedTable.create("d", 4096, SPEC, sampler=SAMPLERS[sampler](), directory=tmp_path, lock=lock)
    seg = t._segment
    eager = seg.deferred_offset
    assert not seg.deferred_ready and held(t) == eager < size(t)
    deferred = seg.config["deferred"]["fill"]
    assert {"index.ring", "table.free", "shared.victims"} <= set(deferred)
    assert "table.meta" not in deferred and not any(n.startswith("columns/") for n in deferred)
    assert ("sampler.prioritized.sum" in seg.regions) == (sampler == "Prioritized")
    assert not any(n.startswith("sampler.prioritized.") for n in deferred)  # (its trees are used in ring mode)
    t.prefault()
    for i in range(40):  # wraps the ring several times
        t.extend(transitions(256, 256 * i))
    if sampler != "Fifo":
        s = t.sample(64)
        if sampler == "Prioritized":
            t.update_priorities(s.keys, np.arange(1.0, 65.0))
    t.delete(t.keys()[:10])  # the oldest: still a ring
    t.clear()
    t.extend(transitions(100, 50_000))
    run_python(ATTACH.format(name="d", d=str(tmp_path)) + "t.prefault(); t.extend(t.get(t.keys()[:5])[0]); t.sample(3)")
    t.save(tmp_path / "ck")  # (a checkpoint reads the ring's index, not the out-of-ring one)
    assert len(rs.Table.load(tmp_path / "ck")) == len(t) and t.stats()["size"] == len(t)
    assert held(t) == eager and t._ring is not None
    [info] = list_segments(tmp_path)  # (what `replaystore shm list` prints)
    assert info["held"] == eager < info["bytes"] == size(t)
    keys = t.keys()
    assert t.delete([int(keys[50])]) == 1  # out of insertion order: leaves ring mode, reserves the rest
    assert seg.deferred_ready and held(t) == size(t) and t._ring is None
    assert int(keys[50]) not in t and len(t) == len(keys) - 1
    data, found = t.get(t.keys())
    assert found.all() and consistent(data)
    after = int(keys[-1]) + 1
    assert t.extend(transitions(3, after)).tolist() == [after, after + 1, after + 2]
    if sampler != "Fifo":
        assert consistent(t.sample(500).data)
    t.close()


def test_reserved_up_front_when_the_table_leaves_ring_mode_by_itself(tmp_path):
    """Retirement, staleness, a remover other than Fifo, or reserve_all: nothing is deferred."""
    for i, kw in enumerate(
        [
            {"max_times_sampled": 2},
            {"max_staleness": 3},
            {"remover": rs.Lifo()},
            {"reserve_all": True},
        ]
    ):
        t = SharedTable.create(f"r{i}", 2048, SPEC, directory=tmp_path, **kw)
        assert t._segment.config["deferred"]["fill"] == {} and t._segment.deferred_ready
        assert held(t) == size(t), kw
        t.close()


def test_same_answers_as_a_table_that_reserved_everything(tmp_path):
    tables = [
        SharedTable.create(f"s{i}", 64, SPEC, sampler=rs.Prioritized(), directory=tmp_path, seed=3, reserve_all=r)
        for i, r in enumerate((False, True))
    ]
    for t in tables:
        t.extend(transitions(100), priorities=np.linspace(1, 2, 100))
        t.delete([40, 41, 77])
        t.extend(transitions(5, 100), priorities=np.full(5, 3.0))
        t.update_priorities([60, 61], [0.5, 9.0])
    a, b = tables
    assert a.keys().tolist() == b.keys().tolist()
    assert {**a.stats(), "name": ""} == {**b.stats(), "name": ""}
    sa, sb = a.sample(200), b.sample(200)
    assert np.array_equal(sa.keys, sb.keys) and np.array_equal(sa.probabilities, sb.probabilities)
    for t in tables:
        t.close()


def test_full_file_system_makes_the_delete_raise_and_changes_nothing(tmpfs_factory):
    small = tmpfs_factory("6m")
    with pytest.raises(rs.DiskFull, match=r"needs [\d,]+ bytes"):  # (10.6 MB, of which 4.1 MB ring part)
        SharedTable.create("all", 60_000, SPEC, directory=small, reserve_all=True)
    assert list(small.iterdir()) == []
    t = SharedTable.create("d", 30_000, SPEC, directory=small)  # 5.1 MB, of which 1.8 MB ring part
    assert held(t) < 3 << 20 and 9 << 19 < size(t)
    filler = small / "filler"
    with open(filler, "wb") as f:  # take every block left
        try:
            while True:
                f.write(b"\1" * (1 << 16))
                f.flush()
        except OSError:
            pass
    # ring-mode work in another process on the full file system: no page fault into the hole (a
    # bus error would kill it), the same in this one
    run_python(
        ATTACH.format(name="d", d=str(small)) + f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from conftest import transitions\nfor i in range(130):\n    t.extend(transitions(256, 256 * i))\n"
        "t.prefault(); t.sample(64); t.delete(t.keys()[:7])\n"
    )
    t.extend(transitions(1000, 10**6))
    before, stats, keys = held(t), t.stats(), t.keys()
    with pytest.raises(rs.DiskFull, match=r"needs [\d,]+ more bytes .* [\d,]+ bytes free .*reserve_all=True") as e:
        t.delete([int(keys[5]), int(keys[9]), 123456789])
    assert e.value.wanted == size(t) - t._segment.deferred_offset
    assert t.stats() == stats and t.keys().tolist() == keys.tolist() and held(t) == before
    assert t._ring is not None and not t._segment.deferred_ready
    assert consistent(t.sample(100).data)
    filler.unlink()
    assert t.delete([int(keys[5]), int(keys[9]), 123456789]) == 2
    assert t.stats()["skipped_deletes"] == stats["skipped_deletes"] + 1 and held(t) == size(t)
    t.close()


@pytest.mark.parametrize("lock", ["mutex", "flock"])
@pytest.mark.parametrize("kill_at", [1, 3])  # after the blocks are reserved; after two regions are filled
def test_process_killed_while_reserving(tmp_path, kill_at, lock):
    if lock == "mutex" and not HAVE_MUTEX:
        pytest.skip("_sync not built")
    t = SharedTable.create("k", 32, SPEC, directory=tmp_path, lock=lock)
    t.extend(transitions(40))  # a full ring
    code = ATTACH.format(name="k", d=str(tmp_path)) + (
        "import os, replaystore.shared.segment as S\n"
        "real, real_view, on = S.reserve, S.Segment.view, []\n"
        "def reserve(*a):\n    real(*a); on.append(0)\n"
        "def view(self, name):\n"
        f"    if on:\n        on.append(0)\n        if len(on) > {kill_at}: os.kill(os.getpid(), 9)\n"
        "    return real_view(self, name)\n"
        "S.reserve, S.Segment.view = reserve, view\n"
        "t.delete([20])\n"
    )
    proc = run_python(code, wait=False)
    proc.wait(60)
    assert proc.returncode == -9, proc.stderr.read()
    assert t._segment.words[W_DEFERRED] == 0  # died before it was done
    t._segment.lock_timeout = 5.0
    assert t.delete([20]) == 1 and t.recoveries() == 1  # repaired, then reserved and filled again
    assert t._segment.deferred_ready and t.keys().tolist() == [k for k in range(8, 40) if k != 20]
    data, found = t.get(list(range(8, 40)))
    assert found.sum() == 31 and consistent(data)
    assert t.extend(transitions(3, 40)).tolist() == [40, 41, 42]
    assert set(t.sample(300).keys.tolist()) <= set(t.keys().tolist())
    t.close()


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["fill"].__setitem__("index.ring", "x"),  # not a number
        lambda d: d["fill"].__setitem__("table.meta", -1),  # a region before the deferred ones
        lambda d: d["fill"].__setitem__("nowhere", 0),  # no such region
        lambda d: d.__setitem__("offset", d["offset"] + 1),  # not a page
        lambda d: d.__setitem__("offset", 10**12),  # past the file
    ],
)
def test_tampered_deferred_configuration_is_a_layout_mismatch(tmp_path, change):
    t = SharedTable.create("tam", 64, SPEC, directory=tmp_path)
    mm, words = t._segment.mm, t._segment.words
    off, length = words[W_JSON_OFF], words[W_JSON_LEN]
    config = json.loads(bytes(mm[off : off + length]))
    change(config["deferred"])
    raw = json.dumps(config).encode()
    mm[off : off + len(raw)] = raw
    words[W_JSON_LEN] = len(raw)
    with pytest.raises(LayoutMismatch, match="deferred"):
        SharedTable.attach("tam", directory=tmp_path)
    t.close()
