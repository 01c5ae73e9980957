"""Episodic tables across storages and checkpoints: memmap, frame stacks, save/load round trips."""

import hashlib
import json

import numpy as np
import pytest

import replaystore as rs
from replaystore.episodes.sequences import exact_valid_starts


def steps(ids, rewards=None):
    ids = np.asarray(ids, dtype=np.int64)
    r = np.ones(len(ids)) if rewards is None else np.asarray(rewards, dtype=np.float64)
    return {"obs": ids.astype(np.float32), "next_obs": (ids + 1).astype(np.float32), "reward": r, "id": ids}


def fill(t, rng, rounds=30):
    nxt = 0
    for _ in range(rounds):
        ids = np.arange(nxt, nxt + 3)
        nxt += 3
        t.extend_steps(
            steps(ids, rng.integers(0, 5, 3)),
            streams=[0, 1, 2],
            terminated=rng.random(3) < 0.1,
            truncated=rng.random(3) < 0.05,
            priorities=rng.uniform(0.5, 2, 3),
        )
    t.end_episode(1)
    t.delete(rng.choice(t.keys(), 5, replace=False))
    return nxt


def index_state(t):
    idx = t._episodes
    keys = t.keys()
    slots = t._index.lookup(keys)
    out = {"keys": keys.tolist()}
    out["stream"], out["t"] = (a.tolist() for a in idx.stream_t(slots))
    for name in ("pos_of", "flags"):
        out[name] = getattr(idx, name)[slots].tolist()
    # episode ids: compare the partition (ids may be renumbered only if equal)
    out["episode_of"] = idx.episode_of[slots].tolist()
    out["streams"] = idx.export_streams()
    out["valid"] = sorted(t._index.key_of_slot[exact_valid_starts(idx, 4, 1)].tolist())
    return out


@pytest.mark.parametrize("prioritized", [False, True])
def test_checkpoint_round_trip_keeps_the_episode_structure(tmp_path, prioritized):
    ep = rs.Episodes(
        next_obs_field="next_obs", sequence_length=5 if prioritized else None, burn_in=1 if prioritized else 0
    )
    sampler = rs.Prioritized(alpha=1.0, beta=1.0) if prioritized else None
    t = rs.Table(64, sampler=sampler, episodes=ep, seed=0)
    rng = np.random.default_rng(0)
    nxt = fill(t, rng)
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    assert u.episodic and u._episodes.options == ep
    assert index_state(u) == index_state(t)
    if prioritized:
        sl_t, sl_u = t._index.lookup(t.keys()), u._index.lookup(u.keys())
        np.testing.assert_allclose(
            t.sampler._sum[sl_t + len(t.sampler._sum) // 2], u.sampler._sum[sl_u + len(u.sampler._sum) // 2]
        )
    # both continue identically (slots differ after a load, so samples are compared per key)
    for x in (t, u):
        x.extend_steps(steps([nxt, nxt + 1, nxt + 2]), streams=[0, 1, 2])
    assert index_state(u) == index_state(t)
    seqs, nsteps = [], []
    for x in (t, u):
        a = x.sample_sequences(400, 4, burn_in=1)
        # (uniform probabilities without a tracked window are estimates: compared only when exact)
        seqs.append(
            {
                k: (tuple(r), round(p, 12) if prioritized else None)
                for k, r, p in zip(a.keys.tolist(), a.data["id"].tolist(), a.probabilities.tolist())
            }
        )
        b = x.sample_nstep(400, 3, 0.9)
        nsteps.append(
            {k: (r, s, d) for k, r, s, d in zip(b.keys.tolist(), b.returns.tolist(), b.steps.tolist(), b.done.tolist())}
        )
    for d1, d2 in (seqs, nsteps):
        common = set(d1) & set(d2)
        assert len(common) > 10
        assert all(d1[k] == d2[k] for k in common)


def _resign(ck):
    """Re-hash the files and the manifest after a deliberate edit (an attacker's valid-looking checkpoint)."""
    m = json.loads((ck / "manifest.json").read_text())
    for name in m["files"]:
        raw = (ck / name).read_bytes()
        m["files"][name] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    raw = json.dumps(m, indent=1).encode()
    (ck / "manifest.json").write_bytes(raw)
    (ck / "manifest.sha256").write_text(f"{hashlib.sha256(raw).hexdigest()}  manifest.json\n")
    return m


@pytest.mark.parametrize(
    "edit", ["t_beyond_stream", "unknown_stream", "bad_flags", "bad_config", "missing_file", "next_t_beyond_ids"]
)
def test_inconsistent_episode_state_in_a_checkpoint_is_a_checkpoint_error(tmp_path, edit):
    t = rs.Table(64, episodes=rs.Episodes(), seed=0)
    t.extend_steps(steps(np.arange(10)), streams=[0, 1] * 5)
    ck = tmp_path / "ck"
    t.save(ck)
    if edit == "t_beyond_stream":
        arr = np.load(ck / "episodes_t.npy")
        arr[0] = 99
        np.save(ck / "episodes_t.npy", arr)
    elif edit == "unknown_stream":
        arr = np.load(ck / "episodes_stream.npy")
        arr[0] = 5
        np.save(ck / "episodes_stream.npy", arr)
    elif edit == "bad_flags":
        arr = np.load(ck / "episodes_flags.npy")
        arr[0] = 9
        np.save(ck / "episodes_flags.npy", arr)
    elif edit == "bad_config":
        m = json.loads((ck / "manifest.json").read_text())
        m["episodes"]["config"]["burn_in"] = -3
        (ck / "manifest.json").write_text(json.dumps(m))
    elif edit == "next_t_beyond_ids":  # positions past 2**40 - 1 do not fit the per-slot id
        m = json.loads((ck / "manifest.json").read_text())
        m["episodes"]["streams"]["next_t"][0] = 1 << 40
        (ck / "manifest.json").write_text(json.dumps(m))
    else:
        (ck / "episodes_pos.npy").unlink()
        m = json.loads((ck / "manifest.json").read_text())
        del m["files"]["episodes_pos.npy"]
        (ck / "manifest.json").write_text(json.dumps(m))
    _resign(ck)
    with pytest.raises(rs.CheckpointError):
        rs.Table.load(ck)


def test_memmap_storage_sequences_and_nstep(tmp_path):
    t = rs.Table(50, storage=f"memmap:{tmp_path / 'mm'}", episodes=rs.Episodes(next_obs_field="next_obs"), seed=0)
    t.add_episode(steps(np.arange(10), np.arange(10)), stream=0)
    t.extend_steps(steps(np.arange(100, 108)), streams=1)
    s = t.sample_sequences(32, 5, burn_in=2)
    assert s.data["id"].shape == (32, 7)
    assert (np.diff(s.data["id"], axis=1) == 1).all()
    n = t.sample_nstep(64, 2, 0.5)
    first = n.data["id"] < 9
    np.testing.assert_allclose(n.returns[first], n.data["id"][first] + 0.5 * (n.data["id"][first] + 1))
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck", memmap_dir=str(tmp_path / "mm2"))
    assert index_state(u) == index_state(t)


def test_frame_stack_storage_rebuilds_stacks_inside_sequences():
    stack, hw = 3, (2, 2)
    fs = rs.FrameStackStorage(40, end_keys=("terminated",))
    t = rs.Table(40, storage=fs, episodes=rs.Episodes(next_obs_field="next_obs"), seed=0)

    def episode(base, n):
        frames = np.stack([np.full(hw, base + i, np.uint8) for i in range(n + stack)])
        obs = np.stack([frames[i : i + stack] for i in range(n)])
        nxt = np.stack([frames[i + 1 : i + 1 + stack] for i in range(n)])
        term = np.zeros(n, bool)
        term[-1] = True
        return {"obs": obs, "next_obs": nxt, "reward": np.ones(n), "terminated": term}

    t.add_episode(episode(10, 8), stream=0)
    t.add_episode(episode(50, 6), stream=0)
    s = t.sample_sequences(16, 4)
    newest = s.data["obs"][:, :, -1, 0, 0].astype(int)  # newest frame of each stack: base + i + stack - 1
    assert (np.diff(newest, axis=1) == 1).all()
    n = t.sample_nstep(16, 2, 0.5)
    np.testing.assert_array_equal(n.next_obs[:, -1, 0, 0].astype(int), n.data["obs"][:, -1, 0, 0].astype(int) + n.steps)


def test_inspect_shows_the_episode_options(tmp_path, capsys):
    from replaystore.cli import main

    t = rs.Table(20, episodes=rs.Episodes(sequence_length=3), seed=0)
    t.add_episode(steps(np.arange(5)), stream=2)
    t.save(tmp_path / "ck")
    main(["inspect", str(tmp_path / "ck")])
    out = capsys.readouterr().out
    assert "episodes:" in out and "'sequence_length': 3" in out and "1 streams" in out


@pytest.mark.parametrize("kind", ["columns", "nested", "memmap", "frames"])
def test_block_reads_of_consecutive_slots_equal_the_gather(tmp_path, kind):
    """``read_runs`` (one block copy per run) returns exactly ``read`` of the runs' slots."""
    cap = 30
    storage = {
        "columns": rs.ColumnStorage(cap),
        "nested": rs.ColumnStorage(cap),
        "memmap": f"memmap:{tmp_path / 'mm'}",
        "frames": rs.FrameStackStorage(cap),
    }[kind]
    t = rs.Table(cap, storage=storage, seed=0)
    rng = np.random.default_rng(0)
    for i in range(40):  # wraps: slots hold items of two generations
        if kind == "frames":
            frames = np.broadcast_to(np.arange(i, i + 5, dtype=np.uint8)[:, None, None], (5, 2, 2))
            item = {"obs": frames[:4], "next_obs": frames[1:], "reward": float(i), "done": False}
        elif kind == "nested":
            item = {"o": {"a": rng.standard_normal(3).astype(np.float32)}, "id": i}
        else:
            item = {"obs": rng.standard_normal((2, 3)).astype(np.float32), "id": i}
        t.add(item)
    st = t.storage
    first, width = np.array([0, 5, 22, 5]), 8
    got = st.read_runs(first, width)
    want = st.read((first[:, None] + np.arange(width)).ravel())

    def check(g, w):
        if isinstance(w, dict):
            assert g.keys() == w.keys()
            for k in w:
                check(g[k], w[k])
            return
        assert g.shape == (len(first), width, *w.shape[1:]) and g.dtype == w.dtype
        np.testing.assert_array_equal(g.reshape(w.shape), w)
        assert g.flags.writeable and (g.flags.c_contiguous or kind == "frames")  # stacks: views of one gather

    check(got, want)


@pytest.mark.parametrize("interleaved", [False, True])
def test_sequence_payloads_belong_to_their_step_keys(interleaved):
    """Consecutive slots (one stream, FIFO: block copies) or not (interleaved: gathers): each
    position's payload is its step key's, and the step keys are consecutive steps of a stream."""
    t = rs.Table(64, remover=rs.Fifo(), episodes=rs.Episodes(), seed=0)
    id_of = {}
    nxt = 0
    for _ in range(20):
        streams = [0, 1] if interleaved else [0, 0]
        ids = np.arange(nxt, nxt + 2)
        nxt += 2
        keys = t.extend_steps({"id": ids, "obs": ids.astype(np.float32)}, streams=streams, terminated=[False, False])
        id_of.update(zip(keys.tolist(), ids.tolist()))
    s = t.sample_sequences(16, 6, burn_in=2)
    want = np.vectorize(id_of.__getitem__)(s.step_keys)
    np.testing.assert_array_equal(s.data["id"], want)
    np.testing.assert_array_equal(s.data["obs"], want.astype(np.float32))
    assert (np.diff(s.data["id"], axis=1) == (2 if interleaved else 1)).all()
    assert (s.keys == s.step_keys[:, 2]).all()
