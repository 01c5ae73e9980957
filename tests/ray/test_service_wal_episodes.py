"""A durable episodic served Table on a real local Ray: two env writers (``extend_steps`` and
``add_step``) and an n-step / sequence learner run while the service's process is killed (SIGKILL
of its pid, and ``ray.kill``); after the restart every acknowledged step is there, each stream's
steps sit at consecutive positions in the order they were written, episodes end and start where
the flags say, the streams continue where they were, and sampling n-step and sequences works."""

import os
import signal
import threading
import time

import numpy as np
import pytest
from ray_fixtures import start_ray, wait_restarted

import replaystore as rs

pytestmark = pytest.mark.timeout(240)
STREAMS_PER_WRITER = 4
EPISODE = 7  # a stream's step t ends an episode when t % EPISODE == EPISODE - 1


@pytest.fixture(scope="module")
def ray_local():
    ray = start_ray()
    yield ray
    ray.shutdown()


def until(cond, what, seconds=60.0):
    """Poll ``cond`` (the writer threads' progress) until true; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def episodic_table():
    return rs.Table(200_000, seed=0, episodes=rs.Episodes(next_obs_field="next_obs", max_streams=64))


def steps(stream, t):
    """Rows for ``stream[i]`` at its step ``t[i]``: ``id`` encodes both."""
    stream, t = np.atleast_1d(stream).astype(np.int64), np.atleast_1d(t).astype(np.int64)
    ids = stream * 1_000_000 + t
    return {
        "obs": ids.astype(np.float32),
        "next_obs": (ids + 1).astype(np.float32),
        "reward": np.ones(len(ids), np.float32),
        "id": ids,
    }


@pytest.mark.parametrize("how", ["sigkill", pytest.param("ray.kill", marks=pytest.mark.slow)])
def test_acknowledged_steps_survive_a_crash_and_episodes_continue(ray_local, tmp_path, how):
    from replaystore import ray as rsr

    name = f"svc-wal-ep-{how.replace('.', '-')}"
    # no retries by Ray: a call cut off by the crash fails (not acknowledged) instead of running twice
    c = rsr.serve(
        {"ep": episodic_table},
        name=name,
        max_restarts=-1,
        max_task_retries=0,
        checkpoint_dir=str(tmp_path / "ckpt"),
        wal=rsr.WalConfig(dir=str(tmp_path / "wal"), fsync="always"),
    )
    acked: list[set[int]] = [set(), set()]
    failed = [0, 0]
    learned = [0]
    stop = threading.Event()

    def writer(w):
        streams = np.arange(STREAMS_PER_WRITER) + STREAMS_PER_WRITER * w
        t = 0
        while not stop.is_set():
            ends = np.full(len(streams), t % EPISODE == EPISODE - 1)
            try:
                if w == 0:  # a vectorised env: one row per stream per call
                    c.extend_steps(steps(streams, t), streams=streams, terminated=ends, timeout=30)
                    acked[w].update(steps(streams, t)["id"].tolist())
                else:  # one env step at a time
                    for s in streams:
                        row = {k: v[0] for k, v in steps(s, t).items()}
                        c.add_step(row, stream=int(s), terminated=bool(ends[0]), timeout=30)
                        acked[w].add(int(row["id"]))
            except (rs.Timeout, rs.Closed):
                failed[w] += 1  # not acknowledged: may or may not be there; the env moves on
            t += 1

    def learner():
        while not stop.is_set():
            try:
                c.sample_nstep(8, 3, 0.9, timeout=1)
                c.sample_sequences(4, 3, timeout=1)
                learned[0] += 1
            except (rs.Timeout, rs.Closed, rs.NoValidSequence):
                time.sleep(0.01)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)] + [threading.Thread(target=learner)]
    for th in threads:
        th.start()
    try:  # (progress is polled, not slept for: a loaded machine may take seconds per call)
        until(lambda: min(len(a) for a in acked) > 0, "the writers")
        c.save()  # a checkpoint in the middle: the restart loads it, then replays the log's tail
        mark = [len(a) for a in acked]
        until(lambda: all(len(acked[w]) > mark[w] for w in range(2)), "writes after the checkpoint")
        before = [len(a) for a in acked]
        if how == "sigkill":
            os.kill(ray_local.get(c.actor.pid.remote(), timeout=30), signal.SIGKILL)
        else:
            ray_local.kill(c.actor, no_restart=False)
        wait_restarted(c)
        # the envs and the learner go on against the restarted service: until both writers have
        # been acknowledged again (bounded: a loaded machine may take a while to replay the log)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (all(len(acked[w]) > before[w] for w in range(2)) and learned[0]):
            time.sleep(0.1)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    assert min(before) > 0 and all(len(acked[w]) > before[w] for w in range(2)), (before, acked, failed)
    assert learned[0] > 0
    keys = c.keys()
    data, found = c.get(keys)
    assert found.all()
    ids = data["id"]
    missing = (acked[0] | acked[1]) - set(ids.tolist())
    assert not missing, f"{len(missing)} acknowledged steps lost, e.g. {sorted(missing)[:5]}"
    assert len(np.unique(ids)) == len(ids)  # nothing applied twice
    info = c.episode_info(keys)
    assert info.found.all()
    stream_of, t_of = ids // 1_000_000, ids % 1_000_000
    assert np.array_equal(info.streams, stream_of)  # every step in the stream it was written to
    for s in range(2 * STREAMS_PER_WRITER):
        rows = np.flatnonzero(stream_of == s)
        rows = rows[np.argsort(info.stream_positions[rows])]
        # consecutive positions 0..m-1, in the order the env wrote them (across the restart)
        assert np.array_equal(info.stream_positions[rows], np.arange(len(rows))), s
        assert (np.diff(t_of[rows]) > 0).all(), s
        ep, pos, last = info.episodes[rows], info.positions[rows], info.is_last[rows]
        assert np.array_equal(last, t_of[rows] % EPISODE == EPISODE - 1), s  # the flags as written
        new = np.r_[True, last[:-1]]  # a step after an end starts an episode, others continue it
        assert (pos[new] == 0).all() and (pos[~new] == pos[np.flatnonzero(~new) - 1] + 1).all(), s
        assert (ep[~new] == ep[np.flatnonzero(~new) - 1]).all() and len(np.unique(ep[new])) == new.sum(), s
    # the next step of a stream takes the next position of its episode
    s0 = 0
    rows0 = np.flatnonzero(stream_of == s0)
    tail = rows0[np.argmax(info.stream_positions[rows0])]
    k = c.add_step({k: v[0] for k, v in steps(s0, 999_999).items()}, stream=s0, timeout=10)
    nxt = c.episode_info([k])
    assert nxt.stream_positions[0] == info.stream_positions[tail] + 1
    if not info.is_last[tail]:
        assert nxt.episodes[0] == info.episodes[tail] and nxt.positions[0] == info.positions[tail] + 1
    n = c.sample_nstep(64, 3, 0.9, timeout=10)
    assert (n.steps >= 1).all() and np.isfinite(n.returns).all()
    seq = c.sample_sequences(16, 3, timeout=10)
    # consecutive steps of one stream: ids grow by one, except across a step whose write failed
    # during the restart (not acknowledged, not stored: the env moved on, the positions did not)
    sid = seq.data["id"]
    assert seq.mask.all() and (sid // 1_000_000 == sid[:, :1] // 1_000_000).all()
    gaps = np.diff(sid, axis=1)
    assert (gaps >= 1).all() and (sum(failed) > 0 or (gaps == 1).all())
    st = c.stats()["ep"]
    assert st["wal"]["failing"] == 0 and st["wal"]["last_lsn"] >= st["wal"]["durable_lsn"] > 0
    c.shutdown()
