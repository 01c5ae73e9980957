"""Episodes in a shared table: the episode tests run on a SharedTable, writers in two processes
against an in-process table fed the same steps, a two-process model, the sequence-start
distribution from another process, a writer killed in the middle of ``extend_steps``."""

import dataclasses
import itertools
import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest
import test_episodes as te
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from test_shared_processes import run_python

import replaystore as rs
from replaystore.shared import SharedTable

SPEC = {"obs": ((), np.float32), "next_obs": ((), np.float32), "reward": ((), np.float64), "id": ((), np.int64)}
_names = itertools.count()


def make_shared(directory, capacity=100, **kw):
    """A SharedTable with the options of ``test_episodes.table`` (``max_streams`` 64 unless given)."""
    ep = kw.pop("episodes", None) or rs.Episodes(next_obs_field="next_obs")
    if ep.max_streams is None:
        ep = dataclasses.replace(ep, max_streams=64)
    kw.setdefault("seed", 0)
    return SharedTable.create(f"ep{next(_names)}", capacity, SPEC, directory=directory, episodes=ep, **kw)


class TwoHandles:
    """Writes through one handle of a shared table, everything else through another (its own index)."""

    WRITES = {"add_step", "extend_steps", "add_episode", "end_episode", "delete", "clear", "set_version"}

    def __init__(self, writer, reader):
        self.writer, self.reader = writer, reader

    def __getattr__(self, name):
        if name.startswith("_"):  # the tests read the index directly: bring the reader's up to date
            with self.reader._cond:
                pass
        return getattr(self.writer if name in self.WRITES else self.reader, name)

    def __len__(self):
        return len(self.reader)


# the episode behaviours of test_episodes.py whose tables come from its ``table()`` / ``prio_table()``
SHARED_CASES = [
    "test_positions_and_episodes_of_interleaved_streams",
    "test_add_episode_and_end_episode",
    "test_end_episode_unknown_stream_and_bad_ids_change_nothing",
    "test_failed_insert_leaves_streams_unchanged",
    "test_strict_sequence_longer_than_every_episode_raises_and_changes_nothing",
    "test_uniform_strict_starts_are_uniform_over_valid_starts",
    "test_wraparound_and_eviction_mid_episode",
    "test_nstep_reference_with_next_obs",
    "test_nstep_n1_is_the_one_step_transition_and_gamma_one",
    "test_staleness_and_clear_keep_the_index_consistent",
    "test_caches_of_the_index_do_not_survive_clear",
    "test_fifo_batch_larger_than_capacity_keeps_the_newest_steps_in_place",
    "test_prioritized_sequences_give_zero_mass_to_invalid_starts_and_exact_probabilities",
    "test_prioritized_sequences_refuse_other_windows_and_all_zero_falls_back_to_uniform",
]


@pytest.mark.parametrize("handles", [1, 2])
@pytest.mark.parametrize("case", SHARED_CASES)
def test_episode_behaviours_on_a_shared_table(case, handles, tmp_path, monkeypatch):
    """``handles=2``: the test writes through one handle and reads through another."""
    opened = []

    def table(capacity=100, **kw):
        t = make_shared(tmp_path, capacity, **kw)
        opened.append(t)
        if handles == 1:
            return t
        opened.append(SharedTable.attach(t.shared_name, directory=tmp_path, seed=0))
        return TwoHandles(t, opened[-1])

    def prio_table(capacity=200, length=4, burn_in=1, **kw):
        ep = rs.Episodes(sequence_length=length + burn_in, burn_in=burn_in, next_obs_field="next_obs")
        return table(capacity, sampler=rs.Prioritized(alpha=1.0, beta=1.0), episodes=ep, **kw)

    monkeypatch.setattr(te, "table", table)
    monkeypatch.setattr(te, "prio_table", prio_table)
    getattr(te, case)()
    for t in opened[::-1]:
        t.close()


def test_two_handles_follow_each_others_steps_and_episode_ends(tmp_path):
    a = make_shared(tmp_path, 6)
    b = SharedTable.attach(a.shared_name, directory=tmp_path)
    local = te.table(6)
    for tab in (a, local):
        tab.extend_steps(te.steps([0, 1, 2]), streams=[0, 1, 0])
    assert b.episode_info([0, 1, 2]).lengths.tolist() == [2, 1, 2]  # b's index holds these steps now
    for tab in (a, local):
        tab.end_episode(0)
    assert b.episode_info([2]).is_last.tolist() == [True]  # the flag set on a step b already had
    for tab in (b, local):
        tab.add_step(te.step(3), stream=0)
        tab.extend_steps(te.steps([4, 5, 6, 7]), streams=[1, 2, 1, 3], truncated=[0, 0, 1, 0])  # evicts 0..1
    for tab in (a, b):
        got, want = (
            dataclasses.asdict(tab.episode_info(np.arange(9))),
            dataclasses.asdict(local.episode_info(np.arange(9))),
        )
        assert all(np.array_equal(got[f], want[f]) for f in want)
    b.close()
    a.close()


def test_a_writer_waiting_for_the_rate_limiter_while_another_writes(tmp_path):
    """The waiting writer's index takes the other handle's steps while its own plan is pending."""
    limiter = rs.RateLimiter(1.0, 1, -100, 3)  # inserts - samples <= 3
    a = make_shared(tmp_path, 50, rate_limiter=limiter)
    b = SharedTable.attach(a.shared_name, directory=tmp_path)
    local = te.table(50, rate_limiter=rs.RateLimiter(1.0, 1, -100, 3))
    for tab in (b, local):
        tab.extend_steps(te.steps([0, 1]), streams=[0, 1])
    out = {}
    writer = threading.Thread(
        target=lambda: out.update(keys=a.extend_steps(te.steps([2, 3]), streams=[0, 2], timeout=20))
    )
    writer.start()  # 2 + 2 > 3: it waits
    time.sleep(0.2)
    assert writer.is_alive()
    b.extend_steps(te.steps([4]), streams=[1])  # 3 <= 3: goes first, while the other waits
    b.sample_sequences(3, 1)  # lets the waiting writer in
    writer.join(20)
    assert out["keys"].tolist() == [3, 4]
    # the in-process table takes the calls in the order the shared one did
    local.extend_steps(te.steps([4]), streams=[1])
    local.sample_sequences(3, 1)
    local.extend_steps(te.steps([2, 3]), streams=[0, 2])
    for tab in (a, b):
        got, want = (
            dataclasses.asdict(tab.episode_info(np.arange(6))),
            dataclasses.asdict(local.episode_info(np.arange(6))),
        )
        assert all(np.array_equal(got[f], want[f]) for f in want)
    b.close()
    a.close()


def test_shared_episodes_need_max_streams(tmp_path):
    with pytest.raises(rs.InvalidArgument, match="max_streams"):
        SharedTable.create("a", 10, SPEC, directory=tmp_path, episodes=rs.Episodes())
    assert list(tmp_path.iterdir()) == []
    t = SharedTable.create("plain", 10, SPEC, directory=tmp_path)
    with pytest.raises(rs.EpisodeError, match="no episode structure"):
        t.extend_steps(te.steps([0]))
    t.close()


def _same_info(tables, local, keys):
    want = dataclasses.asdict(local.episode_info(keys))
    for tab in tables:
        got = dataclasses.asdict(tab.episode_info(keys))
        assert all(np.array_equal(got[f], want[f]) for f in want), [
            f for f in want if not np.array_equal(got[f], want[f])
        ]


@pytest.mark.parametrize(
    "kw",
    [{}, {"remover": rs.Lifo()}, {"remover": rs.Uniform()}, {"sampler": rs.Prioritized(), "max_times_sampled": 2}],
    ids=["fifo-deletes", "lifo", "uniform-remover", "retirement"],
)
def test_episodes_out_of_ring_mode_match_an_in_process_table(tmp_path, kw):
    """Deletes of any key, other removers, retirements: every handle's index follows (same seed, same calls)."""
    a = make_shared(tmp_path, 16, **kw)
    b = SharedTable.attach(a.shared_name, directory=tmp_path, seed=1)
    local = te.table(16, **kw)
    rng = np.random.default_rng(0)
    next_id = 0
    for i in range(40):
        n = int(rng.integers(1, 6))
        streams, ends = rng.integers(0, 4, n), rng.random(n) < 0.15
        ids = np.arange(next_id, next_id + n)
        next_id += n
        k = a.extend_steps(te.steps(ids), streams, terminated=ends)
        assert k.tolist() == local.extend_steps(te.steps(ids), streams, terminated=ends).tolist()
        if i % 4 == 1 and len(local):
            doomed = rng.choice(local.keys(), min(2, len(local)), replace=False)
            assert a.delete(doomed) == local.delete(doomed)
        if i % 4 == 2 and len(local):
            s1, s2 = a.sample_nstep(3, 2, 0.9, timeout=0), local.sample_nstep(3, 2, 0.9, timeout=0)
            assert s1.keys.tolist() == s2.keys.tolist()
        if i % 4 == 3:
            s = int(rng.integers(0, 4))
            try:
                r = local.end_episode(s)
            except rs.UnknownStream:
                with pytest.raises(rs.UnknownStream):
                    a.end_episode(s)
                continue
            assert a.end_episode(s) == r
        assert a.keys().tolist() == local.keys().tolist()
        _same_info((a, b), local, np.arange(next_id + 2))
    assert a.stats()["inserts"] == local.stats()["inserts"]
    b.close()
    a.close()


# -- writers in two processes, a reader in a third --------------------------------------------------
def calls(writer, n_calls, seed):
    """The ``extend_steps`` arguments writer ``writer`` issues (deterministic: the parent rebuilds them)."""
    rng = np.random.default_rng(seed + writer)
    out = []
    for j in range(n_calls):
        n = int(rng.integers(1, 7))
        ids = writer * 100_000 + j * 10 + np.arange(n)
        streams = rng.integers(0, 7, n)  # streams are table-wide: both writers use ids 0..5
        streams[streams == 6] += writer  # and one of its own (6 or 7), which it ends with end_episode
        term = rng.random(n) < 0.08
        trunc = rng.random(n) < 0.04
        out.append((te.steps(ids, rng.random(n)), streams, term, trunc))
    return out


def _write(name, directory, writer, n_calls, seed, queue):
    t = SharedTable.attach(name, directory=directory)
    firsts = []
    for j, (data, streams, term, trunc) in enumerate(calls(writer, n_calls, seed)):
        keys = t.extend_steps(data, streams, terminated=term, truncated=trunc)
        firsts.append((int(keys[0]), writer, j))
        if (streams == 6 + writer).any() and j % 3 == 0:  # (the other writer never writes this stream)
            t.end_episode(6 + writer)
            firsts.append((int(keys[-1]) + 0.5, writer, -7 - writer))  # after this call's rows
    queue.put(firsts)
    t.close()


def _read(name, directory, keys, queue):
    t = SharedTable.attach(name, directory=directory, seed=5)
    info = t.episode_info(keys)
    s = t.sample_sequences(64, 3, timeout=10)
    n = t.sample_nstep(64, 3, 0.9, timeout=10)
    queue.put((dataclasses.asdict(info), s.data["id"], s.mask, n.keys, n.data["id"]))
    t.close()


def _all_windows_are_one_episode(table, ids):
    """Every sampled window is consecutive steps of one episode of one stream."""
    keys = table.keys()
    data, _ = table.get(keys)
    key_of = dict(zip(data["id"].tolist(), keys.tolist()))
    for row in ids:
        info = table.episode_info([key_of[i] for i in row.tolist()])
        assert info.found.all() and len(set(info.episodes.tolist())) == 1
        assert (np.diff(info.positions) == 1).all()


@pytest.mark.parametrize("capacity", [60, 1000])  # evicting mid-run, and keeping everything
def test_two_writer_processes_match_an_in_process_table(tmp_path, capacity):
    name, seed, n_calls = f"w{capacity}", 11, 40
    ep = rs.Episodes(max_streams=8, next_obs_field="next_obs")
    t = SharedTable.create(name, capacity, SPEC, directory=tmp_path, episodes=ep, seed=0)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_write, args=(name, str(tmp_path), w, n_calls, seed, q)) for w in range(2)]
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs) and q.empty():  # this process's index follows as they write
        t.episode_info(t.keys()[-3:])
        time.sleep(0.002)
    order = sorted(q.get(timeout=120) + q.get(timeout=120))
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    # the same calls in the order the shared table took them (keys tell it), into an in-process table
    local = rs.Table(capacity, episodes=ep, seed=0, spec=SPEC)
    args = {w: calls(w, n_calls, seed) for w in range(2)}
    for first, w, j in order:
        if j < 0:
            local.end_episode(-1 - j)
            continue
        data, streams, term, trunc = args[w][j]
        assert local.extend_steps(data, streams, terminated=term, truncated=trunc)[0] == first
    keys = np.arange(local.stats()["inserts"] + 3)  # every key, some not live
    want = dataclasses.asdict(local.episode_info(keys))
    got = dataclasses.asdict(t.episode_info(keys))
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in want.items()}
    p = ctx.Process(target=_read, args=(name, str(tmp_path), keys, q))
    p.start()
    info, seq_ids, mask, nkeys, nids = q.get(timeout=60)
    p.join(30)
    assert {k: v.tolist() for k, v in info.items()} == {k: v.tolist() for k, v in want.items()}
    assert mask.all() and np.isin(nkeys, local.keys()).all()
    _all_windows_are_one_episode(t, seq_ids)
    assert t.stats()["samples"] == 128
    t.save(tmp_path / "ckpt")  # a checkpoint of the shared table loads as an in-process one
    loaded = dataclasses.asdict(rs.Table.load(tmp_path / "ckpt").episode_info(keys))
    assert {k: v.tolist() for k, v in loaded.items()} == {k: v.tolist() for k, v in want.items()}
    t.close()


def _spawned_writer(table, first):
    table.extend_steps(te.steps(np.arange(first, first + 6)), streams=[0, 1, 0, 1, 0, 1], terminated=[0, 0, 0, 0, 1, 0])
    table.end_episode(1)
    table.close()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_spawned_writer_attaches_by_pickle(tmp_path, method):
    t = make_shared(tmp_path, 20)
    t.extend_steps(te.steps([0, 1]), streams=[0, 1])
    p = mp.get_context(method).Process(target=_spawned_writer, args=(t, 10))
    p.start()
    p.join(120)
    assert p.exitcode == 0
    local = te.table(20)
    local.extend_steps(te.steps([0, 1]), streams=[0, 1])
    _spawned_writer(local, 10)
    got, want = dataclasses.asdict(t.episode_info(np.arange(9))), dataclasses.asdict(local.episode_info(np.arange(9)))
    assert all(np.array_equal(got[f], want[f]) for f in want)
    t.close()


# -- the distribution of strict sequence starts, drawn in another process ---------------------------
def _count_starts(name, directory, draws, queue):
    t = SharedTable.attach(name, directory=directory, seed=3)
    counts = np.zeros(40, dtype=np.int64)
    for _ in range(draws // 1000):
        counts += np.bincount(t.sample_sequences(1000, 4).data["id"][:, 0], minlength=40)
    queue.put(counts)
    t.close()


def test_sequence_starts_are_uniform_over_valid_starts_from_another_process(tmp_path):
    t = make_shared(tmp_path, 100)
    # stream 0: an episode of 10 (ids 0..9) ended, then 6 open steps (10..15); stream 1: 3 steps
    # (20..22, too short); stream 2: 12 steps (30..41 minus the ones past 39: ids 30..39)
    t.extend_steps(te.steps(np.arange(10)), streams=0, terminated=[0] * 9 + [1])
    t.extend_steps(te.steps(np.arange(20, 23)), streams=1)
    t.extend_steps(te.steps(np.arange(10, 16)), streams=0)
    t.extend_steps(te.steps(np.arange(30, 40)), streams=2)
    valid = list(range(0, 7)) + list(range(10, 13)) + list(range(30, 37))  # windows of 4 in one episode
    q = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=_count_starts, args=(t.shared_name, str(tmp_path), 34_000, q))
    p.start()
    counts = q.get(timeout=60)
    p.join(10)
    assert counts.sum() == 34_000 and set(np.flatnonzero(counts).tolist()) == set(valid)
    expected = 34_000 / len(valid)
    chi2 = ((counts[valid] - expected) ** 2 / expected).sum()
    assert chi2 < 45.3  # the 0.9999 quantile of chi-square with 16 degrees of freedom
    assert t.stats()["samples"] == 34_000
    t.close()


# -- a writer killed between writing its steps and publishing them ---------------------------------
@pytest.mark.parametrize(
    "call, full, ring",
    [
        ("extend_steps", False, True),
        ("extend_steps", True, True),
        ("end_episode", False, True),
        ("extend_steps", True, False),
        ("end_episode", False, False),
    ],
)
def test_writer_killed_mid_call_leaves_the_episodes_as_before(tmp_path, call, full, ring):
    """``ring=False``: the table left ring mode first (a delete out of order)."""
    cap = 12
    t = make_shared(tmp_path, cap)
    local = te.table(cap)  # the same steps in process; what the dead call must not change
    for tab in (t, local):
        tab.extend_steps(te.steps(np.arange(4)), streams=0)
        tab.extend_steps(te.steps(np.arange(10, 10 + (8 if full else 3))), streams=1)
        tab.end_episode(1)
        if not ring:  # a hole in stream 0, and a step of stream 3 in its place
            tab.delete([2])
            tab.extend_steps(te.steps([50]), streams=3)
    keys = np.arange(20)
    marker = tmp_path / "paused"
    code = {
        "extend_steps": """ids = np.arange(100, 105)
t.extend_steps({"obs": ids.astype(np.float32), "next_obs": ids.astype(np.float32) + 1,
                "reward": np.ones(5), "id": ids}, streams=[0, 0, 1, 2, 2], terminated=[0, 1, 0, 0, 0])""",
        "end_episode": "t.end_episode([0, 1])  # flags stream 0's last (published) step, closes its episode",
    }[call]
    proc = run_python(
        f"""
import numpy as np
from replaystore.shared import SharedTable
t = SharedTable.attach({t.shared_name!r}, directory={str(tmp_path)!r})
{code}
""",
        env={"REPLAYSTORE_SHM_TEST_HOOK": f"pause-before-publish:{marker}"},
        wait=False,
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    reader = SharedTable.attach(t.shared_name, directory=tmp_path)  # recovers, then builds its index
    assert t.recoveries() == 1
    after = dataclasses.asdict(reader.episode_info(keys))
    if full:  # the dead insert had overwritten the 5 oldest items: they are dropped, nothing else
        local.delete(local.keys()[:5])
    want = dataclasses.asdict(local.episode_info(keys))
    assert {f: after[f].tolist() for f in want} == {f: want[f].tolist() for f in want}
    assert int(after["found"].sum()) == 7
    for tab in (t, reader):  # both continue the streams from before the dead call
        info = tab.episode_info(tab.keys())
        assert info.closed[info.streams == 1].all() and not info.closed[info.streams == 0].any()
    k = t.extend_steps(te.steps([200, 201]), streams=[0, 2])
    info = reader.episode_info(k)
    assert info.stream_positions.tolist() == [4, 0] and info.positions.tolist() == [4, 0]
    a, b = dataclasses.asdict(t.episode_info(t.keys())), dataclasses.asdict(reader.episode_info(t.keys()))
    assert all(np.array_equal(a[f], b[f]) for f in a)
    reader.close()
    t.close()


# -- two processes against a plain model of streams and episodes (hypothesis) -----------------------
CAP = 8


class StreamsModel(RuleBasedStateMachine):
    """Steps written from this process or the worker; the model: streams, episodes, FIFO eviction."""

    conn = None
    directory = None

    @initialize()
    def start(self):
        self.name = f"model{next(_names)}"
        ep = rs.Episodes(max_streams=4, next_obs_field="next_obs")
        self.table = SharedTable.create(self.name, CAP, SPEC, directory=self.directory, episodes=ep, seed=3)
        self.conn.send(("attach", self.name, self.directory))
        assert self.conn.recv() == ("ok", None)
        self.steps = {}  # key -> [stream, t, episode, pos, ended]
        self.streams = {}  # stream -> [next_t, open episode or -1, next pos, key of its last step]
        self.next_key = self.next_episode = 0

    def teardown(self):
        if getattr(self, "table", None) is not None:
            self.table.close()

    def call(self, remote, method, *args, **kwargs):
        if not remote:
            try:
                return "ok", getattr(self.table, method)(*args, **kwargs)
            except rs.ReplayError as e:
                return "err", type(e).__name__
        self.conn.send(("call", method, args, kwargs))
        return self.conn.recv()

    @rule(
        remote=st.booleans(),
        rows=st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 0, 0, 1, 2])), min_size=1, max_size=10),
    )
    def extend_steps(self, remote, rows):
        streams = np.array([r[0] for r in rows])
        ends = np.array([r[1] for r in rows])
        ids = np.arange(self.next_key, self.next_key + len(rows))
        status, keys = self.call(remote, "extend_steps", te.steps(ids), streams, ends == 1, ends == 2)
        assert status == "ok" and keys.tolist() == ids.tolist()
        # new episode ids go in row order when the rows' streams are distinct, else by stream, then row
        order = np.arange(len(rows)) if len(set(streams.tolist())) == len(rows) else np.argsort(streams, kind="stable")
        for k, s, e in zip(ids[order].tolist(), streams[order].tolist(), ends[order].tolist()):
            nt, cur, pos, _ = self.streams.get(s, [0, -1, 0, -1])
            if cur < 0:
                cur, pos = self.next_episode, 0
                self.next_episode += 1
            self.steps[k] = [s, nt, cur, pos, e > 0]
            self.streams[s] = [nt + 1, -1 if e else cur, 0 if e else pos + 1, k]
        self.next_key += len(rows)
        while len(self.steps) > CAP:
            del self.steps[min(self.steps)]

    @rule(remote=st.booleans(), streams=st.lists(st.integers(0, 3), min_size=1, max_size=3))
    def end_episode(self, remote, streams):
        status, out = self.call(remote, "end_episode", streams)
        if any(s not in self.streams for s in streams):
            assert (status, out) == ("err", "UnknownStream")
            return
        closed = 0
        for s in set(streams):
            st_ = self.streams[s]
            if st_[1] >= 0:
                closed += 1
                if st_[3] in self.steps:
                    self.steps[st_[3]][4] = True
                st_[1], st_[2] = -1, 0
        assert (status, out) == ("ok", closed)

    @rule(remote=st.booleans(), m=st.integers(0, 3))
    def delete_oldest(self, remote, m):
        oldest = sorted(self.steps)[:m]
        assert self.call(remote, "delete", oldest) == ("ok", len(oldest))
        for k in oldest:
            del self.steps[k]

    @rule(remote=st.booleans(), picks=st.lists(st.integers(0, CAP - 1), max_size=3))
    def delete_any(self, remote, picks):  # (takes the table out of ring mode)
        live = sorted(self.steps)
        doomed = sorted({live[i] for i in picks if i < len(live)})
        assert self.call(remote, "delete", doomed) == ("ok", len(doomed))
        for k in doomed:
            del self.steps[k]

    @rule(remote=st.booleans())
    def sample_nstep(self, remote):
        status, out = self.call(remote, "sample_nstep", 4, 2, 0.5, timeout=0)
        if not self.steps:
            assert status == "err"
            return
        assert status == "ok" and all(k in self.steps for k in out.keys.tolist())

    @invariant()
    def agrees(self):
        if not hasattr(self, "steps"):
            return
        keys = np.arange(max(0, self.next_key - CAP - 2), self.next_key + 1)
        for remote in (False, True):
            status, info = self.call(remote, "episode_info", keys)
            assert status == "ok"
            model = [self.steps.get(k) for k in keys.tolist()]
            assert info.found.tolist() == [m is not None for m in model]
            live = [m for m in model if m is not None]
            f = info.found
            assert info.streams[f].tolist() == [m[0] for m in live]
            assert info.stream_positions[f].tolist() == [m[1] for m in live]
            assert info.episodes[f].tolist() == [m[2] for m in live]
            assert info.positions[f].tolist() == [m[3] for m in live]
            assert info.is_last[f].tolist() == [m[4] for m in live]
            assert info.closed[f].tolist() == [self.streams[m[0]][1] != m[2] for m in live]


def _model_worker(conn):
    table = None
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            break
        if msg[0] in ("attach", "detach"):
            if table is not None:
                table.close()
            table = SharedTable.attach(msg[1], directory=msg[2], seed=7) if msg[0] == "attach" else None
            conn.send(("ok", None))
            continue
        _, method, args, kwargs = msg
        try:
            conn.send(("ok", getattr(table, method)(*args, **kwargs)))
        except rs.ReplayError as e:
            conn.send(("err", type(e).__name__))
    if table is not None:
        table.close()


def test_two_processes_against_a_model_of_streams_and_episodes(tmp_path):
    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_model_worker, args=(there,), daemon=True)
    proc.start()
    try:
        StreamsModel.conn = here
        StreamsModel.directory = str(tmp_path)
        run = settings(max_examples=25, stateful_step_count=20, deadline=None)(StreamsModel).TestCase
        run("runTest").runTest()
        here.send(("detach",))
        assert here.recv() == ("ok", None)
    finally:
        here.send(("stop",))
        proc.join(10)
    assert list(tmp_path.iterdir()) == []
