"""Issue 24, item 2: a checkpoint's episode files must describe one consistent history.

Each test saves an episodic table, alters its episode arrays (or the stream state in the manifest)
the way a bug or an attacker could, re-signs the checkpoint with the project's own checksum code
(so only the consistency checks can notice) and expects ``CheckpointError`` naming the problem.
Untampered checkpoints of many shapes (removers, deletes, staleness, retirement, clears, long
gaps) must still load, as the same table.
"""

import hashlib
import json

import numpy as np
import pytest

import replaystore as rs
from replaystore.checkpoint.verify import digest as _digest  # the saver's own file checksum
from replaystore.episodes.consistency import check_index_arrays


def step(i):
    return {"obs": np.float32([i]), "next_obs": np.float32([i + 1]), "reward": np.float32(1)}


def rows(ids):
    ids = np.asarray(ids)
    return {"obs": ids[:, None].astype(np.float32), "next_obs": ids[:, None] + 1.0, "reward": np.ones(len(ids))}


def resign(ck):
    m = json.loads((ck / "manifest.json").read_text())
    for name, info in m["files"].items():
        info["bytes"], info["sha256"] = _digest(ck / name)
    raw = json.dumps(m).encode()
    (ck / "manifest.json").write_bytes(raw)
    (ck / "manifest.sha256").write_text(hashlib.sha256(raw).hexdigest() + "  manifest.json\n")


def build():
    """Stream 0: episode A (t 0-3, terminated), B (t 4-7, terminated), E (t 8-9, open).
    Stream 1: C (t 0-2, truncated), D (t 3-5, open). Writes interleave the two streams."""
    t = rs.Table(64, remover=rs.Fifo(), episodes=rs.Episodes(next_obs_field="next_obs"), seed=0)
    t.extend_steps(rows(range(4)), streams=0, terminated=[0, 0, 0, 1])
    t.extend_steps(rows(range(10, 13)), streams=1, truncated=[0, 0, 1])
    t.extend_steps(rows(range(4, 8)), streams=0, terminated=[0, 0, 0, 1])
    t.extend_steps(rows(range(13, 16)), streams=1)
    t.extend_steps(rows(range(8, 10)), streams=0)
    return t


@pytest.fixture
def ck(tmp_path):
    path = tmp_path / "ck"
    build().save(path)
    return path


def arrays(ck):
    return {n: np.load(ck / f"episodes_{n}.npy") for n in ("stream", "t", "episode", "pos", "flags")}


def rows_of(a, stream, ts):
    """Row indices (key order) of positions ``ts`` of ``stream``."""
    return [int(np.flatnonzero((a["stream"] == stream) & (a["t"] == x))[0]) for x in ts]


def tamper(ck, change_arrays=None, change_streams=None):
    a = arrays(ck)
    if change_arrays:
        change_arrays(a)
        for n, v in a.items():
            np.save(ck / f"episodes_{n}.npy", v)
    if change_streams:
        m = json.loads((ck / "manifest.json").read_text())
        change_streams(m["episodes"]["streams"])
        (ck / "manifest.json").write_text(json.dumps(m))
    resign(ck)


def refused(ck, match):
    with pytest.raises(rs.CheckpointError, match=match):
        rs.Table.load(ck)


def test_the_fixture_loads_and_has_the_structure_the_tampers_assume(ck):
    a = arrays(ck)
    assert a["stream"].tolist() == [0] * 4 + [1] * 3 + [0] * 4 + [1] * 3 + [0] * 2
    assert a["t"].tolist() == [0, 1, 2, 3, 0, 1, 2, 4, 5, 6, 7, 3, 4, 5, 8, 9]
    assert a["flags"].tolist() == [0, 0, 0, 1, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    m = json.loads((ck / "manifest.json").read_text())["episodes"]["streams"]
    assert m["ids"] == [0, 1] and m["next_t"] == [10, 6] and m["cur_pos"] == [2, 3]
    resign(ck)  # re-signing alone changes nothing
    u = rs.Table.load(ck)
    assert u.episode_info(u.keys()).lengths.tolist() == [4] * 4 + [3] * 3 + [4] * 4 + [3] * 3 + [2] * 2


def test_two_episodes_merged_by_id(ck):
    # B's steps take A's id: one "episode" whose positions restart at t = 4
    def f(a):
        b = rows_of(a, 0, range(4, 8))
        a["episode"][b] = a["episode"][rows_of(a, 0, [0])[0]]

    tamper(ck, f)
    refused(ck, "not one run of positions")


def test_two_episodes_merged_with_positions_renumbered(ck):
    # B's steps become positions 4-7 of A: A's termination is then mid-episode
    def f(a):
        b = rows_of(a, 0, range(4, 8))
        a["episode"][b] = a["episode"][rows_of(a, 0, [0])[0]]
        a["pos"][b] = np.arange(4, 8)

    tamper(ck, f)
    refused(ck, "end flag but is not the episode's last step")


def test_end_flag_cleared(ck):
    def f(a):
        a["flags"][rows_of(a, 0, [3])] = 0  # A's termination: n-step would sum into B

    tamper(ck, f)
    refused(ck, "carries no end flag, but the next position starts episode")


def test_end_flag_cleared_on_the_newest_step_of_a_closed_stream(tmp_path):
    t = rs.Table(16, episodes=rs.Episodes())
    t.extend_steps(rows(range(3)), streams=0, terminated=[0, 0, 1])
    t.save(tmp_path / "ck")
    tamper(tmp_path / "ck", lambda a: a["flags"].__setitem__(2, 0))
    refused(tmp_path / "ck", "no open episode but its newest step")


def test_end_flag_set_mid_episode(ck):
    tamper(ck, lambda a: a["flags"].__setitem__(rows_of(a, 0, [5])[0], 1))
    refused(ck, "end flag but is not the episode's last step")


def test_end_flag_set_on_an_open_episode(ck):
    tamper(ck, lambda a: a["flags"].__setitem__(rows_of(a, 1, [5])[0], 2))
    refused(ck, "open episode .* has an end flag")


def test_duplicate_stream_position(ck):
    tamper(ck, lambda a: a["t"].__setitem__(rows_of(a, 0, [5])[0], 4))
    refused(ck, "positions must strictly increase")


def test_swapped_stream_positions(ck):
    # a sequence would read positions [2, 1, 3, 4]
    def f(a):
        i, j = rows_of(a, 0, [1, 2])
        a["t"][[i, j]] = a["t"][[j, i]]
        a["pos"][[i, j]] = a["pos"][[j, i]]

    tamper(ck, f)
    refused(ck, "positions must strictly increase")


def test_episode_moved_to_another_stream(ck):
    # C (stream 1, t 0-2) claims stream 0
    tamper(ck, lambda a: a["stream"].__setitem__(rows_of(a, 1, [0, 1, 2]), 0))
    refused(ck, "positions must strictly increase|episode ids grow|starts at position")


def test_episode_moved_to_a_fresh_stream_position_range(ck):
    # B's steps move to stream 1 at positions after D: stream 1's ids then decrease
    def f(a):
        b = rows_of(a, 0, range(4, 8))
        a["stream"][b] = 1

    tamper(ck, f)
    refused(ck, "whose next position is 6")


def test_step_at_position_7_of_a_two_step_episode(ck):
    tamper(ck, lambda a: a["pos"].__setitem__(rows_of(a, 0, [9])[0], 7))
    refused(ck, "not one run of positions")


def test_step_position_beyond_its_stream(ck):
    # the first step of stream 1 claims position 5 of its episode at stream position 0
    tamper(ck, lambda a: a["pos"].__setitem__(rows_of(a, 1, [0])[0], 5))
    refused(ck, "more steps than its stream had")


def test_open_episode_pointing_at_a_closed_one(ck):
    def f(s):
        s["cur_ep"][1] = int(arrays(ck)["episode"][rows_of(arrays(ck), 1, [0])[0]])  # C, truncated

    tamper(ck, change_streams=f)
    refused(ck, "points at a closed episode")


def test_open_episode_position_disagrees_with_its_steps(ck):
    tamper(ck, change_streams=lambda s: s["cur_pos"].__setitem__(0, 5))
    refused(ck, "open episode .* starts at position")


def test_episode_id_disagrees_with_its_position(ck):
    # step t = 2 of A takes B's id: ids along stream 0 go A, B, A
    def f(a):
        a["episode"][rows_of(a, 0, [2])] = a["episode"][rows_of(a, 0, [4])[0]]

    tamper(ck, f)
    refused(ck, "ids grow along a stream")


def test_two_open_episodes_in_one_stream(ck):
    # C loses its truncation flag while D is open: two open episodes in stream 1
    tamper(ck, lambda a: a["flags"].__setitem__(rows_of(a, 1, [2])[0], 0))
    refused(ck, "carries no end flag")


def test_two_streams_sharing_an_open_episode(ck):
    tamper(ck, change_streams=lambda s: s["cur_ep"].__setitem__(0, s["cur_ep"][1]))
    refused(ck, "same open episode")


def test_open_episode_without_a_position(ck):
    tamper(ck, change_streams=lambda s: s["cur_pos"].__setitem__(1, 0))
    refused(ck, "cur_pos")


def test_a_stream_state_that_is_not_integers(ck):
    tamper(ck, change_streams=lambda s: s.__setitem__("next_t", ["10", 6]))
    refused(ck, "list of integers")


# -- untampered checkpoints of many shapes still load -------------------------------------------------
REMOVERS = {"fifo": rs.Fifo, "lifo": rs.Lifo, "minheap": rs.MinHeap, "uniform": rs.Uniform}


def random_table(seed, remover):
    rng = np.random.default_rng(seed)
    t = rs.Table(
        int(rng.integers(4, 40)),
        remover=REMOVERS[remover](),
        max_staleness=1,
        max_times_sampled=int(rng.choice([0, 2])),
        episodes=rs.Episodes(next_obs_field="next_obs" if rng.random() < 0.5 else None),
        seed=seed,
    )
    nid = 0
    for _ in range(int(rng.integers(5, 60))):
        op = rng.random()
        if op < 0.45:
            n = int(rng.integers(1, 6))
            streams = rng.integers(0, 4, n)
            stale = rng.random(n) < 0.1
            t.extend_steps(
                rows(range(nid, nid + n)),
                streams=streams,
                terminated=rng.random(n) < 0.2,
                truncated=rng.random(n) < 0.05,
                priorities=rng.uniform(0.1, 5, n),
                version=np.where(stale, t.version - 3, t.version),
            )
            nid += n
        elif op < 0.55 and len(t.keys()):
            t.delete(t.keys()[rng.random(len(t.keys())) < 0.3])
        elif op < 0.65:
            s = int(rng.integers(0, 5))
            if s in set(np.flatnonzero(t._episodes.next_t > 0).tolist()):
                t.end_episode(s, truncated=bool(rng.random() < 0.5))
        elif op < 0.72:
            n = int(rng.integers(1, 4))
            t.add_episode(rows(range(nid, nid + n)), stream=None)
            nid += n
        elif op < 0.8 and len(t.keys()):
            t.sample(2)
        elif op < 0.85:
            t.set_version(t.version + 1)
        elif op < 0.88:
            t.clear()
        else:  # a long run of one stream, then deleted: old steps far behind their stream
            n = int(rng.integers(20, 200))
            for _ in range(0, n, 8):
                k = t.extend_steps(rows(range(nid, nid + 8)), streams=3)
                nid += 8
                t.delete(k[k >= 0])
    return t


@pytest.mark.parametrize("remover", sorted(REMOVERS))
def test_untampered_checkpoints_of_many_shapes_load_as_the_same_table(tmp_path, remover):
    for seed in range(12):
        t = random_table(seed, remover)
        path = tmp_path / f"ck{seed}"
        t.save(path)
        resign(path)
        u = rs.Table.load(path)
        keys = t.keys()
        assert u.keys().tolist() == keys.tolist()
        a, b = t.episode_info(keys), u.episode_info(keys)
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
        ):
            assert getattr(a, f).tolist() == getattr(b, f).tolist(), (seed, f)


def test_the_check_takes_the_exported_arrays_directly():
    t = build()
    idx = t._episodes
    slots = t._index.lookup(t.keys())
    check_index_arrays(idx.export_rows(slots), idx.export_streams())
    r = idx.export_rows(slots)
    r["t"][[1, 2]] = r["t"][[2, 1]]
    r["pos"][[1, 2]] = r["pos"][[2, 1]]
    with pytest.raises(rs.CheckpointError, match="strictly increase"):
        check_index_arrays(r, idx.export_streams(), where="mine")


def test_a_checkpoint_whose_keys_span_more_than_the_key_ring_loads_every_key(tmp_path):
    # Lifo keeps the oldest keys while new keys pass by: the live keys span far more than 2 x capacity
    t = rs.Table(8, remover=rs.Lifo(), episodes=rs.Episodes(), seed=0)
    for i in range(300):
        t.add_step(step(i))
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    keys = t.keys()
    assert (u._index.lookup(keys) >= 0).all()
    assert u.episode_info(keys).found.all()
    np.testing.assert_array_equal(u.get(keys)[0]["obs"], t.get(keys)[0]["obs"])


def test_steps_detached_by_an_older_version_still_load_outside_every_stream(ck):
    # versions before issue 24 saved steps their ring had dropped with t = -1
    tamper(ck, lambda a: a["t"].__setitem__(rows_of(a, 0, [5])[0], -1))
    u = rs.Table.load(ck)
    keys = u.keys()
    info = u.episode_info(keys)
    assert info.found.all() and info.lengths[8] == -1 and (np.delete(info.lengths, 8) > 0).all()
    assert u._episodes.n_detached == 1
    assert all(keys[8] not in u.sample_sequences(8, 2).step_keys for _ in range(5))


@pytest.mark.parametrize("episodic", [False, True])
def test_a_fifo_checkpoint_whose_newest_keys_were_deleted_continues_with_the_right_keys(tmp_path, episodic):
    # the loaded table used to resume ring mode with a key run that the next key does not continue
    t = rs.Table(4, episodes=rs.Episodes() if episodic else None)
    data = {"x": np.arange(6.0)}
    t.extend_steps(data) if episodic else t.extend(data)
    t.delete(t.keys()[-1:])
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    for i in range(5):
        u.add_step({"x": 10.0 + i}) if episodic else u.add({"x": 10.0 + i})
    assert u.keys().tolist() == [7, 8, 9, 10]
    assert u.get(u.keys())[0]["x"].tolist() == [11.0, 12.0, 13.0, 14.0]
