"""A rollout buffer's journal: what an operation changed, staged and written in one transaction.

:class:`OnlineJournal` is the one LMDB journal (:class:`~replaystore.checkpoint.journal.LmdbJournal`)
with pickled records (the payloads are the producers' Python objects), each with a CRC32:

- ``s``           buffer state: version, counters, histograms, the budget's counters;
- ``p/<group>``   a pending group (members so far);
- ``c/<arrival>`` a complete group (members, order, times sampled), keys in arrival order;
- ``d/<group>``   a completed group remembered (its write status and fate), so a retry is answered;
- ``t/<id>``, ``tb/<batch>``, ``tc``  the budget's held tickets, open over-provisioning batches and
  recently cancelled ids.

:class:`BufferJournal` is a mixin of :class:`~replaystore.online.buffer.RolloutBuffer` (its methods
act on the buffer's own state, with its lock held). An operation stages the records it changed and
:meth:`~BufferJournal._commit` writes them with the buffer's scalars (``s``) in one transaction: a
write costs O(records changed), not O(state), whatever number of tickets or groups is held
(``bench/bench_online_journal.py``). A buffer built on the same journal resumes from it
(``_restore``). A damaged record, or a journal that does not hold a valid state, raises
:class:`~replaystore.CheckpointError`. Records are unpickled on load: the directory must be as
trusted as a checkpoint loaded with ``allow_pickle=True``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from ..checkpoint.journal import PICKLE, LmdbJournal, NullJournal, restoring
from ..errors import StorageError

if TYPE_CHECKING:
    from ..table import Table
    from .budget import StalenessBudget
    from .groups import Group
    from .measure import OnlineMetrics

REMEMBER_DONE = 4096  # completed groups remembered so that a retried write is answered, not duplicated


def done_order(rec: tuple) -> tuple:
    """Sort key of a journaled done record: its sequence number.

    Records written before they had one: numeric ids first, in numeric order (as they were admitted).
    """
    if len(rec) > 2:
        return (1, int(rec[2]))
    return (0, rec[0] if isinstance(rec[0], int) else -1)


class OnlineJournal(LmdbJournal):
    """Durable records of a :class:`~replaystore.online.RolloutBuffer` (see the module doc).

    An :class:`~replaystore.checkpoint.journal.LmdbJournal` with the pickle codec. Not thread-safe.

    Args:
        path: directory of the journal (created if missing).
        map_size: LMDB map size in bytes (the payloads of held groups must fit).

    Raises:
        CheckpointError: the directory holds a file LMDB cannot open (damaged or foreign).
    """

    def __init__(self, path: str, map_size: int = 1 << 34) -> None:
        super().__init__(path, PICKLE, map_size)


class BufferJournal:
    """Staging, commit and restart of a rollout buffer (mixed into ``RolloutBuffer``; lock held)."""

    if TYPE_CHECKING:
        name: str
        version: int
        counters: dict[str, int]
        metrics: OnlineMetrics
        budget: StalenessBudget | None
        table: Table
        journal: Any
        _next_order: int
        _next_arrival: int
        _pending: dict[Hashable, Group]
        _done: dict[Hashable, list]
        _done_seq: int
        _puts: dict[str, Any]
        _deletes: set[str]

        def _insert(self, g: Group, jkey: str) -> int: ...

    # -- journal ----------------------------------------------------------------------------------------
    def _state(self, budget: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "version": self.version,
            "counters": self.counters,
            "next_order": self._next_order,
            "next_arrival": self._next_arrival,
            "metrics": self.metrics.snapshot("total"),
            "budget": budget,
        }

    def _commit(self) -> None:
        """Write what the last operation changed, plus the state, in one journal transaction.

        If the write fails (a full disk), the changes stay staged and go out with the next
        successful commit; the error is raised as :class:`~replaystore.StorageError`. The operation
        itself has happened in memory (a restart before the next commit would not see it).
        """
        puts, deletes = self._puts, self._deletes
        self._puts, self._deletes = {}, set()
        if type(self.journal) is NullJournal:  # nothing kept: no state to build
            return
        budget = None
        if self.budget is not None:  # its scalars, and the records of the tickets that changed
            budget, bputs, bdeletes = self.budget.journal()
            for k in bdeletes:
                puts.pop(k, None)
                deletes.add(k)
            puts.update(bputs)
        puts.pop("s", None)
        try:
            self.journal.write({**puts, "s": self._state(budget)}, [d for d in deletes if d not in puts])
        except Exception as e:
            self._puts, self._deletes = puts, deletes  # staged again (the lock is held: nothing came since)
            if isinstance(e, StorageError):
                raise
            raise StorageError(
                f"rollout buffer {self.name!r}: journal write failed ({type(e).__name__}: {e})",
                path=getattr(self.journal, "path", None),
            ) from e

    def _stage(self, key: str, value: Any) -> None:
        self._puts[key] = value
        self._deletes.discard(key)

    def _unstage(self, key: str) -> None:
        self._puts.pop(key, None)
        self._deletes.add(key)

    def _mark_done(self, gid: Hashable, status: str | None = None, fate: str | None = None) -> None:
        """Remember a group's write status and fate (what happened to it), journaled, bounded."""
        rec = self._done.pop(gid, [None, None])
        if status is not None:
            rec[0] = status
        if fate is not None:
            rec[1] = fate
        self._done[gid] = rec
        self._done_seq += 1
        self._stage(f"d/{gid!r}", (gid, rec, self._done_seq))  # the sequence orders them on restart
        while len(self._done) > REMEMBER_DONE:
            old = next(iter(self._done))
            del self._done[old]
            self._unstage(f"d/{old!r}")

    # -- restart ------------------------------------------------------------------------------------------------------
    def _restore(self, saved: dict[str, Any]) -> None:
        if saved.get("s") is None:
            return
        with restoring(f"rollout buffer {self.name!r}: the journal"):
            self._restore_records(saved)

    def _restore_records(self, saved: dict[str, Any]) -> None:
        state = saved["s"]
        self.version = int(state["version"])
        self.counters.update(state["counters"])
        self.counters["restarts"] += 1
        self._next_order = int(state["next_order"])
        self._next_arrival = int(state["next_arrival"])
        for kind, hist in state["metrics"].items():
            self.metrics.total[kind].update(hist)
        if self.budget is not None and state["budget"] is not None:
            if state["budget"].get("records"):  # ticket records apart (O(1) writes)
                records = {k: v for k, v in saved.items() if k.startswith(("t/", "tb/")) or k == "tc"}
                self.budget.load_journal(state["budget"], records)
            else:  # a journal of the older format: every ticket in the state (rewritten as records)
                self.budget.load_state(state["budget"])
        self.table.set_version(self.version, reset=True)  # (restored)
        done = sorted((v for k, v in saved.items() if k.startswith("d/")), key=done_order)
        for v in done[: max(len(done) - REMEMBER_DONE, 0)]:
            self._unstage(f"d/{v[0]!r}")
        for v in done[-REMEMBER_DONE:]:
            self._done[v[0]] = list(v[1])
        self._done_seq = max((done_order(v)[1] for v in done), default=0)
        for k, v in sorted(saved.items()):
            if k.startswith("p/"):
                self._pending[v.group_id] = v
            elif k.startswith("c/"):
                if v.arrival < 0:  # a journal written before groups kept their arrival
                    v.arrival = int(k[2:])
                if self._insert(v, k) < 0:  # stale by the saved version: cannot happen with a consistent journal
                    self._unstage(k)
        self._puts.clear()
        if self._deletes:
            self._commit()


__all__ = ["REMEMBER_DONE", "BufferJournal", "OnlineJournal", "done_order"]
