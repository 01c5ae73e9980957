"""The online journal across restarts (issue 37 item 1, issue 36 item 4).

The memory of completed groups keeps the most recent ones after a restart; a journal write costs
the same whatever number of tickets is held; a damaged journal is a named error; a writer killed
mid-stream loses at most its unacknowledged write.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import replaystore as rs
from replaystore.online import OnlineJournal, RolloutBuffer

pytest.importorskip("lmdb")

REMEMBERED = 4096  # the documented memory of completed groups


def test_the_remembered_groups_are_the_most_recent_after_a_restart(tmp_path):
    def mk():
        return RolloutBuffer(capacity=8192, group_size=1, journal=OnlineJournal(str(tmp_path)))

    buf = mk()
    for i in range(REMEMBERED):
        buf.add_group(i, [i], versions=0, lengths=[1])
    buf.close()
    buf = mk()
    for i in range(REMEMBERED, REMEMBERED + 4):
        buf.add_group(i, [i], versions=0, lengths=[1])
    assert len(buf) == REMEMBERED + 4
    assert buf.add_group(10, [10], versions=0, lengths=[1]) == "complete"  # a retry, answered
    assert len(buf) == REMEMBERED + 4  # not stored twice
    assert buf.add_group(3, [3], versions=0, lengths=[1]) == "complete"  # forgotten: the oldest 4 (0-3)
    assert len(buf) == REMEMBERED + 5
    buf.close()


def test_a_paced_retry_of_a_remembered_group_answers_complete_after_a_restart(tmp_path):
    def mk():
        return RolloutBuffer(
            capacity=8192,
            batch_size=8192,
            max_staleness=0,
            group_size=1,
            journal=OnlineJournal(str(tmp_path)),
        )

    buf = mk()
    tickets = buf.acquire(REMEMBERED)
    for t in tickets:
        buf.add_group(t, [int(t)], versions=0, lengths=[1])
    buf.close()
    buf = mk()
    for t in buf.acquire(4):
        buf.add_group(t, [int(t)], versions=0, lengths=[1])
    assert buf.add_group(tickets[10], ["retry"], versions=0, lengths=[1]) == "complete"
    assert len(buf) == REMEMBERED + 4
    with pytest.raises(rs.UnknownTicket):  # the oldest four are forgotten: no longer answered
        buf.add_group(tickets[3], ["retry"], versions=0, lengths=[1])
    buf.close()


class SizingJournal(OnlineJournal):
    """Records the pickled size of every write."""

    def __init__(self, path):
        super().__init__(path)
        self.sizes = []

    def write(self, puts, deletes=()):
        import pickle

        self.sizes.append(len(pickle.dumps(puts, protocol=5)) + sum(len(d) for d in deletes))
        super().write(puts, deletes)


def paced(journal, **kw):
    kw.setdefault("ticket_ttl", 600)
    return RolloutBuffer(capacity=4096, batch_size=4096, max_staleness=0, group_size=1, journal=journal, **kw)


@pytest.mark.parametrize("held", [1, 2000])
def test_a_journal_write_does_not_grow_with_the_tickets_held(tmp_path, held):
    j = SizingJournal(str(tmp_path))
    buf = paced(j)
    buf.acquire(held)
    [t] = buf.acquire(1)
    j.sizes.clear()
    buf.add_group(t, [{"x": 1}], versions=0, lengths=[1])
    buf.renew([0])  # one ticket renewed: one record
    assert len(j.sizes) == 2 and max(j.sizes) < 3000, j.sizes  # 2000 tickets are ~100 kB
    buf.close()


def test_tickets_batches_and_cancellations_survive_restarts(tmp_path):
    clock = [1000.0]
    mk = lambda: paced(OnlineJournal(str(tmp_path)), clock=lambda: clock[0], ticket_ttl=50)  # noqa: E731
    buf = mk()
    a = buf.acquire(3, holder="p0")
    b = buf.acquire(2, overprovision=2, tokens=None)
    clock[0] += 30
    buf.renew(a[:1])
    buf.add_group(b[0], ["x"], versions=0, lengths=[1])
    buf.abandon([a[2]])
    buf.add_group(b[1], ["y"], versions=0, lengths=[1])  # the batch is full: b[2:] cancelled
    before = buf.budget.state()
    buf.close()
    buf = mk()
    after = buf.budget.state()
    assert after["tickets"] == before["tickets"] and after["batches"] == before["batches"]
    assert after["cancelled"] == before["cancelled"] and after["next_id"] == before["next_id"]
    assert after["accepted"] == before["accepted"] and after["counters"] == before["counters"]
    with pytest.raises(rs.TicketCancelled):
        buf.add_group(b[2], ["z"], versions=0, lengths=[1])
    clock[0] += 25  # a[1] (not renewed) expires; a[0] (renewed) does not
    assert buf.held(a[0]) and not buf.held(a[1])
    buf.close()
    buf = mk()
    assert buf.held(a[0]) and not buf.held(a[1])
    assert buf.stats()["budget"]["expired"] == 1
    buf.close()


def test_a_journal_of_the_older_format_is_read_and_rewritten(tmp_path):
    buf = paced(OnlineJournal(str(tmp_path)))
    tickets = buf.acquire(5)
    buf.add_group(tickets[0], ["x"], versions=0, lengths=[1])
    state = buf.budget.state()
    buf.close()
    j = OnlineJournal(str(tmp_path))  # the format before ticket records: every ticket in "s"
    saved = j.load()
    s = saved["s"]
    s["budget"] = state
    j.write({"s": s}, [k for k in saved if k.startswith(("t/", "tb/")) or k == "tc"])
    j.close()
    buf = paced(OnlineJournal(str(tmp_path)))
    assert [buf.held(t) for t in tickets] == [False, True, True, True, True]
    buf.add_group(tickets[1], ["y"], versions=0, lengths=[1])  # rewrites the tickets as records
    buf.close()
    buf = paced(OnlineJournal(str(tmp_path)))
    assert [buf.held(t) for t in tickets] == [False, False, True, True, True]
    buf.close()


@pytest.mark.parametrize(
    "key, value",
    [
        ("t/00000000000000000001", ["v", None, None, 1, 0.0, None]),  # a version that is not an int
        ("t/00000000000000000001", [0, None, None, 0, 0.0, None]),  # weight 0
        ("t/00000000000000000001", [0, None]),  # too short
        ("t/00000000000000099999", [0, None, None, 1, 0.0, None]),  # an id never granted
        ("tb/00000000000000000000", "x"),
        ("tc", ["a"]),
    ],
)
def test_a_tampered_ticket_record_is_a_checkpoint_error(tmp_path, key, value):
    buf = paced(OnlineJournal(str(tmp_path)))
    buf.acquire(3)
    buf.close()
    j = OnlineJournal(str(tmp_path))
    j.write({key: value})
    j.close()
    with pytest.raises(rs.CheckpointError):
        paced(OnlineJournal(str(tmp_path)))


WRITER = """
import sys
from replaystore.online import OnlineJournal, RolloutBuffer
buf = RolloutBuffer(capacity=1 << 20, batch_size=1 << 20, max_staleness=0, group_size=1,
                    journal=OnlineJournal(sys.argv[1]))
buf.acquire(500)  # tickets held all along
i = 0
while True:
    [t] = buf.acquire(1)
    buf.add_group(t, [b"x" * (i % 3000)], versions=0, lengths=[1])
    i += 1
    print(i, flush=True)  # acknowledged
"""


def test_a_writer_killed_mid_stream_loses_at_most_its_unacknowledged_write(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    acked = 0
    try:
        while acked < 300:
            line = p.stdout.readline()
            assert line, "the writer died"
            acked = int(line)
        os.kill(p.pid, signal.SIGKILL)
        for line in p.stdout:  # acknowledged before the kill landed
            acked = int(line)
    finally:
        p.kill()
        p.wait(30)
    buf = paced(OnlineJournal(str(tmp_path)), ticket_ttl=None)
    st = buf.stats()
    assert acked <= st["groups"] <= acked + 1
    assert st["budget"]["running"] in (500, 501)  # the next ticket may have been acquired
    buf.abandon([int(t) for t in buf.budget.state()["tickets"]])  # else the trainer waits for them
    assert [len(x) for x in buf.sample(st["groups"], timeout=30).data] == [i % 3000 for i in range(st["groups"])]
    buf.close()


def test_a_flipped_bit_in_a_record_is_a_checkpoint_error(tmp_path):
    buf = paced(OnlineJournal(str(tmp_path)))
    [t] = buf.acquire(1)
    buf.add_group(t, [b"payload-" * 8], versions=0, lengths=[1])
    buf.close()
    j = OnlineJournal(str(tmp_path))
    with j._env.begin(write=True) as txn:  # one bit of the group's payload, as a bad disk would
        key = next(k for k, _ in txn.cursor() if k.startswith(b"c/"))
        raw = bytearray(txn.get(key))
        raw[-20] ^= 4
        txn.put(key, bytes(raw))
    j.close()
    with pytest.raises(rs.CheckpointError, match="CRC"):
        paced(OnlineJournal(str(tmp_path)))


OPS = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "over", "renew", "add", "abandon", "cancel", "tick", "reopen"]), st.integers(0, 7)
    ),
    max_size=30,
)


@settings(max_examples=40, deadline=None)
@given(ops=OPS)
def test_the_journal_restores_the_budget_after_any_sequence(tmp_path_factory, ops):
    """Any sequence of ticket operations, reopened at random points: the reopened budget's full
    state equals the one the buffer had in memory (the model: no restart)."""
    path = str(tmp_path_factory.mktemp("j"))
    clock = [1000.0]

    def mk():
        return RolloutBuffer(
            capacity=64,
            batch_size=16,
            max_staleness=1,
            group_size=1,
            ticket_ttl=30,
            journal=OnlineJournal(path),
            clock=lambda: clock[0],
        )

    buf = mk()
    try:
        for op, n in ops:
            held = sorted(int(t) for t in buf.budget.state()["tickets"])
            try:
                if op == "acquire":
                    buf.try_acquire(n % 3 + 1)
                elif op == "over":
                    buf.try_acquire(1, overprovision=n % 2 + 1)
                elif op == "renew" and held:
                    clock[0] += 1  # a later deadline
                    buf.renew([held[n % len(held)]])
                elif op == "add" and held:
                    buf.add_group(held[n % len(held)], ["x"], versions=buf.version, lengths=[1])
                elif op == "abandon" and held:
                    buf.abandon([held[n % len(held)]])
                elif op == "cancel":
                    buf.cancel_slowest(n % 3)
                elif op == "tick":
                    clock[0] += 5 * n
                    buf.expire()
                elif op == "reopen":
                    before = buf.budget.state()
                    stats = {k: v for k, v in buf.stats().items() if k != "restarts"}
                    buf.close()
                    buf = mk()
                    assert buf.budget.state() == before
                    assert {k: v for k, v in buf.stats().items() if k != "restarts"} == stats
            except (rs.InvalidRequest, rs.UnknownTicket):
                pass
    finally:
        buf.close()


def test_done_records_of_the_older_format_are_ordered_by_their_numeric_ids(tmp_path):
    buf = RolloutBuffer(capacity=8192, group_size=1, journal=OnlineJournal(str(tmp_path)))
    for i in range(REMEMBERED):
        buf.add_group(i, [i], versions=0, lengths=[1])
    buf.close()
    j = OnlineJournal(str(tmp_path))  # as written before done records carried a sequence number
    j.write({k: v[:2] for k, v in j.load().items() if k.startswith("d/")})
    j.close()
    buf = RolloutBuffer(capacity=8192, group_size=1, journal=OnlineJournal(str(tmp_path)))
    for i in range(REMEMBERED, REMEMBERED + 4):
        buf.add_group(i, [i], versions=0, lengths=[1])
    assert buf.add_group(10, [10], versions=0, lengths=[1]) == "complete"
    assert len(buf) == REMEMBERED + 4  # 10 is remembered; 0-3 were forgotten
    buf.add_group(2, [2], versions=0, lengths=[1])
    assert len(buf) == REMEMBERED + 5
    buf.close()
