import logging
import time

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions
from replaystore.monitor import LoggingSink, StatsReporter, TensorBoardSink, flatten_scalars


class ListSink:
    def __init__(self):
        self.rows = []
        self.closed = False

    def write(self, scalars, step):
        self.rows.append((step, scalars))

    def close(self):
        self.closed = True


def test_flatten_scalars_keeps_numbers_and_nests():
    out = flatten_scalars({"a": 1, "b": {"c": 2.5, "d": "x"}, "e": np.float32(3), "f": True, "g": [1]})
    assert out == {"a": 1.0, "b/c": 2.5, "e": 3.0, "f": 1.0}


def test_reporter_writes_periodically_and_closes_sinks():
    t = rs.Table(10, seed=0)
    t.extend(transitions(3))
    sink = ListSink()
    with StatsReporter(t.stats, [sink], period=0.05):
        deadline = time.monotonic() + 60  # a few periods, however long a loaded machine makes them
        while len(sink.rows) < 3:
            assert time.monotonic() < deadline, sink.rows
            time.sleep(0.01)
    assert len(sink.rows) >= 3 and sink.closed
    steps = [s for s, _ in sink.rows]
    assert steps == sorted(steps) and sink.rows[-1][1]["size"] == 3.0


def test_logging_sink(caplog):
    with caplog.at_level(logging.INFO, logger="replaystore"):
        StatsReporter(lambda: {"size": 4}, [LoggingSink()]).report()
    assert "size=4" in caplog.text


def test_broken_sink_does_not_raise(caplog):
    class Bad(ListSink):
        def write(self, scalars, step):
            raise OSError("disk full")

    r = StatsReporter(lambda: {"x": 1}, [Bad()])
    r.report()
    assert "failed" in caplog.text


def test_tensorboard_sink_writes_event_file(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    sink = TensorBoardSink(logdir=str(tmp_path))
    r = StatsReporter(lambda: {"size": 4, "priority_max": 2.0}, [sink])
    r.report()
    r.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) >= {"replay/size", "replay/priority_max"}
