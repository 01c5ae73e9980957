"""FragmentBuffer logic (MineStudio's replay actor, fixed), without Ray."""

import pytest

pytest.importorskip("lmdb")

import replaystore as rs  # noqa: E402
from replaystore.fragments.buffer import FragmentBuffer, FragmentBufferConfig  # noqa: E402

S = "session-1"


def make_buffer(tmp_path, **kw):
    cfg = dict(
        max_chunks=4,
        max_staleness=1,
        max_reuse=2,
        fragments_per_chunk=2,
        path=str(tmp_path),
        num_shards=2,
        seed=0,
        orphan_grace=0.0,
    )
    cfg.update(kw)
    reports = []
    buf = FragmentBuffer(FragmentBufferConfig(**cfg), report=reports.append)
    buf.reports = reports
    buf.set_version(S, 0)
    return buf


def put(buf, stream, seq, version=0, session=S):
    fid = buf.store.put({"stream": stream, "seq": seq})
    return fid, buf.add(fid, stream, seq, version, session)


def test_chunks_form_from_consecutive_fragments(tmp_path):
    buf = make_buffer(tmp_path)
    assert put(buf, "a", 0)[1] == "pending"
    assert put(buf, "b", 0)[1] == "pending"
    assert put(buf, "a", 1)[1] == "chunk"
    assert buf.num_chunks == 1
    lease = buf.fetch(2)
    assert [(r.stream, r.seq) for r in lease.records] == [("a", 0), ("a", 1)]
    with pytest.raises(ValueError):
        buf.fetch(3)  # not a multiple of fragments_per_chunk
    with pytest.raises(ValueError):
        buf.fetch(10)  # 5 chunks > max_chunks
    with pytest.raises(ValueError):
        buf.fetch(4)  # only one chunk held: the service waits before calling fetch


def test_duplicates_are_ignored_and_counted(tmp_path):
    buf = make_buffer(tmp_path)
    fid, _ = put(buf, "a", 0)
    assert buf.add(fid, "a", 0, 0, S) == "duplicate"  # same id again (a retried call)
    _, status = put(buf, "a", 0)  # same seq, new payload (a retried producer): payload deleted
    assert status == "duplicate"
    assert buf.counters["duplicates"] == 2
    assert len(buf.store) == 1
    assert put(buf, "a", 1)[1] == "chunk"


def test_gap_restarts_the_partial_chunk(tmp_path):
    buf = make_buffer(tmp_path, fragments_per_chunk=3)
    put(buf, "a", 0)
    put(buf, "a", 1)
    assert put(buf, "a", 5)[1] == "pending"  # gap: 0 and 1 dropped
    assert buf.counters["gaps"] == 1 and buf.counters["fragments_dropped_gap"] == 2
    assert len(buf.store) == 1
    put(buf, "a", 6)
    assert put(buf, "a", 7)[1] == "chunk"
    assert [r.seq for r in buf.fetch(3).records] == [5, 6, 7]


def test_staleness_drops_every_stale_chunk_not_only_the_head(tmp_path):
    buf = make_buffer(tmp_path, max_chunks=10, max_staleness=1, fragments_per_chunk=1)
    buf.set_version(S, 3)
    put(buf, "a", 0, version=3)  # head: fresh
    put(buf, "b", 0, version=2)  # behind it: older
    put(buf, "c", 0, version=3)
    assert buf.num_chunks == 3
    assert buf.set_version(S, 4) == 1  # b (version 2 < 4 - 1) dropped although a (version 3) is the head
    assert {r.stream for r in buf.fetch(2).records} == {"a", "c"}
    assert put(buf, "d", 0, version=2)[1] == "stale"  # refused at admission
    assert buf.counters["fragments_dropped_stale"] == 1


def test_session_change_drops_everything(tmp_path):
    buf = make_buffer(tmp_path, fragments_per_chunk=1)
    put(buf, "a", 0)
    put(buf, "b", 0)
    buf.set_version("session-2", 0)
    assert buf.num_chunks == 0
    assert put(buf, "c", 0)[1] == "stale"  # old session
    assert put(buf, "d", 0, session="session-2")[1] == "chunk"
    assert len(buf.store) == 1


def test_fifo_eviction_and_reuse_retirement(tmp_path):
    buf = make_buffer(tmp_path, max_chunks=2, fragments_per_chunk=1, max_reuse=2)
    for s in "abc":
        put(buf, s, 0)
    assert buf.num_chunks == 2 and buf.counters["chunks_evicted"] == 1
    f1 = buf.fetch(2)
    f2 = buf.fetch(2)
    assert {r.stream for r in f1.records} == {r.stream for r in f2.records} == {"b", "c"}
    assert buf.num_chunks == 0 and buf.counters["chunks_retired"] == 2
    # retired but leased: still on disk
    assert all(r.fragment_id in buf.store for r in f2.records)
    buf.release(f1.lease_id)
    assert all(r.fragment_id in buf.store for r in f2.records)
    buf.release(f2.lease_id)
    assert len(buf.store) == 0
    with pytest.raises(rs.KeyNotFound):
        buf.release(f2.lease_id)
    scalars = buf.report()
    assert "fragments_per_second" in scalars


def test_avg_reuse_and_staleness_are_reported(tmp_path):
    buf = make_buffer(tmp_path, fragments_per_chunk=1, max_reuse=1, max_staleness=5)
    put(buf, "a", 0)
    buf.set_version(S, 2)
    buf.fetch(1)
    last = buf.reports[-1]
    assert last["avg_reuse"] == 1.0 and last["avg_staleness"] == 2.0 and last["model_version"] == 2.0


def test_client_lease_released_by_its_next_fetch(tmp_path):
    buf = make_buffer(tmp_path, fragments_per_chunk=1, max_reuse=1, max_chunks=10)
    for s in "abcd":
        put(buf, s, 0)
    f1 = buf.fetch(1, client="t1")
    g1 = buf.fetch(1, client="t2")
    assert buf.prepared(f1.lease_id) != buf.prepared(g1.lease_id)
    buf.fetch(1, client="t1")  # releases f1 only
    assert f1.records[0].fragment_id not in buf.store
    assert g1.records[0].fragment_id in buf.store
    assert buf.prepared() == buf._leases[buf._client_lease["t1"]].records  # last fetch by anyone


def test_abandoned_and_stale_partials_are_dropped(tmp_path):
    buf = make_buffer(tmp_path, fragments_per_chunk=3, partial_max_age=10.0, max_staleness=0)
    fid, _ = put(buf, "dead", 0)
    put(buf, "alive", 0)
    buf.expire(now=buf._streams["dead"].last_seen + 5)
    assert fid in buf.store
    buf.expire(now=buf._streams["dead"].last_seen + 11)
    assert len(buf.store) == 0 and buf.counters["partials_expired"] == 2
    put(buf, "x", 0, version=0)
    buf.set_version(S, 1)  # the partial is now stale
    assert len(buf.store) == 0


def test_orphans_are_collected(tmp_path):
    buf = make_buffer(tmp_path, fragments_per_chunk=1, orphan_grace=3600)
    orphan = buf.store.put("never acknowledged")
    kept, _ = put(buf, "a", 0)
    assert buf.collect_orphans() == 0
    buf.config.orphan_grace = 0.0
    assert buf.collect_orphans() == 1
    assert orphan not in buf.store and kept in buf.store


def test_seeded_selection_is_reproducible(tmp_path):
    picks = []
    for run in range(2):
        buf = make_buffer(tmp_path / str(run), fragments_per_chunk=1, max_chunks=50, max_reuse=100, seed=7)
        for i in range(20):
            put(buf, f"s{i}", 0)
        picks.append([r.stream for _ in range(5) for r in buf.fetch(4).records])
        buf.close()
    assert picks[0] == picks[1]


def test_restart_resumes_from_the_journal(tmp_path):
    buf = make_buffer(tmp_path, fragments_per_chunk=2, max_reuse=3, max_chunks=10)
    put(buf, "a", 0)
    put(buf, "a", 1)
    put(buf, "b", 0)
    put(buf, "b", 1)
    put(buf, "c", 0)  # pending
    lease = buf.fetch(2, client="t")
    buf.set_version(S, 1)
    before = buf.stats()
    buf.close()

    again = FragmentBuffer(buf.config)
    after = again.stats()
    assert again.version == 1 and again.session == S
    assert after["replay_buffer_size_chunks"] == 2 and after["pending_fragments"] == 1
    assert after["leases"] == 1 and after["restarts"] == 1
    assert after["chunks_formed"] == before["chunks_formed"]
    use = sorted(c.use_count for c in again._chunks.values())
    assert use == [0, 1]
    assert put(again, "c", 1)[1] == "chunk"
    assert put(again, "a", 1)[1] == "duplicate"  # high-water mark survived
    assert again.prepared(lease.lease_id) == lease.records
    again.drain()
    assert len(again.store) == 0
    again.close()


def test_clear_on_start(tmp_path):
    buf = make_buffer(tmp_path, fragments_per_chunk=1)
    put(buf, "a", 0)
    buf.close()
    cfg = buf.config
    cfg.clear_on_start = True
    fresh = FragmentBuffer(cfg, resume=False)
    assert fresh.num_chunks == 0 and len(fresh.store) == 0 and fresh.version == -1
    fresh.close()
