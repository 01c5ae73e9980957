"""n-step's three planners agree: consecutive slots, gapless rings, verified rings.

``plan_nstep`` first tries steps in consecutive slots (``plan_runs``), then a gapless stream's ring
without verification (``plan_gapless``), then the verified ring (``plan_checked``). All three must
give the same transitions for every start, and ``sample_nstep`` must give identical samples (bit
for bit, on the same seed) whichever planner it uses: at the wrap-around of the slots and of the
rings, at terminations and truncations, at the write head of open episodes, with interleaved
streams, holes and detached steps.
"""

import numpy as np
import pytest

import replaystore as rs
from replaystore.episodes import nstep as nstep_mod

N = 3


def build(capacity, n_steps, streams, next_obs, seed, delete_frac=0.0, end_open=False):
    """A FIFO episodic table filled with ``n_steps`` steps (ring wrapped when n_steps > capacity)."""
    rng = np.random.default_rng(seed)
    ep = rs.Episodes(next_obs_field="next_obs" if next_obs else None)
    t = rs.Table(capacity, remover=rs.Fifo(), episodes=ep, seed=seed)
    written = 0
    while written < n_steps:
        b = int(min(rng.integers(1, 9) * streams, n_steps - written))
        ids = np.arange(written, written + b)
        u = rng.random(b)
        data = {"obs": ids.astype(np.float32), "next_obs": ids + 0.5, "reward": rng.normal(size=b).astype(np.float32)}
        s = np.arange(b) % streams if streams > 1 else 0
        t.extend_steps(data, streams=s, terminated=u < 0.08, truncated=(u >= 0.08) & (u < 0.14))
        written += b
    if end_open:
        t.end_episode(np.arange(streams), truncated=True)
    if delete_frac:
        keys = t.keys()
        t.delete(keys[rng.random(len(keys)) < delete_frac])
    return t


def planned(plan, idx, slots, has_next):
    win, k, done, boot = plan(idx, slots, N, has_next)
    used = np.arange(N) < k[:, None]
    return np.where(used, win, -1), k, done, boot


CASES = [
    # capacity, steps, streams, delete fraction: one stream wrapped (consecutive slots), several
    # interleaved streams (gapless rings), holes (verified rings)
    (64, 300, 1, 0.0),
    (64, 64, 1, 0.0),
    (61, 500, 3, 0.0),
    (64, 300, 1, 0.1),
    (50, 400, 4, 0.05),
]


@pytest.mark.parametrize("next_obs", [True, False])
@pytest.mark.parametrize("capacity, n_steps, streams, delete", CASES)
def test_planners_agree_on_every_live_start(capacity, n_steps, streams, delete, next_obs):
    for seed in range(3):
        t = build(capacity, n_steps, streams, next_obs, seed, delete, end_open=seed == 2)
        idx = t._episodes
        slots = t._index.lookup(t.keys())
        ref = planned(nstep_mod.plan_checked, idx, slots, next_obs)
        for plan in (nstep_mod.plan_nstep, nstep_mod.plan_runs, nstep_mod.plan_ring):
            got = planned(plan, idx, slots, next_obs)
            for a, b in zip(got, ref):
                np.testing.assert_array_equal(a, b)
        gap = nstep_mod.plan_gapless(idx, slots, N, next_obs)
        if delete == 0.0:  # FIFO eviction keeps every stream gapless
            assert gap is not None
        if gap is not None:
            got = planned(nstep_mod.plan_gapless, idx, slots, next_obs)
            for a, b in zip(got, ref):
                np.testing.assert_array_equal(a, b)


def _samples(t, next_obs, calls=6, batch=128):
    out = []
    for _ in range(calls):
        try:
            out.append(t.sample_nstep(batch, N, 0.9))
        except rs.NoValidSequence:
            out.append(None)
    return out


@pytest.mark.parametrize("next_obs", [True, False])
@pytest.mark.parametrize("capacity, n_steps, streams, delete", CASES)
def test_sample_nstep_is_identical_with_the_checked_planner(monkeypatch, capacity, n_steps, streams, delete, next_obs):
    fast = _samples(build(capacity, n_steps, streams, next_obs, 7, delete, end_open=False), next_obs)
    calls = []

    def checked(*a):
        calls.append(1)
        return nstep_mod.plan_checked(*a)

    monkeypatch.setattr(nstep_mod, "plan_nstep", checked)
    slow = _samples(build(capacity, n_steps, streams, next_obs, 7, delete, end_open=False), next_obs)
    assert calls
    for a, b in zip(fast, slow):
        assert (a is None) == (b is None)
        if a is None:
            continue
        for name in (
            "returns",
            "steps",
            "done",
            "discount",
            "keys",
            "probabilities",
            "weights",
            "priorities",
            "times_sampled",
            "versions",
            "streams",
            "episodes",
        ):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        np.testing.assert_array_equal(a.next_obs, b.next_obs)
        for f in a.data:
            np.testing.assert_array_equal(a.data[f], b.data[f])


def test_the_fast_planners_are_the_ones_used_on_a_fifo_table(monkeypatch):
    t = build(64, 300, 1, True, 0)
    slots = t._index.lookup(t.keys())
    idx = t._episodes
    # every start but those within N - 1 steps of the write head (the slot array wraps around)
    w, k, done, boot = nstep_mod.plan_runs(idx, slots, N, True)
    ring = []
    monkeypatch.setattr(nstep_mod, "plan_ring", lambda *a: ring.append(len(a[1])) or nstep_mod.plan_checked(*a))
    nstep_mod.plan_runs(idx, slots, N, True)
    assert 0 < sum(ring) <= N - 1
    # interleaved streams (3 rows per call, one per stream): the stride is learnt, then the
    # stride path serves most starts (not those near a write head, nor where the table's slot
    # order is not cyclic: FIFO eviction of a batch frees the victims' slots in its own order)
    t = build(60, 600, 3, True, 0)
    idx = t._episodes
    assert idx.all_gapless()
    slots = t._index.lookup(t.keys())
    assert nstep_mod.plan_gapless(idx, slots, N, True) is not None
    ring.clear()
    nstep_mod.plan_runs(idx, slots, N, True)  # learns the stride from the failing rows
    assert idx._nstep_stride[0] == 3 and sum(ring) == len(slots)
    ring.clear()
    got = nstep_mod.plan_runs(idx, slots, N, True)
    assert 0 < sum(ring) < len(slots) // 2
    ref = nstep_mod.plan_checked(idx, slots, N, True)
    for a, b in zip(got[1:], ref[1:]):
        np.testing.assert_array_equal(a, b)
    # irregular writes: after a failed stride guess the path is skipped for a while
    idx._nstep_stride[:] = [3, 0]
    t2 = build(64, 300, 1, True, 0)
    idx2 = t2._episodes
    idx2._nstep_stride = [5, 0]
    slots2 = t2._index.lookup(t2.keys())
    nstep_mod.plan_runs(idx2, slots2, N, True)
    assert idx2._nstep_stride == [1, 0]


def test_truncation_termination_and_the_write_head_on_the_fast_path():
    """Exact transitions of a hand-built stream, start by start, through the consecutive-slot planner."""
    g = 0.5
    ep = rs.Episodes(next_obs_field="next_obs")
    t = rs.Table(16, remover=rs.Fifo(), episodes=ep, seed=0)
    r = np.arange(1, 21, dtype=np.float32)
    ids = np.arange(20)
    term = np.isin(ids, [5])
    trunc = np.isin(ids, [11])
    # 20 steps into 16 slots: ids 4..19 live, slots wrap (id 16 is in slot 0)
    t.extend_steps(
        {"obs": ids.astype(np.float32), "next_obs": ids + 0.5, "reward": r}, streams=0, terminated=term, truncated=trunc
    )
    idx = t._episodes
    slots = t._index.lookup(t.keys())
    win, k, done, boot = nstep_mod.plan_nstep(idx, slots, N, True)
    obs = t.storage.columns["obs"]
    start_ids = obs[slots].astype(int)
    got = {int(i): (int(kk), bool(d), float(obs[b])) for i, kk, d, b in zip(start_ids, k, done, boot)}
    assert got[4] == (2, True, 5.0)  # terminates at 5: k = 2, done
    assert got[5] == (1, True, 5.0)
    assert got[9] == (3, False, 11.0)  # truncated at 11: bootstrap from 11's next_obs
    assert got[10] == (2, False, 11.0)
    assert got[12] == (3, False, 14.0)
    assert got[14] == (3, False, 16.0)  # slots 14, 15, 0: the wrap-around of the slot array
    assert got[18] == (2, False, 19.0)  # the write head (open episode)
    assert got[19] == (1, False, 19.0)
    s = t.sample_nstep(64, N, g)
    i = np.flatnonzero(s.data["obs"] == 9)[0]
    assert s.returns[i] == np.float64(r[9]) + g * np.float64(r[10]) + g * g * np.float64(r[11])
    assert s.discount[i] == g**3 and not s.done[i]


def test_far_behind_starts_are_planned_alike_on_every_path():
    # MinHeap keeps the high-priority first step far behind its stream: it is in the overflow map
    t = rs.Table(8, remover=rs.MinHeap(), episodes=rs.Episodes(next_obs_field="next_obs"), seed=0)
    old = t.add_step({"obs": np.float32(0), "next_obs": 0.5, "reward": 1.0}, stream=0, priority=100.0)
    for i in range(1, 61):
        t.add_step({"obs": np.float32(i), "next_obs": i + 0.5, "reward": 1.0}, stream=0, priority=float(i))
    idx = t._episodes
    assert not idx.all_gapless() and idx.n_overflow == 1
    slots = t._index.lookup(t.keys())
    for plan in (nstep_mod.plan_nstep, nstep_mod.plan_runs, nstep_mod.plan_ring, nstep_mod.plan_checked):
        _, k, _, _ = plan(idx, slots, N, True)
        assert (k[slots == t._index.lookup([old])[0]] == 1).all() and (k >= 1).all()
    assert any(old in t.sample_nstep(32, N, 0.9).keys for _ in range(20))


def test_steps_past_a_capped_ring_move_to_the_overflow_map_and_back_out():
    # a ring that grows to its cap past an old live step moves it to the overflow map
    t = rs.Table(32, remover=rs.MinHeap(), episodes=rs.Episodes(next_obs_field="next_obs"), seed=0)
    idx = t._episodes
    assert idx.ring_cap == 64

    def rows(ids):
        ids = np.asarray(ids)
        return {"obs": ids.astype(np.float32), "next_obs": ids + 0.5, "reward": np.ones(len(ids))}

    old = t.add_step({"obs": np.float32(0), "next_obs": 0.5, "reward": 1.0}, stream=0, priority=100.0)
    t.extend_steps(rows(range(1, 11)), streams=0, priorities=np.arange(1.0, 11.0))
    assert idx.n_overflow == 0
    # the live span would be 35 > 64 / 2: the ring grows 16 -> 64 (its cap), position 0 moves out
    t.extend_steps(rows(range(11, 35)), streams=0, priorities=np.arange(11.0, 35.0))
    assert old in t
    assert idx.n_overflow == 1 and idx.n_detached == 0 and not idx.all_gapless()
    slots = t._index.lookup(t.keys())
    for plan in (nstep_mod.plan_nstep, nstep_mod.plan_runs, nstep_mod.plan_ring, nstep_mod.plan_checked):
        _, k, _, _ = plan(idx, slots, N, True)
        assert (k[t.keys() == old] == 1).all() and (k[t.keys() != old] >= 1).all()
    t.delete([old])
    assert idx.n_overflow == 0
    assert idx.all_gapless()  # the hole left with it


# -- index memory -------------------------------------------------------------------------------------
def test_index_per_slot_state_is_17_bytes_and_ring_slots_are_int32():
    t = build(1000, 3000, 4, True, 0)
    idx = t._episodes
    per_slot = sum(a.nbytes for a in (idx.uid, idx.episode_of, idx.pos_of, idx.flags)) / t.capacity
    assert per_slot == 17
    assert idx.ring.dtype == np.int32
    assert idx.nbytes == per_slot * t.capacity + idx.ring.nbytes + sum(
        a.nbytes
        for a in (
            idx.next_t,
            idx.cur_ep,
            idx.cur_pos,
            idx.ring_off,
            idx.ring_len,
            idx.lo_t,
            idx.n_live,
            idx.oldest_t,
            idx._mark,
        )
    )
    # streams and positions derive from the per-slot id
    slots = t._index.lookup(t.keys())
    st, pos = idx.stream_t(slots)
    assert (st == t.storage.columns["obs"][slots].astype(int) % 4).all()  # batches of 4k rows alternate streams
    assert (idx.lookup(st, pos) == slots).all()


def test_episode_ids_and_positions_past_int32_widen_the_arrays():
    t = rs.Table(10, remover=rs.Fifo(), episodes=rs.Episodes(next_obs_field="next_obs"), seed=0)
    idx = t._episodes

    def rows(ids):
        ids = np.asarray(ids)
        return {"obs": ids.astype(np.float32), "next_obs": ids + 0.5, "reward": np.ones(len(ids))}

    t.extend_steps(rows([0, 1, 2]), streams=0, terminated=[False, False, True])
    assert idx.episode_of.dtype == np.int32 and idx.pos_of.dtype == np.int32
    big = 2**31 + 5
    idx.next_episode = big  # as if 2**31 episodes had been written
    t.extend_steps(rows([3, 4]), streams=0)
    assert idx.episode_of.dtype == np.int64 and idx.pos_of.dtype == np.int32
    # a stream whose open episode is longer than int32 positions
    idx._streams_alloc(8)
    idx.next_t[1], idx.cur_ep[1], idx.cur_pos[1] = big + 10, idx.next_episode, big
    idx.next_episode += 1
    keys = t.extend_steps(rows([5, 6]), streams=1)
    assert idx.pos_of.dtype == np.int64
    slots = t._index.lookup(keys)
    assert idx.pos_of[slots].tolist() == [big, big + 1]
    assert idx.positions(slots).tolist() == [big + 10, big + 11]
    assert idx.episode_of[t._index.lookup(t.keys()[-4:-2])].tolist() == [big, big]
    s = t.sample_nstep(64, 3, 0.9)
    assert s.episodes.dtype == np.int64 and set(s.episodes.tolist()) <= {0, big, big + 1}
    assert (s.steps[s.episodes == big + 1] >= 1).all()


def test_a_stream_reaching_position_2_40_is_refused_and_nothing_changes():
    t = rs.Table(10, remover=rs.Fifo(), episodes=rs.Episodes(next_obs_field="next_obs"), seed=0)
    idx = t._episodes

    def rows(ids):
        ids = np.asarray(ids)
        return {"obs": ids.astype(np.float32), "next_obs": ids + 0.5, "reward": np.ones(len(ids))}

    t.extend_steps(rows([0, 1]), streams=[0, 1])
    limit = 1 << 40
    idx.next_t[0] = limit - 3  # as if stream 0 had written 2**40 - 3 steps
    idx.written = limit - 3
    keys = t.extend_steps(rows([2, 3]), streams=0)  # positions 2**40 - 3 and - 2: the last ones allowed
    assert idx.positions(t._index.lookup(keys)).tolist() == [limit - 3, limit - 2]
    before = (t.keys().tolist(), t.stats()["inserts"], idx.next_t.tolist(), idx.written)
    for call in (
        lambda: t.extend_steps(rows([4]), streams=0),
        lambda: t.extend_steps(rows([4, 5]), streams=[1, 0]),
        lambda: t.add_step({k: v[0] for k, v in rows([4]).items()}, stream=0),
    ):
        with pytest.raises(rs.EpisodeError, match="below 2\\*\\*40 - 1"):
            call()
        assert (t.keys().tolist(), t.stats()["inserts"], idx.next_t.tolist(), idx.written) == before
    assert len(t.extend_steps(rows([6, 7]), streams=1)) == 2  # other streams go on


def test_planners_take_an_empty_batch():
    t = build(16, 20, 1, True, 0)
    empty = np.empty(0, dtype=np.int64)
    for plan in (nstep_mod.plan_nstep, nstep_mod.plan_runs, nstep_mod.plan_ring, nstep_mod.plan_checked):
        for has_next in (True, False):
            win, k, done, boot = plan(t._episodes, empty, N, has_next)
            assert win.shape == (0, N) and k.shape == done.shape == boot.shape == (0,)
