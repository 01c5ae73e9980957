"""Table.episode_info / Table.episode_keys: a step's place in its episode, by key."""

from __future__ import annotations

import numpy as np
import pytest

import replaystore as rs
from replaystore.errors import EpisodeError, InvalidArgument


def steps(n, start=0.0):
    return {"x": np.arange(start, start + n, dtype=np.float32)}


def snapshot(table):
    keys = table.keys()
    info = table.info(keys)
    return (
        len(table),
        keys.tolist(),
        info["times_sampled"].tolist(),
        info["priorities"].tolist(),
        table.rate_limiter.samples,
        table.rate_limiter.inserts,
    )


def test_interleaved_streams_open_closed_flags():
    t = rs.Table(100, episodes=rs.Episodes())
    k = []
    # two envs, one row each per call; env 0 ends after 3 steps (terminated), env 1 after 4 (truncated)
    for i in range(5):
        term = np.array([i == 2, False])
        trunc = np.array([False, i == 3])
        k.append(t.extend_steps(steps(2, 10 * i), streams=np.arange(2), terminated=term, truncated=trunc))
    k = np.array(k)  # (5, 2)
    info = t.episode_info(k[:, 0])
    assert info.found.all()
    np.testing.assert_array_equal(info.streams, 0)
    np.testing.assert_array_equal(info.stream_positions, np.arange(5))
    np.testing.assert_array_equal(info.positions, [0, 1, 2, 0, 1])
    np.testing.assert_array_equal(info.lengths, [3, 3, 3, 2, 2])  # the second episode is open: 2 so far
    np.testing.assert_array_equal(info.closed, [True, True, True, False, False])
    np.testing.assert_array_equal(info.complete, [True, True, True, False, False])
    np.testing.assert_array_equal(info.terminated, [True, True, True, False, False])
    assert not info.truncated.any()
    np.testing.assert_array_equal(info.is_last, [False, False, True, False, False])
    assert info.episodes[0] == info.episodes[2] != info.episodes[3]
    info1 = t.episode_info(k[:, 1])
    np.testing.assert_array_equal(info1.lengths, [4, 4, 4, 4, 1])
    np.testing.assert_array_equal(info1.truncated, [True] * 4 + [False])
    assert not info1.terminated.any()
    # closing the open episodes makes them complete
    assert t.end_episode([0, 1], truncated=True) == 2
    info = t.episode_info(k[3:, 0])
    assert info.closed.all() and info.complete.all() and info.truncated.all()
    np.testing.assert_array_equal(info.lengths, [2, 2])
    np.testing.assert_array_equal(info.is_last, [False, True])


def test_episode_keys_by_position():
    t = rs.Table(50, episodes=rs.Episodes())
    a = t.add_episode(steps(4), stream=0)
    b = t.add_episode(steps(3), stream=0)
    np.testing.assert_array_equal(t.episode_keys(a, 0), [a[0]] * 4)
    np.testing.assert_array_equal(t.episode_keys(b, np.arange(3)[::-1]), b[::-1])
    np.testing.assert_array_equal(t.episode_keys(a, 3), [a[3]] * 4)
    # beyond the end (the next episode's steps are not this episode's), negative, unknown keys
    np.testing.assert_array_equal(t.episode_keys(a, 4), -1)
    np.testing.assert_array_equal(t.episode_keys(a, -1), -1)
    np.testing.assert_array_equal(t.episode_keys([12345, a[1]], [0, 2]), [-1, a[2]])
    # a step not written yet
    c = t.extend_steps(steps(2), streams=0)
    np.testing.assert_array_equal(t.episode_keys(c, [1, 2]), [c[1], -1])


def test_eviction_mid_episode():
    t = rs.Table(6, remover=rs.Fifo(), episodes=rs.Episodes())
    a = t.add_episode(steps(4), stream=0)
    b = t.add_episode(steps(4), stream=0)  # evicts a[0], a[1]
    info = t.episode_info(np.r_[a, b])
    np.testing.assert_array_equal(info.found, [False, False, True, True, True, True, True, True])
    live = info.found
    np.testing.assert_array_equal(info.lengths[live], [4, 4, 4, 4, 4, 4])  # the end step a[3] is live
    np.testing.assert_array_equal(info.positions[live], [2, 3, 0, 1, 2, 3])
    np.testing.assert_array_equal(info.complete[live], [False, False, True, True, True, True])
    np.testing.assert_array_equal(info.closed[live], True)
    np.testing.assert_array_equal(t.episode_keys(a[2:], 0), -1)  # the first step is gone
    np.testing.assert_array_equal(t.episode_keys(a[2:], 3), a[3])
    assert (info.streams[~live] == -1).all() and (info.lengths[~live] == -1).all()
    assert not (info.closed[~live] | info.complete[~live] | info.is_last[~live]).any()
    # sample_episodes agrees on what is complete
    eps = t.sample_episodes(8)
    assert all(len(k) == 4 and (k == b).all() for k in eps.keys)


def test_deleted_end_step_and_hole():
    t = rs.Table(50, episodes=rs.Episodes())
    a = t.add_episode(steps(5), stream=0)
    b = t.add_episode(steps(3), stream=0)
    t.delete([a[2]])  # a hole: length still known, no longer complete
    info = t.episode_info(a)
    np.testing.assert_array_equal(info.lengths[info.found], 5)
    assert not info.complete.any() and info.closed[info.found].all()
    t.delete([a[4]])  # the end step: length unknown now (the scan meets episode b)
    info = t.episode_info(a)
    np.testing.assert_array_equal(info.lengths[info.found], -1)
    assert not info.terminated.any() and info.closed[info.found].all()
    assert t.episode_info(b).complete.all()
    # the end step of the stream's last episode deleted: the scan reaches the write position
    t.delete([b[2]])
    info = t.episode_info(b)
    np.testing.assert_array_equal(info.lengths[info.found], -1)
    assert info.closed[info.found].all() and not info.complete.any()


def test_unknown_keys_and_bad_input_change_nothing():
    t = rs.Table(20, episodes=rs.Episodes(), seed=0)
    t.add_episode(steps(5), stream=3)
    t.sample(2)
    before = snapshot(t)
    info = t.episode_info([-5, 10**9, 7])
    assert not info.found.any() and (info.streams == -1).all() and (info.lengths == -1).all()
    assert len(t.episode_info([])) == 0
    with pytest.raises(InvalidArgument):
        t.episode_info(["a"])
    with pytest.raises(InvalidArgument):
        t.episode_info([[1, 2]])
    with pytest.raises(EpisodeError):
        t.episode_keys([0, 1], [0.5, 1])
    with pytest.raises(EpisodeError):
        t.episode_keys([0, 1], [0, 1, 2])
    assert snapshot(t) == before
    plain = rs.Table(10)
    plain.extend(steps(3))
    with pytest.raises(EpisodeError):
        plain.episode_info([0])
    with pytest.raises(EpisodeError):
        plain.episode_keys([0], 0)


def test_against_a_reference_with_eviction_and_deletes():
    """Random interleaved writes, FIFO eviction and deletes, checked against a list of episodes."""
    rng = np.random.default_rng(7)
    cap = 40
    t = rs.Table(cap, remover=rs.Fifo(), episodes=rs.Episodes(), seed=1)
    episodes: list[dict] = []  # {"stream", "keys" (all written), "flags" (of the end, or None)}
    open_ep: dict[int, dict] = {}
    for step in range(300):
        op = rng.random()
        if op < 0.85:
            n = int(rng.integers(1, 4))
            streams = rng.integers(0, 3, n)
            term = rng.random(n) < 0.12
            trunc = ~term & (rng.random(n) < 0.08)
            keys = t.extend_steps(steps(n, step * 10), streams=streams, terminated=term, truncated=trunc)
            for s, k, te, tr in zip(streams.tolist(), keys.tolist(), term, trunc):
                ep = open_ep.get(s)
                if ep is None:
                    ep = open_ep[s] = {"stream": s, "keys": [], "end": None}
                    episodes.append(ep)
                ep["keys"].append(k)
                if te or tr:
                    ep["end"] = "terminated" if te else "truncated"
                    del open_ep[s]
        elif op < 0.95 and len(t):
            live = t.keys()
            t.delete(rng.choice(live, size=min(2, len(live)), replace=False))
        else:
            s = int(rng.integers(0, 3))
            if s in open_ep:
                t.end_episode([s], truncated=bool(rng.random() < 0.5))
                ep = open_ep.pop(s)
                last_live = ep["keys"][-1] in set(t.keys().tolist())
                ep["end"] = (
                    ("truncated" if t.episode_info([ep["keys"][-1]]).truncated[0] else "terminated")
                    if last_live
                    else "gone"
                )
        if step % 10:
            continue
        live = set(t.keys().tolist())
        all_keys = [k for ep in episodes for k in ep["keys"]]
        info = t.episode_info(all_keys)
        i = 0
        for ep in episodes:
            ks = ep["keys"]
            closed = ep["end"] is not None
            end_live = ks[-1] in live
            length = len(ks) if (not closed or end_live) else -1
            complete = closed and all(k in live for k in ks)
            for p, k in enumerate(ks):
                assert info.found[i] == (k in live)
                if k in live:
                    assert info.streams[i] == ep["stream"] and info.positions[i] == p
                    assert info.lengths[i] == length, (ep, p)
                    assert info.closed[i] == closed and info.complete[i] == complete
                    assert info.terminated[i] == (closed and end_live and ep["end"] == "terminated")
                    assert info.truncated[i] == (closed and end_live and ep["end"] == "truncated")
                    assert info.is_last[i] == (closed and p == len(ks) - 1 and ep["end"] != "gone")
                i += 1
        # episode_keys: every position of every live step's episode
        for ep in episodes:
            src = [k for k in ep["keys"] if k in live]
            if not src:
                continue
            for p, k in enumerate(ep["keys"]):
                want = k if k in live else -1
                assert (t.episode_keys(src, p) == want).all()


def test_checkpoint_keeps_what_episode_info_reports(tmp_path):
    t = rs.Table(12, remover=rs.Fifo(), episodes=rs.Episodes())
    t.add_episode(steps(5), stream=0)
    t.extend_steps(steps(6), streams=np.array([1, 0, 1, 0, 1, 0]), terminated=np.array([0, 0, 0, 1, 0, 0], bool))
    t.add_episode(steps(4), stream=2, terminated=False, truncated=True)  # evicts 3 steps of stream 0
    keys = np.arange(-1, 20)
    before = t.episode_info(keys)
    t.save(tmp_path / "ck")
    loaded = rs.Table.load(tmp_path / "ck")
    after = loaded.episode_info(keys)
    for name in before.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(before, name), getattr(after, name), err_msg=name)
    np.testing.assert_array_equal(t.episode_keys(keys, 1), loaded.episode_keys(keys, 1))
    assert before.found.sum() == 12 and before.truncated.sum() == 4
