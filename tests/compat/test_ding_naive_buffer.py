"""DI-engine's test_naive_buffer.py, ported to black-box tests, plus the naive variants."""

import os
import time

import numpy as np
import pytest

from replaystore.compat.ding import (
    CompatError,
    EasyDict,
    ElasticReplayBuffer,
    EpisodeReplayBuffer,
    NaiveReplayBuffer,
    SequenceReplayBuffer,
    create_buffer,
    deep_merge_dicts,
)

_counter = iter(range(10**9))


def generate_data(meta=False, folder="."):
    data = {"obs": np.random.randn(4), "data_id": str(next(_counter))}
    if meta:
        data["data_id"] = os.path.join(folder, data["data_id"])
        np.save(data["data_id"] + ".npy", data.pop("obs"))
        os.replace(data["data_id"] + ".npy", data["data_id"])
    return data


def generate_data_list(count, meta=False, folder="."):
    return [generate_data(meta, folder) for _ in range(count)]


@pytest.fixture(autouse=True)
def _seed():
    np.random.seed(1)


@pytest.fixture
def make():
    made = []

    def factory(cls=NaiveReplayBuffer, **cfg):
        buf = cls(deep_merge_dicts(cls.default_config(), EasyDict(cfg)), instance_name="test")
        made.append(buf)
        return buf

    yield factory
    for b in made:
        b.close()


def wait_until(predicate, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_push(make):
    buf = make(replay_buffer_size=64)
    for _ in range(100):
        buf.push(generate_data(), 0)
    assert buf.replay_buffer_size == 64
    assert buf.count() == 64
    assert buf.push_count == 100
    assert buf.state_dict()["tail"] == 100 % 64
    buf.update({"no_info": True})  # a no-op
    assert buf.count() == 64

    buf = make(replay_buffer_size=64)
    extend_num = int(0.6 * 64)
    for i in range(1, 4):
        buf.push(generate_data_list(extend_num), 0)
        assert buf.state_dict()["tail"] == (extend_num * i) % 64
        assert buf.count() == min(extend_num * i, 64)
    assert buf.push_count == 3 * extend_num


def test_ring_keeps_the_newest_items_in_push_order(make):
    buf = make(replay_buffer_size=8)
    items = [{"i": i} for i in range(13)]
    buf.push(items[:5], 0)
    for d in items[5:]:
        buf.push(d, 0)
    data = buf.state_dict()["data"]
    assert [d["i"] for d in data] == [8, 9, 10, 11, 12, 5, 6, 7]  # slot k % 8 holds item k


def test_sample(make):
    buf = make(replay_buffer_size=64)
    for _ in range(64):
        buf.push(generate_data(), 0)
    batch = buf.sample(32, 0)
    assert len(batch) == 32
    assert len({id(d) for d in batch}) == 32  # without replacement
    data = buf.state_dict()["data"]
    assert buf.sample(1, 0, sample_range=slice(-1, None))[0] is data[-1]
    window = data[-10:-2]
    for d in buf.sample(5, 0, sample_range=slice(-10, -2)):
        assert any(d is w for w in window)
    assert len(buf.sample(100, 0, replace=True)) == 100
    assert buf.sample(0, 0) == []
    buf.clear()
    assert buf.count() == 0 and buf.push_count == 0
    assert buf.sample(1, 0) is None


def test_sample_returns_none_when_short(make, caplog):
    buf = make(replay_buffer_size=16)
    caplog.set_level("INFO", logger="replaystore.compat.ding")
    assert buf.sample(1, 0) is None
    assert "empty" in caplog.text
    buf.push(generate_data_list(4), 0)
    assert buf.sample(5, 0) is None
    assert len(buf.sample(5, 0, replace=True)) == 5


def test_deepcopy(make):
    buf = make(replay_buffer_size=4, deepcopy=True)
    d = {"x": [1]}
    buf.push(d, 0)
    d["x"].append(2)
    out = buf.sample(1, 0)[0]
    assert out == {"x": [1]}
    out["x"].append(3)
    assert buf.sample(1, 0)[0] == {"x": [1]}


def test_save_and_load_data(make, tmp_path):
    buf = make(replay_buffer_size=64)
    for _ in range(64):
        buf.push(generate_data(), 0)
    path = tmp_path / "sub" / "naive_buffer.pkl"
    buf.save_data(str(path))
    other = make(replay_buffer_size=64)
    other.load_data(str(path))
    assert other.count() == 64
    assert other.push_count == 64


def test_state_dict_round_trip(make):
    buf = make(replay_buffer_size=8)
    buf.push([{"i": i} for i in range(11)], 0)
    state = buf.state_dict()
    other = make(replay_buffer_size=8)
    other.load_state_dict(state)
    assert other.count() == 8 and other.push_count == 11
    assert other.state_dict()["tail"] == 3
    assert [d["i"] for d in other.state_dict()["data"]] == [8, 9, 10, 3, 4, 5, 6, 7]
    demo = make(replay_buffer_size=8)
    demo.load_state_dict({"data": [{"i": 0}, {"i": 1}]})
    assert demo.count() == 2
    with pytest.raises(CompatError):
        make(replay_buffer_size=4).load_state_dict(state)  # 8 slots into a buffer of 4


def test_track_used_data(make, tmp_path):
    buf = make(replay_buffer_size=10, enable_track_used_data=True)
    buf.start()
    old = generate_data_list(10, meta=True, folder=str(tmp_path))
    buf.push(old, 0)
    assert all(os.path.exists(d["data_id"]) for d in old)
    assert buf.count() == 10
    new = generate_data_list(8, meta=True, folder=str(tmp_path))
    buf.push(new, 0)
    assert buf.count() == 10
    assert all(os.path.exists(d["data_id"]) for d in new)
    assert wait_until(lambda: not any(os.path.exists(d["data_id"]) for d in old[:8]))
    assert all(os.path.exists(d["data_id"]) for d in old[8:])
    buf.clear()
    assert wait_until(lambda: not any(os.path.exists(d["data_id"]) for d in old[8:] + new))


def test_track_used_data_requires_data_id(make):
    buf = make(replay_buffer_size=10, enable_track_used_data=True)
    with pytest.raises(TypeError):
        buf.push([{"data_id": "a"}, {"obs": 1}], 0)
    assert buf.count() == 0


def test_episode_buffer(make):
    buf = make(EpisodeReplayBuffer, replay_buffer_size=4)
    assert EpisodeReplayBuffer.default_config().type == "episode"
    buf.push([[1, 2, 3], [4, 5]], 0)
    assert buf.episode_len == [3, 2]  # empty slots are skipped
    assert buf.sample(2, 0, replace=True)[0] in ([1, 2, 3], [4, 5])
    built = create_buffer(EpisodeReplayBuffer.default_config())
    try:
        assert type(built) is EpisodeReplayBuffer
    finally:
        built.close()


def test_elastic_buffer(make):
    with pytest.raises(CompatError):
        make(ElasticReplayBuffer, replay_buffer_size=8)
    buf = make(ElasticReplayBuffer, replay_buffer_size=8, set_buffer_size=lambda step: 2 if step < 100 else 6)
    buf.push([{"i": i} for i in range(10)], 0)  # slots hold items 2..9
    assert {d["i"] for d in buf.sample(2, 0)} == {8, 9}
    assert buf.sample(3, 0) is None
    assert {d["i"] for d in buf.sample(20, 0, replace=True)} <= {8, 9}
    buf.update(200)
    assert buf.current_buffer_size == 6
    assert {d["i"] for d in buf.sample(6, 0)} == {4, 5, 6, 7, 8, 9}
    with pytest.raises(CompatError):
        buf.sample(1, 0, sample_range=slice(0, 2))


def test_sequence_buffer_windows_stay_inside_a_chunk(make):
    buf = make(SequenceReplayBuffer, replay_buffer_size=2000)
    buf.push([{"t": t} for t in range(600)], 0)  # chunks: [0, 500) full, [500, 600) of 100
    assert buf.sample(5, 150, 0) is None  # needs batch * sequence items
    out = buf.sample(4, 150, 0)
    assert len(out) == 4
    for window in out + buf.sample(4, 150, 0, replace=True):
        ts = [d["t"] for d in window]
        assert len(ts) == 150 and ts == list(range(ts[0], ts[0] + 150))
        assert ts[-1] < 500  # the second chunk is too short for a window of 150
    assert buf.sample(1, 500, 0) is not None  # a window filling a whole chunk
    assert buf.sample(1, 501, 0) is None  # DI-engine loops forever here
    with pytest.raises(NotImplementedError):
        buf.sample(1, 2, 0, sample_range=slice(0, 10))
