"""Frame-stack storage in a shared table: the stacks an in-process table gives, across processes, after a crash.

Every frame holds a code that says whose frame it is (writer, episode, frame index), so any item's
``obs``/``next_obs`` stacks can be recomputed from its ``id`` (:func:`expected`): a torn or mixed
stack shows.
"""

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_shared_processes import ATTACH, run_python

import replaystore as rs
from replaystore.shared import SharedTable

S = 4
FRAME = (3, 2)
SPEC = {
    "obs": ((S, *FRAME), np.int32),
    "next_obs": ((S, *FRAME), np.int32),
    "action": ((), np.int64),
    "done": ((), np.bool_),
    "id": ((), np.int64),
}


def code(w: int, e: int, j: int) -> int:
    return w * 100_000 + e * 1_000 + j


def steps(w: int, e: int, t0: int, n: int, length: int) -> dict:
    """Transitions ``t0 .. t0 + n - 1`` of episode ``e`` (``length`` steps) of writer ``w``, as a batch."""
    t = np.arange(t0, t0 + n)
    k = np.arange(S)
    obs = code(w, e, np.maximum(t[:, None] - S + 1 + k, 0))
    nxt = code(w, e, np.maximum(t[:, None] - S + 2 + k, 0))
    shape = (n, S, *FRAME)
    return {
        "obs": np.broadcast_to(obs[:, :, None, None], shape).astype(np.int32),
        "next_obs": np.broadcast_to(nxt[:, :, None, None], shape).astype(np.int32),
        "action": t % 3,
        "done": t == length - 1,
        "id": code(w, e, t),
    }


def expected(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stacks of the items ``ids`` (as :func:`steps` made them)."""
    t = ids % 1000
    base = ids - t
    k = np.arange(S)
    obs = base[:, None] + np.maximum(t[:, None] - S + 1 + k, 0)
    nxt = base[:, None] + np.maximum(t[:, None] - S + 2 + k, 0)
    return obs, nxt


def intact(data) -> bool:
    obs, nxt = expected(data["id"])
    return bool(
        (data["obs"] == obs[:, :, None, None]).all()
        and (data["next_obs"] == nxt[:, :, None, None]).all()
        and (data["action"] == (data["id"] % 1000) % 3).all()
    )


def feed(table, w: int, episodes: int, length: int, chunk: int) -> None:
    """Writer ``w``'s episodes, extended ``chunk`` steps at a time (``chunk == 1``: single adds)."""
    for e in range(episodes):
        for t0 in range(0, length, chunk):
            batch = steps(w, e, t0, min(chunk, length - t0), length)
            if chunk == 1:
                table.add({k: v[0] for k, v in batch.items()})
            else:
                table.extend(batch)


@pytest.mark.parametrize(("chunk", "frame_capacity"), [(1, None), (7, None), (5, 70)])
def test_same_stacks_and_frames_as_in_process(tmp_path, chunk, frame_capacity):
    storage = rs.FrameStackStorage(48, frame_capacity=frame_capacity)
    t = SharedTable.create("fs", 48, SPEC, storage=storage, directory=tmp_path, seed=1)
    ref = rs.Table(48, storage=rs.FrameStackStorage(48, spec=SPEC, frame_capacity=frame_capacity), seed=1)
    for table in (t, ref):
        feed(table, 0, 4, 23, chunk)
    keys = t.keys()
    assert keys.tolist() == ref.keys().tolist() and len(keys) < 4 * 23  # (evictions, small frame ring too)
    assert t.storage._wpos == ref.storage._wpos  # the same frames written: the same saving
    data, found = t.get(keys)
    assert found.all() and intact(data)
    a, b = t.sample(64), ref.sample(64)  # the same seed, the same draws
    assert a.keys.tolist() == b.keys.tolist() and intact(a.data)
    for k in ("obs", "next_obs"):
        assert np.array_equal(a.data[k], b.data[k])
    t.close()


def test_bad_storage_options_are_refused_with_named_errors(tmp_path):
    with pytest.raises(rs.InvalidArgument, match="frame stacks"):
        SharedTable.create("bad", 8, SPEC, storage="memmap", directory=tmp_path)
    with pytest.raises(rs.InvalidArgument, match="episodes"):
        SharedTable.create(
            "bad", 8, SPEC, storage=rs.FrameStackStorage(8), episodes=rs.Episodes(max_streams=2), directory=tmp_path
        )
    with pytest.raises(rs.ReplayError, match="Fifo"):
        SharedTable.create("bad", 8, SPEC, storage=rs.FrameStackStorage(8), remover=rs.Lifo(), directory=tmp_path)
    with pytest.raises(rs.SpecError, match="next_obs"):
        SharedTable.create("bad", 8, SPEC, storage=rs.FrameStackStorage(8, next_obs_key="nxt"), directory=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing left behind


def _writer(table, w):
    feed(table, w, 3, 40, 8)
    table.close()


def test_two_writer_processes_and_a_sampling_process(tmp_path):
    t = SharedTable.create("fs2", 400, SPEC, storage=rs.FrameStackStorage(400), directory=tmp_path)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(t, w)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert len(t) == 240
    data, found = t.get(t.keys())
    assert found.all() and intact(data)
    writers = data["id"] // 100_000
    for w in (1, 2):  # each writer's items in its own order
        ids = data["id"][writers == w]
        assert np.all(np.diff(ids) > 0) and len(ids) == 120
    # interleaved chunks: a chunk that does not continue the newest item starts a segment (S extra frames)
    assert 240 <= t.storage._wpos <= 240 + 30 * S
    out = run_python(
        ATTACH.format(name="fs2", d=str(tmp_path))
        + f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        + "from test_shared_frames import intact\n"
        + "s = t.sample(256)\nprint(intact(s.data), len(set(s.keys.tolist())))\nt.close()\n"
    )
    ok, distinct = out.split()
    assert ok == "True" and int(distinct) > 100
    t.save(tmp_path / "ckpt")  # a checkpoint of the shared table loads as an in-process frame-stack table
    back = rs.Table.load(tmp_path / "ckpt")
    assert isinstance(back.storage, rs.FrameStackStorage) and back.keys().tolist() == t.keys().tolist()
    assert intact(back.get(back.keys())[0]) and back.storage.frames_written <= t.storage.frames_written
    t.close()


def _killed_mid_extend(tmp_path, name: str, code_: str) -> None:
    marker = tmp_path / "paused"
    proc = run_python(
        ATTACH.format(name=name, d=str(tmp_path)) + code_,
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


@pytest.mark.parametrize("frame_capacity", [None, 40])
def test_writer_killed_mid_insert_leaves_no_torn_stack(tmp_path, frame_capacity):
    """Killed before publishing an insert that overwrote the oldest frames (and, full, the oldest slots)."""
    t = SharedTable.create(
        "fsk", 32, SPEC, storage=rs.FrameStackStorage(32, frame_capacity=frame_capacity), directory=tmp_path
    )
    feed(t, 0, 2, 20, 4)  # 40 steps into 32 slots: full, the ring has gone round
    before = t.keys().tolist()
    n0 = t.stats()["inserts"]
    # a new episode of writer 7 (a segment start: S + 6 frames), its frames over the oldest ones
    _killed_mid_extend(
        tmp_path,
        "fsk",
        f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        + "from test_shared_frames import steps\nt.extend(steps(7, 0, 0, 6, 50))\n",
    )
    t._segment.lock_timeout = 5.0
    keys = t.keys().tolist()
    assert t.recoveries() == 1
    data, found = t.get(keys)
    assert found.all() and intact(data)  # no stack with a frame of the dead writer
    assert not (data["id"] // 100_000 == 7).any()
    assert keys == before[len(before) - len(keys) :]  # the oldest items were dropped, the newest kept
    # the dead insert wrote S + 6 frames over the oldest ones (and 6 slots): at most that many items lost
    assert len(before) - (S + 6) <= len(keys) < len(before)
    s = t.sample(200)
    assert intact(s.data) and set(s.keys.tolist()) <= set(keys)
    # the table goes on: new items continue the published newest frame (no segment start)
    w0 = t.storage._wpos
    assert t.extend(steps(0, 2, 0, 5, 20)).tolist() == list(range(n0, n0 + 5))
    assert t.extend(steps(0, 2, 5, 5, 20)).tolist() == list(range(n0 + 5, n0 + 10))
    assert t.storage._wpos == w0 + (S + 5) + 5
    data, found = t.get(t.keys())
    assert found.all() and intact(data)
    t.close()


def test_recovery_check_flags_exactly_the_items_whose_frames_a_dead_write_overwrote():
    """The storage's own check (a safety net under the table's intent and victim notes)."""
    ref = rs.Table(48, storage=rs.FrameStackStorage(48, spec=SPEC, frame_capacity=40))
    feed(ref, 0, 2, 30, 6)  # the frame ring (not the slots) limits the table: the ring has gone round
    st = ref.storage
    published = {n: getattr(st, n) for n in st.SCALARS}
    slots = np.flatnonzero(st._alive)
    slots = slots[np.argsort(st._obs_end[slots])]  # insertion order
    assert st.intact_after_crash(slots, published, 0).all()  # nothing written since: all intact
    # a dead insert wrote a segment start (S + 2 frames) into two free slots, and was never published
    free = np.flatnonzero(~st._alive)[:2]
    st.write(free, (steps(9, 0, 0, 2, 5), None))
    ok = st.intact_after_crash(slots, published, 2)
    low = published["_wpos"] + S + 2 - st.frame_capacity  # the positions it wrote, one ring earlier
    assert ok.tolist() == (st._obs_end[slots] - S + 1 >= low).tolist() and 0 < (~ok).sum() < len(slots)
    assert not st.intact_after_crash(free, published, 2).any()  # positions past the published ones
    kept = slots[ok]
    fixed = st.rebuild_after_crash(kept, published)  # the log is rebuilt from its start
    assert fixed == {**published, "_log_head": 0, "_log_tail": len(kept)}
    assert st._alive.sum() == len(kept) and st._alive[kept].all()
    data = st.read(kept)
    data["id"] = st.columns["id"][kept]
    assert intact(data)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    calls=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 9), st.integers(2, 14), st.booleans()), min_size=1, max_size=14
    ),
    frame_capacity=st.sampled_from([None, 30, 45]),
)
def test_any_sequence_of_extends_reads_back_as_in_process(tmp_path_factory, calls, frame_capacity):
    """Writers' chunks (possibly interleaved, episodes of any length, deletes of the oldest) against the plain model.

    The model is the in-process frame-stack table fed the same calls: the same keys, the same
    frames written, every stack as inserted. Writer ``w`` calls through handle ``w % 2`` (two
    attachments: each loads the state the other published, as two processes do).
    """
    d = tmp_path_factory.mktemp("fsh")
    t = SharedTable.create(
        "fsh", 24, SPEC, storage=rs.FrameStackStorage(24, frame_capacity=frame_capacity), directory=d
    )
    ref = rs.Table(24, storage=rs.FrameStackStorage(24, spec=SPEC, frame_capacity=frame_capacity))
    handles = [t, SharedTable.attach("fsh", d)]
    pos = {}  # writer -> (episode, next step)
    try:
        for w, n, length, delete_oldest in calls:
            e, t0 = pos.get(w, (0, 0))
            n = min(n, length - t0) if t0 < length else n
            if t0 >= length:  # the episode ended: the next one
                e, t0 = e + 1, 0
                n = min(n, length)
            batch = steps(w, e, t0, n, max(length, t0 + n))
            h = handles[w % 2]
            assert h.extend(batch).tolist() == ref.extend(batch).tolist()
            pos[w] = (e, t0 + n) if not batch["done"][-1] else (e + 1, 0)
            if delete_oldest and len(ref):
                oldest = ref.keys()[:2]
                assert h.delete(oldest) == ref.delete(oldest)
            other = handles[1 - w % 2]
            assert other.keys().tolist() == ref.keys().tolist()  # (enters the lock: loads the state)
            assert other.storage.frames_written == ref.storage.frames_written
        data, found = t.get(t.keys())
        assert found.all() and intact(data)
    finally:
        handles[1].close()
        t.close()
