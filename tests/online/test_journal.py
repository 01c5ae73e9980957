"""RolloutBuffer persistence: a buffer reopened on its journal resumes groups, tickets and counters."""

import pytest

import replaystore as rs
from replaystore.online import OnlineJournal, RolloutBufferConfig

pytest.importorskip("lmdb")


def cfg(path, **kw):
    kw.setdefault("capacity", 32)
    return RolloutBufferConfig(batch_size=2, max_staleness=1, group_size=2, ticket_ttl=60, path=str(path), **kw)


def test_reopened_buffer_resumes_everything(tmp_path):
    buf = cfg(tmp_path).build("r")
    a, b, c = buf.acquire(3)
    buf.add("a0", group=a, versions=(0, 0), length=3)
    buf.add("b0", group=b)
    buf.add("b1", group=b, versions=(0, 1))  # b complete
    buf.add("c0", group=c)
    buf.add("c1", group=c)  # c complete
    assert buf.sample(1).group_ids == [b]
    buf.set_version(1)
    before = buf.stats()
    buf.close()

    again = cfg(tmp_path).build("r")
    after = again.stats()
    assert after["restarts"] == 1
    for k in (
        "version",
        "groups",
        "rollouts",
        "pending_groups",
        "pending_rollouts",
        "groups_sampled",
        "generated_by_length",
        "trained_staleness",
    ):
        assert after[k] == before[k], k
    assert after["budget"]["running"] == 1 and after["budget"]["accepted"] == before["budget"]["accepted"]
    with pytest.raises(rs.UnknownTicket):
        again.add("x", group=b)  # finished before the restart
    assert again.add("a1", group=a) == "complete"  # the held ticket still works
    assert sorted(again.sample(2).group_ids) == [a, c]
    assert again.acquire(1) == [3]  # ticket ids continue
    again.close()


def test_clear_on_start_and_damaged_journal(tmp_path):
    buf = cfg(tmp_path, clear_on_start=True).build("r")
    buf.add("x", group=buf.acquire(1)[0])
    buf.close()
    fresh = cfg(tmp_path, clear_on_start=True).build("r", resume=False)
    assert fresh.stats()["pending_groups"] == 0 and fresh.stats()["restarts"] == 0
    fresh.close()
    j = OnlineJournal(str(tmp_path))
    with j._env.begin(write=True) as txn:  # tamper
        txn.put(b"s", b"not a pickle")
    j.close()
    with pytest.raises(rs.CheckpointError):
        cfg(tmp_path).build("r")
    j = OnlineJournal(str(tmp_path))
    j.write({"s": {"version": "x"}})  # readable, but not a state
    j.close()
    with pytest.raises(rs.CheckpointError):
        cfg(tmp_path).build("r")


class FlakyJournal(OnlineJournal):
    """Fails the next ``fail`` writes, as a full disk would."""

    fail = 0

    def write(self, puts, deletes=()):
        if self.fail:
            self.fail -= 1
            raise OSError(28, "No space left on device")
        super().write(puts, deletes)


def test_a_failed_journal_write_is_caught_up_by_the_next_one(tmp_path):
    from replaystore.online import RolloutBuffer

    j = FlakyJournal(str(tmp_path))
    buf = RolloutBuffer(8, batch_size=2, max_staleness=1, journal=j)
    [t] = buf.acquire(1)
    j.fail = 1
    with pytest.raises(rs.StorageError):
        buf.add("lost?", group=t)
    [t2] = buf.acquire(1)  # this commit carries the previous operation's records too
    buf.close()
    again = RolloutBuffer(8, batch_size=2, max_staleness=1, journal=OnlineJournal(str(tmp_path)))
    assert again.stats()["groups"] == 1 and again.sample(1).data == ["lost?"]
    assert again.budget.held(t2)
    again.close()
