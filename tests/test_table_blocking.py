"""A blocking call on a table that cannot satisfy it says so (issue 23's load trap).

After ``Table.load`` a table whose rate limiter admits no sample warns (``BlockingWarning``); a
call with no timeout that has waited ``blocking_warning_s`` warns once and goes on waiting.
"""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest

import replaystore as rs
from conftest import transitions


def test_loading_a_table_below_its_min_size_warns_with_the_fix(tmp_path):
    t = rs.Table(2000, rate_limiter=rs.MinSize(1000), seed=0)
    keys = t.extend(transitions(1001))
    t.delete(keys[:10])  # 991 items: below MinSize(1000)
    t.save(tmp_path / "ck")
    with pytest.warns(rs.BlockingWarning) as got:
        u = rs.Table.load(tmp_path / "ck")
    msg = str(got[0].message)
    assert "991 items" in msg and "MinSize(min_size_to_sample=1000)" in msg and "9 more" in msg
    assert "timeout=" in msg
    assert issubclass(rs.BlockingWarning, rs.ReplayWarning) and issubclass(rs.ReplayWarning, UserWarning)
    with pytest.raises(rs.Timeout):  # it still blocks (and times out when asked to)
        u.sample(8, timeout=0.05)
    u.extend(transitions(9, 5000))
    assert len(u.sample(8, timeout=1.0)) == 8


def test_loading_a_sampleable_or_empty_table_does_not_warn(tmp_path):
    t = rs.Table(100, rate_limiter=rs.MinSize(10))
    t.extend(transitions(10))
    t.save(tmp_path / "ok")
    rs.Table(100, rate_limiter=rs.MinSize(10)).save(tmp_path / "empty")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(rs.Table.load(tmp_path / "ok").sample(4)) == 4
        assert len(rs.Table.load(tmp_path / "empty")) == 0


def test_a_ratio_limiter_ahead_of_its_inserts_is_named_on_load(tmp_path):
    t = rs.Table(100, rate_limiter=rs.SampleToInsertRatio(1.0, 2, (-2.0, 10.0)))
    t.extend(transitions(4))
    while t.rate_limiter.can_sample(1):
        t.sample(1)
    t.save(tmp_path / "ck")
    with pytest.warns(rs.BlockingWarning, match="SampleToInsertRatio.*admits no sample"):
        rs.Table.load(tmp_path / "ck")


def _until(cond, what, deadline_s=60.0):
    """Poll ``cond`` (another thread's progress) until true; fail after ``deadline_s`` seconds."""
    deadline = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _warned(got):
    return any(issubclass(w.category, rs.BlockingWarning) for w in got)


def test_a_sample_without_timeout_warns_once_after_the_threshold_and_keeps_waiting():
    t = rs.Table(10, rate_limiter=rs.MinSize(5))
    t.blocking_warning_s = 0.1
    t.extend(transitions(2))

    def fill():  # once the sample warned, and has waited five thresholds: its items
        _until(lambda: _warned(got), "the warning")
        _until(lambda: t.stats()["sample_blocked_now_s"] >= 0.5, "five thresholds")
        t.extend(transitions(3, 10))

    th = threading.Thread(target=fill)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        th.start()
        start = time.monotonic()
        s = t.sample(2)  # no timeout: waits for the other thread's items
        waited = time.monotonic() - start
    th.join(60)
    blocking = [w for w in got if issubclass(w.category, rs.BlockingWarning)]
    assert len(s) == 2 and waited >= 0.5
    assert len(blocking) == 1  # once, although it waited five thresholds
    msg = str(blocking[0].message)
    assert "sample of 2" in msg and "MinSize(min_size_to_sample=5)" in msg and "size 2" in msg
    assert t.stats()["sample_blocked_s"] >= 0.5


def test_a_blocked_insert_warns_too():
    q = rs.Table.queue(2)
    q.blocking_warning_s = 0.1
    q.extend(transitions(2))
    rec = []

    def take_one():  # once the insert warned: room for it
        _until(lambda: rec and _warned(rec[0]), "the warning")
        q.sample(1)

    th = threading.Thread(target=take_one)
    th.start()
    with pytest.warns(rs.BlockingWarning, match="insert of 1") as got:
        rec.append(got)
        assert q.extend(transitions(1, 7)).tolist() == [2]
    th.join(60)


@pytest.mark.parametrize("how", ["timeout", "default_timeout"])
def test_a_call_with_a_timeout_never_warns(how):
    t = rs.Table(10, rate_limiter=rs.MinSize(5), default_timeout=0.3 if how == "default_timeout" else None)
    t.blocking_warning_s = 0.05
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(rs.Timeout):
            t.sample(1, timeout=0.3 if how == "timeout" else None)


def test_closing_wakes_a_warned_waiter():
    t = rs.Table(10, rate_limiter=rs.MinSize(5))
    t.blocking_warning_s = 0.05
    threading.Timer(0.3, t.close).start()
    with pytest.warns(rs.BlockingWarning), pytest.raises(rs.Closed):
        t.sample(1)
    assert np.isfinite(t.stats()["sample_blocked_s"])
