"""Configs, registry, monitors, rate control, state round trips and thread safety."""

import copy
import logging
import pickle
import threading
import time

import numpy as np
import pytest

import replaystore.compat.ding as ding
from replaystore.compat.ding import (
    BUFFER_REGISTRY,
    AdvancedReplayBuffer,
    CompatError,
    EasyDict,
    NaiveReplayBuffer,
    PeriodicThruputMonitor,
    Registry,
    SampledDataAttrMonitor,
    ThruputController,
    create_buffer,
    deep_merge_dicts,
    get_buffer_cls,
)


class FakeWriter:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def flush(self):
        pass

    def tags(self):
        return {t for t, _, _ in self.scalars}


@pytest.fixture
def closing():
    made = []
    yield made.append
    for b in made:
        b.close()


# -- configs and registry -------------------------------------------------------------------------
def test_default_config():
    cfg = AdvancedReplayBuffer.default_config()
    assert isinstance(cfg, EasyDict)
    assert cfg.cfg_type == "AdvancedReplayBufferDict"
    assert cfg.type == "advanced" and cfg.replay_buffer_size == 4096
    assert (cfg.alpha, cfg.beta, cfg.anneal_step) == (0.6, 0.4, 100000)
    assert cfg.max_use == float("inf") and cfg.max_staleness == float("inf")
    assert cfg.thruput_controller.push_sample_rate_limit.max == float("inf")
    assert cfg.thruput_controller.sample_min_limit_ratio == 1
    assert cfg.monitor.sampled_data_attr.print_freq == 200
    assert cfg.monitor.periodic_thruput.seconds == 60
    cfg.thruput_controller.window_seconds = 1
    assert AdvancedReplayBuffer.default_config().thruput_controller.window_seconds == 30
    assert NaiveReplayBuffer.default_config().cfg_type == "NaiveReplayBufferDict"


def test_easydict():
    d = EasyDict({"a": {"b": 1}, "l": [{"c": 2}]})
    assert d.a.b == 1 and d.l[0].c == 2
    d.x = {"y": 3}
    assert isinstance(d.x, EasyDict) and d["x"]["y"] == 3
    with pytest.raises(AttributeError):
        d.missing  # noqa: B018
    assert pickle.loads(pickle.dumps(d)) == d
    e = copy.deepcopy(d)
    e.a.b = 5
    assert d.a.b == 1
    merged = deep_merge_dicts({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}, "z": 0})
    assert merged == {"a": {"b": 1, "c": 3}, "z": 0} and merged.a.c == 3


@pytest.mark.parametrize("as_type", [dict, EasyDict])
def test_create_buffer_from_partial_config(as_type, closing):
    buf = create_buffer(
        as_type(type="advanced", replay_buffer_size=32, thruput_controller={"window_seconds": 5}),
        tb_logger=None,
        exp_name="e",
        instance_name="x",
    )
    closing(buf)
    assert type(buf) is AdvancedReplayBuffer
    assert buf.replay_buffer_size == 32 and buf.alpha == 0.6
    assert buf._cfg.thruput_controller.sample_min_limit_ratio == 1  # merged over the defaults
    buf.push({"o": 1}, 0)
    assert buf.sample(1, 0)[0]["replay_unique_id"] == "x_0"


def test_create_buffer_types_and_errors(closing):
    for name, cls in [
        ("naive", ding.NaiveReplayBuffer),
        ("advanced", AdvancedReplayBuffer),
        ("episode", ding.EpisodeReplayBuffer),
        ("sequence", ding.SequenceReplayBuffer),
    ]:
        buf = create_buffer({"type": name, "replay_buffer_size": 8}, tb_logger=FakeWriter())
        closing(buf)
        assert type(buf) is cls
        assert get_buffer_cls({"type": name}) is cls
    assert create_buffer({"type": "naive"}, tb_logger=FakeWriter())._tb_logger is None  # as DI-engine
    with pytest.raises(KeyError, match="not support"):
        create_buffer({"type": "deque"})
    with pytest.raises(KeyError):
        create_buffer({"replay_buffer_size": 8})
    with pytest.raises(KeyError):
        get_buffer_cls({"type": "nope"})
    closing(create_buffer({"type": "naive", "import_names": ["json"]}))


def test_registry():
    reg = Registry()

    @reg.register("a")
    class A:
        def __init__(self, x):
            self.x = x

    assert reg.build("a", 3).x == 3
    with pytest.raises(CompatError):
        reg.register("a", object)
    reg.register("a", object, force_overwrite=True)
    assert reg["a"] is object
    assert set(BUFFER_REGISTRY) >= {"naive", "advanced", "episode", "elastic", "sequence"}


@pytest.mark.parametrize(
    "bad",
    [
        dict(alpha=1.5),
        dict(beta=-0.1),
        dict(replay_buffer_size=0),
        dict(thruput_controller=dict(sample_min_limit_ratio=0.5)),
        dict(max_use=0),
        dict(anneal_step=-1),
    ],
)
def test_invalid_advanced_config(bad):
    before = set(threading.enumerate())
    with pytest.raises(CompatError):
        AdvancedReplayBuffer(bad)
    time.sleep(0.01)
    assert set(threading.enumerate()) - before == set()  # no thread left behind


# -- monitors ------------------------------------------------------------------------------------
NAMES = ["use_avg", "use_max", "priority_avg", "priority_max", "priority_min", "staleness_avg", "staleness_max", "beta"]


def test_sampled_data_attr_scalars_go_to_tensorboard(closing):
    w = FakeWriter()
    buf = AdvancedReplayBuffer(
        {"replay_buffer_size": 16, "monitor": {"sampled_data_attr": {"print_freq": 2}}},
        tb_logger=w,
        instance_name="buf",
    )
    closing(buf)
    buf.push([{"o": i} for i in range(16)], 0)  # envstep 0 is a valid step
    for it in range(4):
        buf.sample(4, it)
    expected = {f"buf_iter/{k}" for k in NAMES} | {f"buf_step/{k}" for k in NAMES}
    assert w.tags() == expected
    assert sorted({s for t, _, s in w.scalars if t.startswith("buf_iter")}) == [0, 2]  # sample calls 0, 2
    buf.push({"o": 1}, -1)  # envstep -1: no step scalars
    w.scalars.clear()
    for it in range(2):
        buf.sample(4, 10 + it)
    assert w.tags() == {f"buf_iter/{k}" for k in NAMES}


def test_scalars_go_to_logging_without_writer(closing, caplog):
    caplog.set_level(logging.INFO, logger="replaystore.compat.ding")
    buf = AdvancedReplayBuffer({"replay_buffer_size": 16}, instance_name="quiet")
    closing(buf)
    buf.push([{"o": i} for i in range(16)], 0)
    buf.sample(4, 0)
    assert "Sample data 0 Times" in caplog.text and "use_avg" in caplog.text
    assert buf.sample(40, 0) is None
    assert "not enough data" in caplog.text


def test_sampled_data_attr_monitor_window():
    m = SampledDataAttrMonitor(None, expire=2)
    assert m.report()["use_avg"] == 0
    for v in (1, 2, 3):
        m.record(use_avg=v, use_max=v, priority_min=v)
    r = m.report()
    assert r["use_avg"] == 2.5 and r["use_max"] == 3 and r["priority_min"] == 2


def test_periodic_thruput_monitor_thread():
    w = FakeWriter()
    mon = PeriodicThruputMonitor("buf", {"seconds": 0.05}, None, w)
    mon.record(pushed=5, sampled=3, removed=1, valid=4)
    deadline = time.monotonic() + 60
    while not w.scalars and time.monotonic() < deadline:
        time.sleep(0.01)
    mon.close()
    mon.close()
    assert not mon.alive
    assert {"buf_sec/pushed_in", "buf_sec/sampled_out", "buf_sec/removed", "buf_sec/current_have"} <= w.tags()
    first = {t: v for t, v, s in w.scalars if s == 0}
    assert first == {"buf_sec/pushed_in": 5, "buf_sec/sampled_out": 3, "buf_sec/removed": 1, "buf_sec/current_have": 4}


def test_thruput_controller_decay_and_limits():
    now = [0.0]
    c = ThruputController({"push_sample_rate_limit": {"max": 2, "min": 0.5}, "window_seconds": 5}, clock=lambda: now[0])
    assert c.can_push(1000)[0]  # nothing sampled yet
    c.add(pushed=30, sampled=57)
    assert not c.can_sample(19)[0] and c.can_sample(3)[0]
    assert c.can_push(84)[0] and not c.can_push(85)[0]
    now[0] = 5.0
    assert c.history_push_count == pytest.approx(0.3)
    assert c.history_sample_count == pytest.approx(0.57)
    c.history_push_count = 10
    assert c.history_push_count == 10
    with pytest.raises(CompatError):
        ThruputController({"push_sample_rate_limit": {"max": 1, "min": 2}, "window_seconds": 5})


# -- state -----------------------------------------------------------------------------------------
def test_state_dict_round_trip_keeps_ids_priorities_and_use(closing):
    np.random.seed(0)
    a = AdvancedReplayBuffer({"replay_buffer_size": 8, "max_use": 3}, instance_name="s")
    b = AdvancedReplayBuffer({"replay_buffer_size": 8, "max_use": 3}, instance_name="s")
    closing(a)
    closing(b)
    a.push([{"o": i} for i in range(10)], 0)
    batch = a.sample(4, 0)
    a.update(
        {
            "replay_unique_id": [x["replay_unique_id"] for x in batch],
            "replay_buffer_idx": [x["replay_buffer_idx"] for x in batch],
            "priority": [5.0] * 4,
        }
    )
    b.load_state_dict(a.state_dict())
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["use_count"] == sb["use_count"] and sa["tail"] == sb["tail"] == 2
    assert [d["replay_unique_id"] for d in sa["data"]] == [d["replay_unique_id"] for d in sb["data"]]
    assert b.max_priority == 5.0 and b.count() == a.count() and b.beta == a.beta
    # the same draws follow from the same random state
    np.random.seed(3)
    xa = [x["replay_unique_id"] for x in a.sample(8, 1)]
    np.random.seed(3)
    xb = [x["replay_unique_id"] for x in b.sample(8, 1)]
    assert xa == xb
    b.push({"o": 99}, 0)
    assert b.state_dict()["data"][2]["replay_unique_id"] == "s_10"  # ids continue


def test_accepts_a_dingengine_style_state_dict(closing):
    buf = AdvancedReplayBuffer({"replay_buffer_size": 4}, instance_name="buffer")
    closing(buf)
    data = [
        {"o": i, "replay_unique_id": f"buffer_{i}", "replay_buffer_idx": i, "priority": 1.0 + i} for i in range(3)
    ] + [None]
    buf.load_state_dict(
        {
            "data": data,
            "use_count": {0: 1, 1: 0, 2: 0, 3: 0},
            "tail": 3,
            "max_priority": 3.0,
            "anneal_step": 100000,
            "beta": 0.5,
            "head": 0,
            "next_unique_id": 3,
            "valid_count": 3,
            "push_count": 3,
            "sum_tree": None,
            "min_tree": None,
        }
    )
    assert buf.count() == 3 and buf.beta == 0.5 and buf.max_priority == 3.0
    batch = buf.sample(3, 0)
    assert all(x["IS"] == pytest.approx(((1.0 + x["o"]) ** 0.6 / 1.0) ** -0.5) for x in batch)
    assert buf.state_dict()["use_count"][0] >= 1


# -- threads ----------------------------------------------------------------------------------
def test_concurrent_push_sample_update(closing):
    buf = AdvancedReplayBuffer({"replay_buffer_size": 256, "max_use": 50}, instance_name="t")
    closing(buf)
    buf.push([{"o": i} for i in range(64)], 0)
    errors = []
    stop = time.monotonic() + 0.5

    def pusher():
        i = 0
        while time.monotonic() < stop:
            buf.push([{"o": i + k} for k in range(8)], i)
            i += 8

    def learner():
        it = 0
        while time.monotonic() < stop:
            batch = buf.sample(32, it)
            if batch:
                buf.update(
                    {
                        "replay_unique_id": [x["replay_unique_id"] for x in batch],
                        "replay_buffer_idx": [x["replay_buffer_idx"] for x in batch],
                        "priority": list(np.random.rand(len(batch))),
                    }
                )
            it += 1

    def run(fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f,)) for f in (pusher, pusher, learner, learner)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    data = [d for d in buf.state_dict()["data"] if d is not None]
    assert len(data) == buf.count() <= 256
    assert len({d["replay_unique_id"] for d in data}) == len(data)
    assert all(d["replay_buffer_idx"] == i for i, d in enumerate(buf.state_dict()["data"]) if d is not None)
