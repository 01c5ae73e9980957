"""SharedTable across real processes: fork/spawn/forkserver, unrelated processes, waits, the sampled
distribution, writers killed mid-insert, a dead creator, full file systems, the CLI."""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions
from replaystore.shared import SharedTable, list_segments

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}
SRC = str(Path(rs.__file__).resolve().parents[1])


def run_python(code: str, env: dict | None = None, wait: bool = True, timeout: float = 60):
    """Run ``code`` in a new, unrelated Python process (the source tree on its path)."""
    full_env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    args = [sys.executable, "-c", code]
    if not wait:
        return subprocess.Popen(args, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    r = subprocess.run(args, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout


def consistent(data) -> bool:
    """Every row written by ``transitions`` carries its id in every field: no torn row."""
    ids = data["id"]
    return bool(
        (data["obs"] == ids[:, None]).all()
        and (data["reward"] == ids * 0.5).all()
        and (data["action"] == ids % 3).all()
    )


def _writer(table, w, batches):
    for j in range(batches):
        table.extend(transitions(8, w * 100_000 + j * 8))
    table.close()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_writers_in_child_processes_and_a_sampling_parent(tmp_path, method):
    t = SharedTable.create("mp", 2000, SPEC, sampler=rs.Prioritized(), directory=tmp_path)
    ctx = mp.get_context(method)
    writers = 3 if method == "fork" else 2  # (each spawned process imports NumPy and replaystore)
    procs = [ctx.Process(target=_writer, args=(t, w, 40)) for w in range(writers)]
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs):
        if len(t):
            s = t.sample(64, timeout=5)
            assert consistent(s.data)
        time.sleep(0.005)
    assert [p.exitcode for p in procs] == [0] * writers
    assert len(t) == 320 * writers and t.stats()["inserts"] == 320 * writers
    data, found = t.get(t.keys())
    assert found.all() and consistent(data)
    expected = {w * 100_000 + i for w in range(writers) for i in range(320)}
    assert set(data["id"].tolist()) == expected
    t.close()
    assert list(tmp_path.iterdir()) == []  # the children closed first, the parent removed it


def test_unrelated_process_attaches_by_name(tmp_path):
    t = SharedTable.create("byname", 100, SPEC, sampler=rs.Prioritized(alpha=1.0), directory=tmp_path)
    t.extend(transitions(10))
    out = run_python(f"""
import numpy as np
from replaystore.shared import SharedTable
t = SharedTable.attach("byname", directory={str(tmp_path)!r})
s = t.sample(5)
assert (s.data["id"] == s.keys).all()
t.update_priorities([3], [50.0])
print(t.extend({{"obs": np.array([[10] * 4, [11] * 4], np.float32), "action": np.array([1, 2]),
                 "reward": np.array([5, 5.5], np.float32), "id": np.array([10, 11])}}).tolist())
t.close()
""")
    assert out.strip() == "[10, 11]"
    assert t.info([3])["priorities"].tolist() == [50.0] and len(t) == 12
    assert t.stats()["samples"] == 5
    data, _ = t.get(t.keys())
    assert consistent(data)
    t.close()


def _late_writer(table, delay, n):
    time.sleep(delay)
    table.extend(transitions(n))


def test_rate_limiter_waits_across_processes(tmp_path):
    t = SharedTable.create("rl", 100, SPEC, directory=tmp_path, rate_limiter=rs.SampleToInsertRatio(1.0, 4, 4.0))
    p = mp.get_context("fork").Process(target=_late_writer, args=(t, 0.3, 4))
    start = time.monotonic()
    p.start()
    s = t.sample(4, timeout=20)  # blocked until the other process inserts
    assert time.monotonic() - start >= 0.3 and len(s) == 4
    p.join(10)
    assert p.exitcode == 0
    with pytest.raises(rs.Timeout):
        t.sample(4, timeout=0.05)  # the ratio allows no more samples until more inserts
    t.close()


def _sample_counts(name, directory, draws, queue):
    t = SharedTable.attach(name, directory=directory, seed=1)
    counts = np.zeros(8, dtype=np.int64)
    for _ in range(draws // 500):
        counts += np.bincount(t.sample(500).data["id"], minlength=8)
    queue.put(counts)
    t.close()


def test_prioritized_distribution_from_another_process(tmp_path):
    t = SharedTable.create("chi", 8, SPEC, sampler=rs.Prioritized(alpha=0.5), directory=tmp_path)
    t.extend(transitions(8), priorities=np.arange(1.0, 9.0) ** 2)  # p ** alpha = 1 .. 8
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=_sample_counts, args=("chi", str(tmp_path), 20000, q))
    p.start()
    counts = q.get(timeout=60)
    p.join(10)
    expected = 20000 * np.arange(1.0, 9.0) / 36.0
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 29.9  # the 0.9999 quantile of chi-square with 7 degrees of freedom
    assert t.stats()["samples"] == 20000 and t.info(np.arange(8))["times_sampled"].sum() == 20000
    t.close()


@pytest.mark.parametrize("full", [False, True])
def test_writer_killed_before_publishing_leaves_no_torn_row(tmp_path, full):
    t = SharedTable.create("crash", 16, SPEC, sampler=rs.Prioritized(), directory=tmp_path)
    t.extend(transitions(16 if full else 6))
    marker = tmp_path / "paused"
    proc = run_python(
        f"""
import numpy as np
from replaystore.shared import SharedTable
t = SharedTable.attach("crash", directory={str(tmp_path)!r})
bad = {{"obs": np.full((5, 4), -7, np.float32), "action": np.zeros(5, np.int64),
        "reward": np.ones(5, np.float32), "id": np.arange(5)}}
t.extend(bad)
""",
        env={"REPLAYSTORE_SHM_TEST_HOOK": f"pause-before-publish:{marker}"},
        wait=False,
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    t._segment.lock_timeout = 5.0  # the kernel released the dead writer's lock: no wait
    keys = t.keys()
    data, found = t.get(keys)
    assert found.all() and consistent(data)  # no row of the dead writer, no overwritten row
    if full:  # it had overwritten the 5 oldest rows: they are gone, counted as evicted
        assert keys.tolist() == list(range(5, 16)) and t.stats()["evictions"] == 5
    else:
        assert keys.tolist() == list(range(6))
    assert t.recoveries() == 1
    s = t.sample(200)
    assert consistent(s.data) and np.isin(s.keys, keys).all()  # the trees hold live items only
    n0 = 16 if full else 6  # the dead insert never happened: keys go on from before it
    assert t.extend(transitions(2, n0)).tolist() == [n0, n0 + 1]
    t.close()


def test_table_whose_creator_died_can_be_attached_read_and_saved(tmp_path):
    proc = run_python(
        f"""
import os, signal
import numpy as np
import replaystore as rs
from replaystore.shared import SharedTable
import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
from conftest import transitions
spec = {{"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32), "id": ((), np.int64)}}
t = SharedTable.create("orphan", 32, spec, sampler=rs.Prioritized(), directory={str(tmp_path)!r})
t.extend(transitions(20), priorities=np.arange(1.0, 21.0))
os.kill(os.getpid(), signal.SIGKILL)
""",
        wait=False,
    )
    proc.wait(60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    [info] = list_segments(tmp_path)
    assert info["orphaned"]
    t = SharedTable.attach("orphan", directory=tmp_path)
    assert t.keys().tolist() == list(range(20))
    data, _ = t.get(t.keys())
    assert consistent(data)
    t.save(tmp_path / "ckpt")
    u = rs.Table.load(tmp_path / "ckpt")
    assert u.info(u.keys())["priorities"].tolist() == list(np.arange(1.0, 21.0))
    t.close()
    assert not (tmp_path / "replaystore-orphan").exists()


def _wrong_writer(table, queue):
    bad = transitions(3)
    bad["obs"] = bad["obs"].astype(np.float64)
    try:
        table.extend(bad)
        queue.put("no error")
    except rs.SpecError as e:
        queue.put(f"SpecError: {e}")


def test_spec_mismatch_from_one_writer_changes_nothing_for_the_others(tmp_path):
    t = SharedTable.create("spec", 16, SPEC, directory=tmp_path)
    t.extend(transitions(4))
    before = t.stats()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_wrong_writer, args=(t, q))
    p.start()
    assert q.get(timeout=30).startswith("SpecError: field 'obs'")
    p.join(10)
    assert t.stats() == before
    assert t.extend(transitions(1, 4)).tolist() == [4]
    t.close()


def _hold_lock(table, seconds, ready):
    with table._cond:
        ready.set()
        time.sleep(seconds)


def test_lock_held_by_a_live_process_times_out_then_frees(tmp_path):
    t = SharedTable.create("held", 16, SPEC, directory=tmp_path, lock_timeout=0.2)
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_hold_lock, args=(t, 1.0, ready))
    p.start()
    assert ready.wait(30)
    with pytest.raises(rs.Timeout, match=f"held by pid {p.pid}"):
        t.extend(transitions(1))
    p.join(10)
    assert t.extend(transitions(1)).tolist() == [0] and t.recoveries() == 0
    t.close()


def test_disk_full_is_raised_up_front(tmpfs_factory):
    small = tmpfs_factory("1m")
    with pytest.raises(rs.DiskFull, match=r"needs [\d,]+ bytes .* has [\d,]+ bytes free") as e:
        SharedTable.create("big", 100_000, SPEC, directory=small)
    assert e.value.wanted > 1 << 20
    assert list(small.iterdir()) == []
    t = SharedTable.create("small", 1000, SPEC, directory=small)
    t.extend(transitions(1000))
    assert len(t) == 1000
    t.close()
    assert list(small.iterdir()) == []


def test_cli_lists_and_removes_leftovers(tmp_path, capsys):
    from replaystore.cli import main

    t = SharedTable.create("cli", 16, SPEC, directory=tmp_path)
    assert main(["shm", "list", "--dir", str(tmp_path)]) == 0
    assert "cli" in capsys.readouterr().out
    assert main(["shm", "rm", "cli", "--dir", str(tmp_path)]) == 1  # still open: kept
    assert "is open" in capsys.readouterr().out and t.keys().tolist() == []
    t._segment.close(remove=False)  # as if its process had died
    (tmp_path / ".replaystore-x.tmp-999999999-ab").mkdir()  # a creator that died half way
    main(["shm", "list", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "leftover" in out and "incomplete" in out
    assert main(["shm", "rm", "--dir", str(tmp_path), "--all"]) == 0
    assert list(tmp_path.iterdir()) == []


def _producer(table, n):
    for i in range(n):
        table.extend(transitions(1, i), timeout=30)  # blocks while the queue is full


def test_queue_across_processes_delivers_each_item_once_in_order(tmp_path):
    t = SharedTable.create(
        "queue", 4, SPEC, sampler=rs.Fifo(), rate_limiter=rs.Queue(4), max_times_sampled=1, directory=tmp_path
    )
    p = mp.get_context("fork").Process(target=_producer, args=(t, 40))
    p.start()
    got = [int(t.sample(1, timeout=30).data["id"][0]) for _ in range(40)]
    p.join(10)
    assert p.exitcode == 0 and got == list(range(40))
    assert len(t) == 0 and t.stats()["retired"] == 40
    t.close()


def test_threads_of_one_process_share_a_handle(tmp_path):
    import threading

    t = SharedTable.create("threads", 4000, SPEC, sampler=rs.Prioritized(), directory=tmp_path)
    errors = []

    def write(w):
        try:
            for j in range(50):
                t.extend(transitions(8, w * 10_000 + j * 8))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        if len(t):
            assert consistent(t.sample(32).data)
    for th in threads:
        th.join()
    assert not errors and len(t) == 1600
    data, _ = t.get(t.keys())
    assert consistent(data)
    t.close()


# -- out of ring mode: distributions and crashes ---------------------------------------------------
def _sample_ids(name, directory, draws, queue):
    t = SharedTable.attach(name, directory=directory, seed=2)
    counts = np.zeros(16, dtype=np.int64)
    for _ in range(draws // 500):
        counts += np.bincount(t.sample(500).data["id"], minlength=16)
    queue.put(counts)
    t.close()


@pytest.mark.parametrize("sampler", ["Uniform", "Prioritized"])
def test_distribution_from_another_process_after_out_of_order_deletes(tmp_path, sampler):
    kw = {"sampler": rs.Prioritized(alpha=1.0)} if sampler == "Prioritized" else {}
    t = SharedTable.create("chi2", 16, SPEC, directory=tmp_path, **kw)
    t.extend(transitions(16), priorities=np.arange(1.0, 17.0))
    assert t.delete([2, 5, 9, 13, 14]) == 5  # out of insertion order: out of ring mode
    t.update_priorities([0, 15], [20.0, 3.0])
    live = t.keys()
    weights = t.info(live)["priorities"] if sampler == "Prioritized" else np.ones(len(live))
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_sample_ids, args=("chi2", str(tmp_path), 22000, q))
    p.start()
    counts = q.get(timeout=60)
    p.join(10)
    assert counts[[2, 5, 9, 13, 14]].sum() == 0  # deleted items are never drawn
    expected = 22000 * weights / weights.sum()
    chi2 = ((counts[live] - expected) ** 2 / expected).sum()
    assert chi2 < 37.3  # the 0.9999 quantile of chi-square with 10 degrees of freedom is 35.6; 11: 37.3
    t.close()


def _killed_while_paused(tmp_path, code: str, where: str = "pause-before-publish") -> None:
    """Run ``code`` in a new process that pauses at ``where`` (a test hook of shared/guard.py); SIGKILL it there."""
    marker = tmp_path / "paused"
    proc = run_python(code, env={"REPLAYSTORE_SHM_TEST_HOOK": f"{where}:{marker}"}, wait=False)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    marker.unlink()


ATTACH = (
    "from replaystore.shared import SharedTable\nimport numpy as np\n"
    "t = SharedTable.attach('{name}', directory={d!r})\n"
)


@pytest.mark.parametrize("ring", [True, False])
def test_process_killed_mid_delete_out_of_order(tmp_path, ring):
    t = SharedTable.create("middel", 16, SPEC, sampler=rs.Prioritized(), directory=tmp_path)
    t.extend(transitions(10), priorities=np.arange(1.0, 11.0))
    if not ring:
        t.delete([4])  # out of ring mode before the crash (else the dead call is the switch)
    _killed_while_paused(tmp_path, ATTACH.format(name="middel", d=str(tmp_path)) + "t.delete([1, 7])")
    t._segment.lock_timeout = 5.0
    keys = t.keys()  # recovered: the rows the dead delete cleared are gone, the rest is consistent
    expected = [0, 2, 3, 5, 6, 8, 9] if not ring else [0, 2, 3, 4, 5, 6, 8, 9]
    assert keys.tolist() == expected and t.recoveries() == 1 and t._ring is None
    assert len(t) == len(expected) and t.stats()["size"] == len(expected)
    s = t.sample(300)
    assert consistent(s.data) and set(s.keys.tolist()) <= set(expected)  # the trees hold live items only
    assert t.extend(transitions(2, 10)).tolist() == [10, 11]
    assert t.delete([3, 10]) == 2 and 3 not in t
    t.close()


@pytest.mark.parametrize(
    ("remover", "where"),
    [
        ("Fifo", "pause-before-publish"),
        ("Lifo", "pause-before-publish"),
        ("MinHeap", "pause-before-publish"),
        ("Fifo", "pause-after-victims"),  # killed before it overwrote the victims' rows: dropped all the same
        ("Lifo", "pause-after-victims"),
    ],
)
def test_writer_killed_mid_insert_out_of_ring_mode_leaves_no_torn_row(tmp_path, remover, where):
    t = SharedTable.create("midins", 12, SPEC, remover=getattr(rs, remover)(), directory=tmp_path)
    t.extend(transitions(13 if remover == "Fifo" else 12))  # (Fifo: 13 rows, the first one evicted)
    t.delete([6])
    t.extend(transitions(1, 13))  # full again, out of ring mode
    before, n0 = t.keys().tolist(), t.stats()["inserts"]
    bad = 'bad = {"obs": np.full((3, 4), -7, np.float32), "action": np.zeros(3, np.int64), '
    bad += '"reward": np.ones(3, np.float32), "id": np.arange(3)}\nt.extend(bad)\n'
    _killed_while_paused(tmp_path, ATTACH.format(name="midins", d=str(tmp_path)) + bad, where)
    t._segment.lock_timeout = 5.0
    keys = t.keys().tolist()
    data, found = t.get(keys)
    assert found.all() and consistent(data)  # no row of the dead writer, no overwritten row
    victims = before[-3:] if remover == "Lifo" else before[:3]  # the rows it overwrote in place (MinHeap: ties)
    assert keys == [k for k in before if k not in victims] and t.stats()["evictions"] >= 3
    s = t.sample(200)
    assert consistent(s.data) and set(s.keys.tolist()) <= set(keys)
    assert t.extend(transitions(2, 14)).tolist() == [n0, n0 + 1]  # the dead insert's keys were never published
    t.close()
