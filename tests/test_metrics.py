"""replaystore.metrics: stats() histograms and waits, the Recorder's rates, exporters, the dashboard server."""

import json
import math
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore.cli import main
from replaystore.errors import PortInUse, Unavailable
from replaystore.metrics import Recorder, TableSource, merge_shards, serve_dashboard, table_row
from replaystore.metrics.prometheus import histogram_buckets, metrics_text
from replaystore.metrics.series import online_row
from replaystore.metrics.sources import SharedSource

SPEC = {"x": ((), np.float32)}


def data(n, start=0):
    return {"x": np.arange(start, start + n, dtype=np.float32)}


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers.get("Content-Type"), r.read()


# -- stats(): histograms against a plain model ------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False), min_size=1, max_size=60))
def test_priority_histogram_matches_a_plain_model(priorities):
    t = rs.Table(64, sampler=rs.Prioritized(), remover=rs.Fifo(), seed=0)
    t.extend(data(len(priorities)), priorities=priorities)
    # the model: a priority's bin is its binary exponent e (p in [2^e, 2^(e+1))); the 15 bins up to
    # the largest priority's exponent E are kept, everything below (zeros too) counts in "<2^(E-14)"
    exps = [math.frexp(p)[1] - 1 for p in priorities if p > 0]
    model: dict[str, int] = {}
    if not exps:
        model = {"0": len(priorities)}
    else:
        top = max(exps)
        for p in priorities:
            e = math.frexp(p)[1] - 1 if p > 0 else None
            label = f"2^{e}" if e is not None and e >= top - 14 else f"<2^{top - 14}"
            model[label] = model.get(label, 0) + 1
    s = t.stats()
    assert s["priority_histogram"] == model
    assert sum(s["priority_histogram"].values()) == s["size"] == len(priorities)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.lists(st.integers(1, 30), max_size=12), st.integers(0, 2**16))
def test_times_sampled_histogram_matches_the_items_counts(n, batches, seed):
    t = rs.Table(64, seed=seed)
    keys = t.extend(data(n))
    for b in batches:
        t.sample(b)
    model: dict[str, int] = {}
    for c in t.info(keys)["times_sampled"]:
        label = str(c) if c < 15 else ">=15"
        model[label] = model.get(label, 0) + 1
    assert t.stats()["times_sampled_histogram"] == model


def test_stats_reports_a_wait_going_on_and_the_limiters_target():
    t = rs.Table(100, rate_limiter=rs.SampleToInsertRatio(2.0, 4, 20.0), seed=0)
    assert t.stats()["config"]["target_sample_to_insert_ratio"] == 2.0
    assert rs.Table(10).stats()["config"]["target_sample_to_insert_ratio"] is None  # MinSize: no target
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("s", t.sample(2, timeout=120)))
    th.start()
    deadline = time.monotonic() + 60
    while t.stats()["sample_waiting"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.2)
    s = t.stats()
    assert s["sample_waiting"] == 1 and s["insert_waiting"] == 0
    assert 0.2 <= s["sample_blocked_now_s"] < 120 and s["sample_blocked_s"] == 0.0  # counted when it ends
    t.extend(data(8))
    th.join(60)
    s = t.stats()
    assert s["sample_waiting"] == 0 and s["sample_blocked_now_s"] == 0.0 and s["sample_blocked_s"] >= 0.2
    assert len(out["s"].keys) == 2


# -- the Recorder's rows ------------------------------------------------------------------------------
def test_table_row_rates_and_restart():
    prev = {"inserts": 100, "samples": 50, "size": 10, "capacity": 20, "insert_blocked_s": 1.0}
    now = {"inserts": 300, "samples": 450, "size": 20, "capacity": 20, "insert_blocked_s": 1.5}
    now |= {"sample_blocked_now_s": 0.25, "sample_waiting": 1, "staleness_histogram": {"0": 5, "2": 5}}
    row = table_row(now, prev, 2.0)
    assert row["inserts_per_s"] == 100 and row["samples_per_s"] == 200 and row["ratio"] == 2.0
    assert row["insert_blocked"] == 0.25 and row["sample_blocked"] == 0.125 and row["sample_waiting"] == 1
    assert row["fill"] == 1.0 and row["staleness_mean"] == 1.0
    restarted = table_row({**now, "inserts": 5, "samples": 0}, prev, 2.0)  # counters went back
    assert restarted["inserts_per_s"] is None and restarted["ratio"] is None and restarted["insert_blocked"] is None


def test_online_rows_chart_the_budget_tickets_groups_and_refusals_by_reason():
    from replaystore.online import RolloutBuffer

    buf = RolloutBuffer(16, batch_size=2, max_staleness=1, group_size=1)
    rec = Recorder(TableSource(rs.Table(10), online=buf), period=60)
    first = rec.poll()["online"]["rollouts"]
    assert first["tickets"] == 0 and first["budget_limit"] == 4 and first["groups_admitted_per_s"] is None
    before = buf.stats()
    a, b, c, d = buf.acquire(4)
    buf.add("x", group=a)
    buf.add("y", group=b)
    buf.reject(b, "all_equal")
    buf.abandon(c)
    after = buf.stats()
    row = online_row(after, before, 2.0)  # two seconds apart
    budget = after["budget"]
    assert row["tickets"] == budget["running"] == 1  # d is still held
    assert (row["budget_limit"], row["budget_accepted"], row["budget_capacity"]) == (
        budget["limit"],
        budget["accepted"],
        budget["capacity"],
    )
    assert row["groups"] == after["groups"] == 1 and row["groups_admitted_per_s"] == 1.0  # 2 admitted / 2 s
    assert row["dropped_per_s"]["rejected"] == 0.5 and row["dropped_per_s"]["stale"] == 0.0
    assert row["rejected_per_s"] == {"all_equal": 0.5}  # a reason first seen now counts from 0
    lost = {k: (budget[k] - before["budget"][k]) / 2.0 for k in row["budget_lost_per_s"]}
    assert row["budget_lost_per_s"] == lost and lost["abandoned"] == 0.5
    point = rec.poll()["online"]["rollouts"]  # the recorder derives the same from its own reads
    assert point["tickets"] == 1 and point["rejected_per_s"]["all_equal"] > 0 and point["groups"] == 1
    restarted = online_row({**after, "rollouts_added": 0}, after, 2.0)
    assert restarted["groups_admitted_per_s"] is None and restarted["budget_lost_per_s"]["abandoned"] is None
    rec.close()


def test_recorder_follows_a_table_and_a_source_error():
    t = rs.Table(1000, seed=0)
    rec = Recorder(TableSource(t), period=60)
    rec.poll()
    t.extend(data(300))
    t.sample(60)
    p = rec.poll()["tables"]["table"]
    assert p["size"] == 300 and p["inserts"] == 300 and p["samples"] == 60 and p["ratio"] == pytest.approx(0.2)
    assert p["inserts_per_s"] > 0 and p["fill"] == 0.3

    class Gone:
        kind, name = "service", "gone"

        def read(self):
            raise Unavailable("replay service 'gone': not running")

        def close(self):
            pass

    rec2 = Recorder(Gone(), period=60)
    bad = rec2.poll()
    assert bad["ok"] is False and "not running" in bad["error"] and rec2.latest() is None


def test_merge_shards_sums_against_stats_of_one_table():
    a, b = rs.Table(50, sampler=rs.Prioritized(), seed=1), rs.Table(50, sampler=rs.Prioritized(), seed=2)
    a.extend(data(10), priorities=np.full(10, 2.0))
    b.extend(data(30), priorities=np.full(30, 4.0))
    a.sample(4)
    total = merge_shards([a.stats(), None, b.stats()])
    assert total["size"] == 40 and total["capacity"] == 100 and total["inserts"] == 40 and total["samples"] == 4
    assert total["priority_histogram"] == {"2^1": 10, "2^2": 30}
    assert total["priority_mean"] == pytest.approx((10 * 2 + 30 * 4) / 40)
    assert total["sample_to_insert_ratio"] == pytest.approx(0.1)
    # one function with ShardedClient.stats()["total"]: maxima the largest, the config the first shard's
    assert total["max_priority_seen"] == 4.0 and sum(total["times_sampled_histogram"].values()) == 40
    assert total["config"] == a.stats()["config"] and total["name"] == a.name


# -- Prometheus --------------------------------------------------------------------------------------
def test_prometheus_text_matches_stats():
    parser = pytest.importorskip("prometheus_client.parser")
    t = rs.Table(100, sampler=rs.Prioritized(), seed=0, name="per")
    t.extend(data(20), priorities=np.linspace(0.5, 3, 20))
    t.sample(7)
    rec = Recorder(TableSource(t), period=60)
    rec.poll()
    fams = {f.name: f for f in parser.text_string_to_metric_families(metrics_text(rec).decode())}
    s = t.stats()
    val = {f: {tuple(sorted(x.labels.items())): x.value for x in fams[f].samples} for f in fams}
    key = (("shard", ""), ("source", "per"), ("table", "per"))
    assert val["replaystore_inserts"][key] == s["inserts"] == 20
    assert val["replaystore_samples"][key] == 7 and val["replaystore_size"][key] == 20
    assert val["replaystore_up"][(("source", "per"),)] == 1.0
    buckets = {x.labels["le"]: x.value for x in fams["replaystore_priority"].samples if x.name.endswith("_bucket")}
    assert buckets["+Inf"] == 20 and buckets["1.0"] == sum(1 for p in np.linspace(0.5, 3, 20) if p < 1.0)
    assert histogram_buckets({"0": 3, "2": 1, ">=15": 2}) == [("0.0", 3), ("2.0", 4), ("+Inf", 6)]


# -- TensorBoard ---------------------------------------------------------------------------------------
def test_tensorboard_exporter_writes_scalars_and_histograms(tmp_path):
    pytest.importorskip("torch.utils.tensorboard")
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from replaystore.metrics import TensorBoardExporter

    t = rs.Table(100, sampler=rs.Prioritized(), seed=0, name="per")
    rec = Recorder(TableSource(t), period=60)
    tb = TensorBoardExporter(rec, logdir=str(tmp_path))
    rec.poll()
    t.extend(data(40))
    t.sample(10)
    rec.poll()
    tb.close()
    acc = ea.EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    assert [e.value for e in acc.Scalars("replay/per/size")] == [0.0, 40.0]
    assert acc.Scalars("replay/per/inserts_per_s")[-1].value > 0
    h = acc.Histograms("replay/per/times_sampled_histogram")[-1].histogram_value
    assert h.num == 40


# -- the dashboard server ------------------------------------------------------------------------------
def test_dashboard_serves_page_points_metrics_and_refuses_a_taken_port():
    t = rs.Table(100, seed=0, name="replay")
    t.extend(data(10))
    with serve_dashboard(t, port=0, period=0.2) as d:
        code, ctype, body = get(d.url)
        assert code == 200 and "text/html" in ctype and b"/static/app.js" in body
        assert get(d.url + "static/app.js")[0] == 200
        with pytest.raises(urllib.error.HTTPError) as e:
            get(d.url + "static/../server.py")
        assert e.value.code == 404
        pts = json.loads(get(d.url + "api/points?since=0")[2])
        assert pts["points"][0]["tables"]["replay"]["size"] == 10 and pts["seq"] >= 1
        info = json.loads(get(d.url + "api/info")[2])
        assert info["kind"] == "table" and info["snapshot"]["tables"]["replay"]["stats"]["inserts"] == 10
        if pytest.importorskip("prometheus_client"):
            assert b'replaystore_size{shard="",source="replay",table="replay"} 10.0' in get(d.url + "metrics")[2]
        with pytest.raises(PortInUse, match=str(d.server.port)):
            serve_dashboard(t, port=d.server.port)
    with serve_dashboard(t, port=d.server.port) as again:  # closed: the port is free again
        assert get(again.url + "api/points")[0] == 200


def test_cli_dashboard_says_what_is_wrong(capsys, tmp_path):
    assert main(["dashboard", "--shared", "nope", "--directory", str(tmp_path), "--port", "0"]) == 2
    assert "shared table 'nope'" in capsys.readouterr().err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        from replaystore.shared import SharedTable

        t = SharedTable.create("cli", 16, SPEC, directory=tmp_path)
        try:
            assert main(["dashboard", "--shared", "cli", "--directory", str(tmp_path), "--port", str(port)]) == 2
            assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
            args = ["dashboard", "--shared", "cli", "--directory", str(tmp_path), "--port", "0", "--duration", "0.3"]
            assert main(args) == 0
            assert "replaystore dashboard of shared 'cli': http://127.0.0.1:" in capsys.readouterr().out
        finally:
            t.close()
            t.unlink()


# -- shared tables -------------------------------------------------------------------------------------
def test_shared_source_reads_stats_and_the_lock(tmp_path):
    from replaystore.shared import SharedTable

    with pytest.raises(Unavailable, match="'missing'"):
        SharedSource("missing", str(tmp_path)).read()
    t = SharedTable.create("m", 64, SPEC, directory=tmp_path)
    src = SharedSource("m", str(tmp_path), lock_hz=500)
    try:
        first = src.read()["lock"]["acquisitions"]
        t.extend(data(10))
        t.sample(3)
        time.sleep(0.1)
        snap = src.read()
        assert snap["tables"]["m"]["stats"]["size"] == 10 and snap["tables"]["m"]["stats"]["samples"] == 3
        lock = snap["lock"]
        assert lock["acquisitions"] >= first + 2 and 0.0 <= lock["held_fraction"] <= 1.0
        assert lock["recoveries"] == 0 and lock["waiting_mean"] is not None
    finally:
        src.close()
        t.close()
        t.unlink()
