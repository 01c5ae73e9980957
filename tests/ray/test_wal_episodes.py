"""Episodic Tables under a write-ahead log, without Ray: replaying the log (with or without a
checkpoint in the middle) rebuilds the same episode index (streams, positions, episode ids, end
flags), the same counters, and the streams continue where they were (hypothesis, against the
original table as the model)."""

import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ray_fixtures import log_then_replay

import replaystore as rs
from replaystore.samplers import selector_from_config
from replaystore.wal.log import WalConfig
from replaystore.wal.logged import LoggedTable

CAPACITY = 24
KINDS = {
    "fifo": dict(remover=rs.Fifo()),
    "fifo-retire": dict(remover=rs.Fifo(), max_times_sampled=2),
    "uniform-remover": dict(remover=rs.Uniform()),
    "lifo-retire": dict(remover=rs.Lifo(), max_times_sampled=1),
    "nstep-without-replacement": dict(sampler=rs.WithoutReplacement(), remover=rs.Fifo()),
}


def make_table(kind, seed=0):
    cfg = {k: selector_from_config(v.config()) for k, v in KINDS[kind].items() if k != "max_times_sampled"}
    return rs.Table(
        CAPACITY,
        seed=seed,
        max_staleness=2,
        max_times_sampled=KINDS[kind].get("max_times_sampled", 0),
        episodes=rs.Episodes(max_streams=8, next_obs_field="next_obs"),
        **cfg,
    )


def steps(ids):
    ids = np.asarray(ids, dtype=np.int64)
    return {
        "obs": ids.astype(np.float32)[:, None],
        "next_obs": (ids + 1).astype(np.float32)[:, None],
        "reward": np.ones(len(ids), np.float32),
        "id": ids,
    }


def run_ops(lt, ops, nid=0):
    t = lt.table
    for op, a, b in ops:
        try:
            if op == "extend_steps":  # a vectorised env: distinct streams, some ending
                n = a % 4 + 1
                streams = (np.arange(n) + b) % 8
                lt.durable(
                    "extend_steps", steps(np.arange(nid, nid + n)), streams, terminated=np.arange(n) == a % 3, timeout=0
                )
                nid += n
            elif op == "one_stream":  # rows of one stream in one call, with an end inside
                lt.durable(
                    "extend_steps",
                    steps(np.arange(nid, nid + 3)),
                    int(b % 8),
                    truncated=[False, a % 2 == 0, False],
                    timeout=0,
                )
                nid += 3
            elif op == "add_step":
                lt.durable(
                    "add_step", {k: v[0] for k, v in steps([nid]).items()}, int(b % 8), terminated=a % 4 == 0, timeout=0
                )
                nid += 1
            elif op == "add_episode":
                lt.durable(
                    "add_episode",
                    steps(np.arange(nid, nid + a % 3 + 1)),
                    None if b % 2 else int(b % 8),
                    terminated=b % 3 != 0,
                    truncated=b % 3 == 0,
                    timeout=0,
                )
                nid += a % 3 + 1
            elif op == "end_episode":
                lt.durable("end_episode", [int(b % 8), int((b + a) % 8)], truncated=a % 2 == 1)
            elif op == "stale":
                lt.durable("extend_steps", steps([nid]), int(b % 8), version=t.version - 5, timeout=0)
                nid += 1
            elif op == "version":
                lt.durable("set_version", t.version + 1)
            elif op == "delete":
                keys = t.keys()
                lt.durable("delete", keys[a % max(1, len(keys)) :: 3])
            elif op == "sample":
                lt.durable("sample", a % 3 + 1, timeout=0)
            elif op == "sequences":
                lt.durable("sample_sequences", 2, 2, mode="padded" if a % 2 else "strict", timeout=0)
            elif op == "nstep":
                lt.durable("sample_nstep", 3, 2, 0.9, timeout=0)
            elif op == "episodes":
                lt.durable("sample_episodes", 2, timeout=0)
            elif op == "clear":
                lt.durable("clear")
        except (rs.Timeout, rs.NoValidSequence, rs.UnknownStream):
            pass
        except rs.EpisodeError as e:
            assert "open episode" in str(e) or "stream" in str(e), e
    return nid


NAMES = [
    "extend_steps",
    "one_stream",
    "add_step",
    "add_episode",
    "end_episode",
    "stale",
    "version",
    "delete",
    "sample",
    "sequences",
    "nstep",
    "episodes",
]
OPS = st.lists(
    st.tuples(st.sampled_from(NAMES * 4 + ["clear"]), st.integers(0, 11), st.integers(0, 15)), min_size=6, max_size=40
)


def assert_same(a: rs.Table, b: rs.Table):
    ka, kb = np.sort(a.keys()), np.sort(b.keys())
    assert np.array_equal(ka, kb)
    ia, ib = a.info(ka), b.info(ka)
    for k in ia:
        assert np.array_equal(ia[k], ib[k]), k
    ea, eb = a.episode_info(ka), b.episode_info(ka)
    for f in (
        "found",
        "streams",
        "episodes",
        "stream_positions",
        "positions",
        "lengths",
        "closed",
        "complete",
        "terminated",
        "truncated",
        "is_last",
    ):
        assert np.array_equal(getattr(ea, f), getattr(eb, f)), f
    if len(ka):
        assert np.array_equal(a.get(ka)[0]["id"], b.get(ka)[0]["id"])
    sa, sb = a.stats(), b.stats()
    for k in set(sa) - {"insert_blocked_s", "sample_blocked_s"}:
        assert sa[k] == sb[k], (k, sa[k], sb[k])


def assert_continue_alike(a: rs.Table, b: rs.Table, nid: int):
    """The next step of every stream lands at the same place in both tables (episodes continue)."""
    for s in range(8):
        row = {k: v[0] for k, v in steps([nid + s]).items()}
        ka, kb = a.add_step(row, s, timeout=0), b.add_step(row, s, timeout=0)
        assert ka == kb
        if ka >= 0:
            ea, eb = a.episode_info([ka]), b.episode_info([kb])
            assert (ea.episodes[0], ea.stream_positions[0], ea.positions[0]) == (
                eb.episodes[0],
                eb.stream_positions[0],
                eb.positions[0],
            )


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(sorted(KINDS)), ops=OPS, ops2=OPS, checkpoint=st.booleans())
def test_episodic_replay_equals_original(kind, ops, ops2, checkpoint):
    d = tempfile.mkdtemp()
    try:
        t, lt, restored, lt2, nid = log_then_replay(d, lambda: make_table(kind), run_ops, ops, ops2, checkpoint)
        lt2.close()
        assert_same(t, restored)
        assert restored.stats()["wal_lsn"] == lt.wal.last_lsn
        assert_continue_alike(t, restored, nid)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_sequences_and_nstep_read_the_same_episodes_after_replay(tmp_path):
    """A table rebuilt from its log samples n-step returns and sequences over the same episodes."""
    cfg = WalConfig(dir=str(tmp_path), fsync="never")
    t = rs.Table(1000, seed=1, episodes=rs.Episodes(next_obs_field="next_obs"))
    lt = LoggedTable.open(t, str(tmp_path / "wal"), cfg)
    rng = np.random.default_rng(0)
    nid = 0
    for _ in range(60):  # 4 envs, episodes ending at random
        ends = rng.random(4) < 0.15
        lt.durable("extend_steps", steps(np.arange(nid, nid + 4)), np.arange(4), terminated=ends)
        nid += 4
    lt.durable("end_episode", [0, 1], truncated=True)
    lt.close()
    r = rs.Table(1000, seed=1, episodes=rs.Episodes(next_obs_field="next_obs"))
    LoggedTable.open(r, str(tmp_path / "wal"), cfg).close()
    assert_same(t, r)
    a, b = t.sample_nstep(64, 3, 0.9), r.sample_nstep(64, 3, 0.9)  # same seed, same state: same draws
    assert np.array_equal(a.keys, b.keys) and np.allclose(a.returns, b.returns)
    assert np.array_equal(a.discount, b.discount)
    sa, sb = t.sample_sequences(16, 4), r.sample_sequences(16, 4)
    assert np.array_equal(sa.step_keys, sb.step_keys)


def test_end_episode_of_an_unknown_stream_logs_nothing(tmp_path):
    t = rs.Table(10, episodes=rs.Episodes())
    lt = LoggedTable.open(t, str(tmp_path / "wal"), WalConfig(dir=str(tmp_path)))
    lt.durable("add_step", {"obs": np.float32(1)}, 0)
    with pytest.raises(rs.UnknownStream):
        lt.end_episode([5])
    with pytest.raises(rs.EpisodeError):
        lt.extend_steps({"obs": np.zeros(2, np.float32)}, streams=[0, -1])
    assert lt.wal.last_lsn == 1 and t.stats()["wal_lsn"] == 1 and len(t) == 1
    lt.close()
