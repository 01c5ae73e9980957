"""DI-engine's test_advanced_buffer.py, ported to black-box tests of the documented behaviour."""

import copy
import os
import pickle
from collections import Counter, defaultdict

import numpy as np
import pytest

from replaystore.compat.ding import AdvancedReplayBuffer, EasyDict, deep_merge_dicts

_counter = iter(range(10**9))


def generate_data():
    """As DI-engine's conftest: priority absent, None or U + 1e-3, each with probability 1/3."""
    data = {"obs": np.random.randn(4), "data_id": str(next(_counter))}
    r = np.random.randint(3)
    if r == 1:
        data["priority"] = None
    elif r == 2:
        data["priority"] = np.random.uniform() + 1e-3
    return data


def generate_data_list(count):
    return [generate_data() for _ in range(count)]


@pytest.fixture(autouse=True)
def _seed():
    np.random.seed(1)


@pytest.fixture
def make():
    made = []

    def factory(instance_name="test", **cfg):
        buf = AdvancedReplayBuffer(
            deep_merge_dicts(AdvancedReplayBuffer.default_config(), EasyDict(cfg)),
            tb_logger=None,
            instance_name=instance_name,
        )
        made.append(buf)
        return buf

    yield factory
    for b in made:
        b.close()


def slots(buf):
    return buf.state_dict()["data"]


def update_info(items, priorities):
    return {
        "replay_unique_id": [d["replay_unique_id"] for d in items],
        "replay_buffer_idx": [d["replay_buffer_idx"] for d in items],
        "priority": list(priorities),
    }


def test_push(make):
    buf = make(replay_buffer_size=64)
    pushed = []
    for _ in range(100):
        d = generate_data()
        buf.push(d, 0)
        pushed.append(d)
    assert buf.replay_buffer_size == 64
    assert buf.count() == 64
    assert buf.push_count == 100
    assert buf.state_dict()["tail"] == 100 % 64
    assert [d["replay_unique_id"] for d in pushed] == [f"test_{i}" for i in range(100)]
    assert [d["replay_buffer_idx"] for d in pushed] == [i % 64 for i in range(100)]
    assert all(d["priority"] is not None for d in pushed)  # pushed dicts are annotated in place
    # an empty list is a no-op
    buf.push([], 0)
    assert buf.count() == 64 and buf.push_count == 100 and buf.state_dict()["tail"] == 36
    d = generate_data()
    buf.push(d, 0)
    assert d["replay_unique_id"] == "test_100"

    buf = make(replay_buffer_size=64)
    extend_num = int(0.6 * 64)
    for i in range(1, 4):
        data = generate_data_list(extend_num)
        buf.push(data, 0)
        assert buf.state_dict()["tail"] == (extend_num * i) % 64
        assert data[-1]["replay_unique_id"] == f"test_{extend_num * i - 1}"
        assert buf.count() == min(extend_num * i, 64)


def test_save_and_load_data(make, tmp_path):
    buf = make(replay_buffer_size=64)
    for _ in range(64):
        buf.push(generate_data(), 0)
    buf.save_data(str(tmp_path / "x" / "advanced.pkl"))
    other = make(replay_buffer_size=64)
    other.load_data(str(tmp_path / "x" / "advanced.pkl"))
    assert other.count() == 64 and other.push_count == 64
    old = {d["data_id"]: d["priority"] for d in slots(buf)}
    assert {d["data_id"]: d["priority"] for d in slots(other)} == old  # priorities survive


def test_update(make):
    buf = make(replay_buffer_size=64)
    for _ in range(64):
        buf.push(generate_data(), 0)
        assert buf.count() == sum(d is not None for d in slots(buf))
    selected = [1, 4, 8, 30, 63]
    data = slots(buf)
    info = {"priority": [], "replay_unique_id": [], "replay_buffer_idx": []}
    for idx in selected:
        info["priority"].append(np.random.uniform() + 64 - idx)
        info["replay_unique_id"].append(data[idx]["replay_unique_id"])
        info["replay_buffer_idx"].append(data[idx]["replay_buffer_idx"])
    for _ in range(8):  # overwrite slots 0..7: the updates of slots 1 and 4 are stale
        buf.push(generate_data(), 0)
    before = copy.deepcopy(slots(buf))
    buf.update(info)
    after = slots(buf)
    assert np.argmax(info["priority"]) == 0
    assert buf.max_priority == max(info["priority"][2:])  # applied entries only, without eps
    assert buf.max_priority != max(info["priority"])
    for i in range(2):
        assert before[selected[i]]["priority"] == after[selected[i]]["priority"]
    for i in range(2, 5):
        assert info["priority"][i] + 1e-5 == after[selected[i]]["priority"]
    new = {"obs": 1}
    buf.push(new, 0)
    assert new["priority"] == max(info["priority"][2:])  # new data: largest priority reported
    buf.clear()
    buf.update(info)  # every slot is empty: nothing happens
    assert buf.count() == 0 and buf.max_priority == 1.0
    buf.update({"replay_unique_id": ["x"]})  # no 'priority': ignored
    buf.beta = 1.0
    assert buf.beta == 1.0


def test_sample_max_use_and_uniform_is(make):
    buf = make(replay_buffer_size=64, max_use=2)
    for _ in range(64):
        d = generate_data()
        d["priority"] = None
        buf.push(d, 0)
    use = defaultdict(int)
    while True:
        batch = buf.sample(32, 0)
        if batch is None:
            break
        assert len(batch) == 32
        assert all(b["IS"] == 1.0 for b in batch)  # equal priorities
        for b in batch:
            use[b["replay_buffer_idx"]] += 1
    assert buf.count() < 32
    used_up = [k for k, v in use.items() if v >= 2]
    assert len(used_up) == 64 - buf.count()
    data = slots(buf)
    assert all(data[k] is None for k in used_up)


def test_sampled_keys(make):
    buf = make(replay_buffer_size=16, anneal_step=0)
    buf.push([{"obs": i, "collect_iter": 3, "priority": float(i + 1)} for i in range(16)], 0)
    batch = buf.sample(8, 10)
    for b in batch:
        assert {"replay_unique_id", "replay_buffer_idx", "priority", "staleness", "use", "IS"} <= set(b)
        assert b["staleness"] == 7
        assert b["IS"] == pytest.approx((b["priority"] ** 0.6 / 1.0) ** -0.4)
    assert buf.beta == 0.4  # anneal_step 0: no annealing


def test_beta_anneals_once_per_sample_call(make):
    buf = make(replay_buffer_size=16, beta=0.4, anneal_step=4)
    buf.push([{"obs": i} for i in range(16)], 0)
    betas = []
    for _ in range(6):
        buf.sample(4, 0)
        betas.append(buf.beta)
    assert betas == pytest.approx([0.55, 0.7, 0.85, 1.0, 1.0, 1.0])


def test_duplicates_are_distinct_copies(make):
    buf = make(replay_buffer_size=4)
    buf.push([{"obs": 0, "priority": 1000.0}] + [{"obs": i, "priority": 1e-3} for i in range(1, 4)], 0)
    batch = buf.sample(4, 0)
    zeros = [b for b in batch if b["obs"] == 0]
    assert len(zeros) >= 3
    assert len({id(b) for b in zeros}) == len(zeros)
    assert all(b["use"] == len(zeros) for b in zeros)


def test_head_tail(make):
    buf = make(replay_buffer_size=64, max_use=4)
    for _ in range(65):
        buf.push(generate_data(), 0)
    assert buf.state_dict()["tail"] == 1
    data = slots(buf)
    prios = [0.0] * 64
    prios[1] = 1000.0
    buf.update(update_info(data, prios))
    target = data[1]["replay_unique_id"]
    for _ in range(100):
        if slots(buf)[1] is None:
            break
        buf.sample(1, 0)
    assert slots(buf)[1] is None and buf.count() == 63
    assert all(d is None or d["replay_unique_id"] != target for d in slots(buf))
    d = {"data_id": "1096"}
    buf.push(d, 0)
    assert d["replay_buffer_idx"] == 1
    assert buf.count() == 64 and buf.state_dict()["tail"] == 2


def frequencies(buf, size, calls, sample_range=None):
    seen = Counter()
    for _ in range(calls):
        for b in buf.sample(size, 0, sample_range=sample_range):
            seen[b["data_id"]] += 1
    total = sum(seen.values())
    return {k: v / total for k, v in seen.items()}


def expected(items, alpha=0.6):
    w = np.array([d["priority"] for d in items]) ** alpha
    return {d["data_id"]: p for d, p in zip(items, w / w.sum())}


def test_weight(make):
    """Sampling follows priority ** alpha before and after wrap-around, also inside a slot range."""
    buf = make(replay_buffer_size=64)
    assert buf.count() == 0
    data = generate_data_list(20)
    buf.push(data, 0)
    assert buf.beta == 0.4 and buf.alpha == 0.6 and buf.count() == 20
    freq = frequencies(buf, 20, 300)
    for k, p in expected(data).items():
        assert freq.get(k, 0) == pytest.approx(p, abs=0.01)

    data = generate_data_list(80)
    buf.push(data, 0)
    assert buf.count() == 64 and buf.state_dict()["tail"] == (20 + 80) % 64
    assert data[-1]["replay_unique_id"] == "test_99"
    freq = frequencies(buf, 64, 150)
    for k, p in expected(data[-64:]).items():
        assert freq.get(k, 0) == pytest.approx(p, abs=0.01)
    freq = frequencies(buf, 36, 150, sample_range=slice(0, 36))  # slots 0..35 hold data[-36:]
    assert set(freq) <= {d["data_id"] for d in data[-36:]}
    for k, p in expected(data[-36:]).items():
        assert freq.get(k, 0) == pytest.approx(p, abs=0.01)


def test_sample_range_negative_bounds(make):
    buf = make(replay_buffer_size=64)
    buf.push(generate_data_list(64), 0)
    data = slots(buf)
    ids = {d["replay_unique_id"] for d in data[-20:-2]}
    for _ in range(20):
        assert {b["replay_unique_id"] for b in buf.sample(8, 0, sample_range=slice(-20, -2))} <= ids


def test_rate_limit(make):
    buf = make(
        replay_buffer_size=1000,
        thruput_controller=dict(
            push_sample_rate_limit=dict(max=2, min=0.5), window_seconds=5, sample_min_limit_ratio=1.5
        ),
    )
    buf.push(generate_data_list(30), 0)  # push: 30
    for _ in range(3):
        assert buf.sample(19, 0) is not None  # sample: 3 * 19 = 57
    assert buf.sample(19, 0) is None  # 30 / (57 + 19) < 0.5
    assert buf.sample(21, 0) is None  # 30 / 21 < sample_min_limit_ratio
    assert buf.count() == 30
    for _ in range(2):
        buf.push(generate_data_list(30), 0)  # (30 + 2 * 30) / 57 <= 2
    assert buf.count() == 90
    buf.push(generate_data_list(30), 0)  # (90 + 30) / 57 > 2: dropped
    assert buf.count() == 90


def test_demonstration_buffer(make, tmp_path):
    path = tmp_path / "demo.pkl"
    with open(path, "wb") as f:
        pickle.dump({"data": generate_data_list(10)}, f)
    cfg = dict(replay_buffer_size=64, max_use=2, max_staleness=1000, alpha=0.6, beta=0.6)
    demo = make(instance_name="demo", **cfg)
    loaded = make(instance_name="demo", **cfg)
    with open(path, "rb") as f:
        data = pickle.load(f)
    demo.load_state_dict(data)
    assert demo.count() == len(data["data"])
    samples = demo.sample(3, 0)
    assert "staleness" in samples[0]
    assert samples[1]["staleness"] == -1
    assert len(samples) == 3
    demo.update({"replay_unique_id": ["demo_0", "demo_2"], "replay_buffer_idx": [0, 2], "priority": [1.33, 1.44]})
    by_id = {d["replay_unique_id"]: d for d in slots(demo) if d is not None}
    assert by_id["demo_0"]["priority"] == pytest.approx(1.33 + 1e-5)
    assert by_id["demo_2"]["priority"] == pytest.approx(1.44 + 1e-5)
    for s in demo.sample(5, 0):
        if s["replay_unique_id"] == "demo_0":
            assert abs(s["priority"] - 1.33) <= 1e-5 + 1e-9

    state = demo.state_dict()
    loaded.load_state_dict(state, deepcopy=True)
    assert loaded.state_dict()["tail"] == demo.state_dict()["tail"]
    assert loaded.max_priority == demo.max_priority == 1.44
    assert loaded.count() == demo.count()
    assert loaded.state_dict()["use_count"] == demo.state_dict()["use_count"]
    # deep copies: the two buffers no longer share items
    loaded.update({"replay_unique_id": ["demo_0"], "replay_buffer_idx": [0], "priority": [7.0]})
    assert slots(loaded)[0]["priority"] == pytest.approx(7.0 + 1e-5)
    assert slots(demo)[0]["priority"] == pytest.approx(1.33 + 1e-5)
    os.remove(path)


def test_deepcopy_keeps_the_callers_and_the_stored_dicts_clean(make):
    buf = make(replay_buffer_size=4, deepcopy=True)
    mine = {"obs": [0]}
    buf.push(mine, 0)
    assert "replay_unique_id" not in mine  # the buffer annotated its own copy
    out = buf.sample(1, 5)[0]
    assert out["replay_unique_id"] == "test_0" and out["IS"] == 1.0 and out["use"] == 1
    out["obs"].append(1)
    stored = slots(buf)[0]
    assert stored["obs"] == [0] and "IS" not in stored  # sampled copies, not the stored dict
    assert buf.sample(1, 6)[0]["use"] == 2


def test_max_use_one_and_clear(make):
    buf = make(replay_buffer_size=8, max_use=1)
    buf.push([{"o": i} for i in range(8)], 0)
    seen = set()
    while (batch := buf.sample(2, 0)) is not None:
        seen |= {b["o"] for b in batch}
    assert buf.count() < 2 and len(seen) >= 7
    buf.clear()
    assert buf.count() == 0 and buf.max_priority == 1.0 and buf.push_count == 8
    buf.push({"o": 9}, 0)
    assert slots(buf)[0]["replay_unique_id"] == "test_8"  # ids keep counting after clear
