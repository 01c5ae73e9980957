"""FrameStackStorage: stacks rebuilt from single frames must equal what was inserted."""

import numpy as np
import pytest

import replaystore as rs

S, H, W = 4, 6, 5


def episode_stream(lengths, seed=0):
    """Yield Atari-style transitions: frame stacks of S, reset stack = initial frame repeated."""
    rng = np.random.default_rng(seed)
    for length in lengths:
        frames = [rng.integers(0, 256, (H, W), dtype=np.uint8) for _ in range(length + 1)]
        stack = [frames[0]] * S
        for t in range(length):
            obs = np.stack(stack)
            stack = stack[1:] + [frames[t + 1]]
            nxt = np.stack(stack)
            yield {"obs": obs, "action": np.int64(t), "reward": np.float32(t), "next_obs": nxt, "done": t == length - 1}


def make(capacity, **kw):
    return rs.Table(
        capacity, sampler=rs.Uniform(), remover=rs.Fifo(), storage=rs.FrameStackStorage(capacity, **kw), seed=0
    )


def check_all(table, originals):
    keys = table.keys()
    data, found = table.get(keys)
    assert found.all()
    for i, k in enumerate(keys.tolist()):
        assert np.array_equal(data["obs"][i], originals[k]["obs"]), k
        assert np.array_equal(data["next_obs"][i], originals[k]["next_obs"]), k
        assert data["action"][i] == originals[k]["action"]


def test_single_adds_round_trip_with_episode_boundaries():
    t = make(200)
    originals = {}
    for item in episode_stream([7, 1, 12, 3, 30]):
        originals[t.add(item)] = item
    check_all(t, originals)
    s = t.sample(64)
    for i, k in enumerate(s.keys.tolist()):
        assert np.array_equal(s.data["obs"][i], originals[k]["obs"])
        assert np.array_equal(s.data["next_obs"][i], originals[k]["next_obs"])


def test_each_frame_stored_about_once():
    t = make(1000)
    for item in episode_stream([500, 400]):
        t.add(item)
    assert len(t.keys()) == 900  # (flushes staged adds)
    st = t.storage
    frames_written = st._wpos
    assert frames_written == 900 + 2 * S  # one per step, plus one stack per episode start
    naive = 1000 * 2 * S * H * W  # obs and next_obs stacks for every slot
    assert st.frames.nbytes <= naive / (2 * S) * 1.1  # about one frame per slot


def test_batched_extend_and_eviction_keep_stacks_correct():
    t = make(50)
    originals = {}
    items = list(episode_stream([40, 25, 60, 9], seed=1))
    for start in range(0, len(items), 16):
        chunk = items[start : start + 16]
        batch = {k: np.stack([np.asarray(it[k]) for it in chunk]) for k in chunk[0]}
        for k, it in zip(t.extend(batch).tolist(), chunk):
            originals[k] = it
    assert len(t) == 50
    assert t.keys().tolist() == list(range(len(items) - 50, len(items)))
    check_all(t, originals)


def test_short_episodes_with_small_frame_ring_evict_extra_items():
    t = make(40, frame_capacity=60)
    originals = {}
    for item in episode_stream([2] * 40, seed=2):
        originals[t.add(item)] = item
    assert len(t) < 40  # each 2-step episode needs S + 2 frames
    check_all(t, originals)
    assert t.stats()["evictions"] > 0


def test_deletes_in_the_middle_keep_other_items_intact():
    t = make(100)
    originals = {}
    for item in episode_stream([30, 30], seed=3):
        originals[t.add(item)] = item
    t.delete(list(range(10, 40, 3)))
    check_all(t, originals)
    for item in episode_stream([80], seed=4):
        originals[t.add(item)] = item
    check_all(t, originals)


def test_requires_fifo_remover_and_stack_fields():
    with pytest.raises(ValueError, match="Fifo"):
        rs.Table(10, remover=rs.Lifo(), storage=rs.FrameStackStorage(10))
    t = make(10)
    with pytest.raises(rs.SpecError, match="next_obs"):
        t.add({"obs": np.zeros((S, H, W), np.uint8), "done": False})
    assert len(t) == 0


def test_checkpoint_round_trip(tmp_path):
    t = make(60)
    originals = {}
    for item in episode_stream([25, 20, 30], seed=5):
        originals[t.add(item)] = item
    t.save(tmp_path / "ck")
    u = rs.Table.load(tmp_path / "ck")
    assert isinstance(u.storage, rs.FrameStackStorage)
    check_all(u, originals)
    for item in episode_stream([10], seed=6):
        originals[u.add(item)] = item
    check_all(u, originals)


def test_many_deletes_of_new_items_while_an_old_one_lives():
    t = make(20, frame_capacity=400)
    originals = {}
    stream = episode_stream([1000], seed=7)
    first = next(stream)
    originals[t.add(first)] = first
    for _ in range(300):  # insert and delete repeatedly: the log must not overflow
        item = next(stream)
        k = t.add(item)
        originals[k] = item
        if k % 2:
            t.delete([k])
    check_all(t, originals)
