"""The online journal across restarts (issue 37 item 1, issue 36 item 4).

The memory of completed groups keeps the most recent ones after a restart; a journal write costs
the same whatever number of tickets is held; a damaged journal is a named error; a writer killed
mid-stream loses at most its unacknowledged write.
"""

import pytest

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
