"""LoggedTable: a Table whose every acknowledged mutation is in a write-ahead log first.

One record per successful mutating call, appended under the Table's lock (so the log's order is
the order in which the calls changed the table): an insert's data as raw arrays (Python scalars
and lists flagged), its priorities and versions as given, the keys it got and, for removers other
than ``Fifo``, the keys it evicted; a step write's streams and end flags as the table took them;
the keys a sample counted (unless ``log_samples=False``); the arguments of ``update_priorities``,
``update_fields``, ``delete``, ``set_version``, ``clear`` and ``end_episode``.
:meth:`LoggedTable.open` replays the records after the table's ``Journal.wal_lsn`` (the last
record its checkpoint holds) through the table's journal view (``Journal``: ``locked``,
``wal_lsn``, ``keys_of_slots``, ``replay_insert``, ``replay_sample``, plus, for removers other
than ``Fifo``, a wrapper around this table's ``remover.victims`` that notes the keys it chose); a
record that does not fit the table (a sampled or evicted key that is not there, an insert whose
keys differ) raises :class:`~replaystore.errors.WalCorrupt`. What each record replays as, what is
restored exactly and what is not (the random stream, blocked time): docs/durability.md, "Durable
served tables". Object storages cannot be logged (their items would have to be pickled):
:meth:`~LoggedTable.open` refuses them.

Calls return ``(result, lsn)``; the caller acknowledges the result only after
``wait(lsn)``/``wait_async(lsn)`` (the plain-Python convenience method ``durable`` does both). A
call made while the log cannot write (full disk) raises :class:`~replaystore.errors.DiskFull`
before changing anything. A call whose record then fails to be written raises it from ``wait``:
that call was applied in memory but not acknowledged; its record stays queued and is written
when space returns (or is lost if the process dies first), never leaving a hole in the log.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import Closed, SpecError, Unsupported, WalCorrupt
from ..samplers import Fifo
from ..storage import ObjectStorage
from ..table import Table, contract
from ..table.journal import Journal
from .arrays import decode_data as _decode_data
from .arrays import encode_data as _encode_data
from .arrays import optional as _optional
from .arrays import request_arrays as _request_arrays
from .arrays import step_arrays as _step_arrays
from .log import Record, WalConfig, WriteAheadLog

OP_EXTEND, OP_ADD, OP_SAMPLE, OP_UPDATE, OP_DELETE, OP_SET_VERSION, OP_CLEAR = range(1, 8)
OP_STEPS, OP_STEP, OP_EPISODE, OP_END_EPISODE = range(8, 12)  # episode writes (episodic tables)
OP_FIELDS = 12  # update_fields: keys in the head, the fields as data arrays
#: the inserts by name (each a generated method, :func:`_logged_insert`)
_INSERTS = {
    "extend": OP_EXTEND,
    "add": OP_ADD,
    "extend_steps": OP_STEPS,
    "add_step": OP_STEP,
    "add_episode": OP_EPISODE,
}
#: the sampling calls, and whether each draws with the table's sampler (its replay moves the sampler's epoch)
_SAMPLES = {"sample": True, "sample_sequences": False, "sample_nstep": True, "sample_episodes": False}


class LoggedTable:
    """A :class:`~replaystore.Table` plus its :class:`~replaystore.wal.log.WriteAheadLog`.

    Build it with :meth:`open`. The calls the contract marks ``logged``
    (:data:`replaystore.table.contract.CALLS`) take the Table's arguments and return ``(result,
    lsn)`` (``lsn`` 0: nothing to wait for); they are thread-safe. Only this object may mutate the
    table. The calls that change nothing (``get``, ``info``, ``keys``, ``episode_info``, ...) are the
    table's own, generated from the contract.
    """

    MODE = "logged"

    def __init__(
        self, table: Table, wal: WriteAheadLog, log_samples: bool = True, max_log_bytes: int | None = None
    ) -> None:
        self.table = table
        self.journal = Journal(table)  # (the table as a log sees it: its lock, wal_lsn, replays)
        self.wal = wal
        self.log_samples = log_samples
        self.max_log_bytes = max_log_bytes
        self._victims: list[np.ndarray] | None = None  # keys evicted by the insert being logged
        self._closed = False
        if type(table.remover) is not Fifo:
            self._watch_evictions()

    @classmethod
    def open(cls, table: Table, path: str, config: WalConfig | None = None) -> "LoggedTable":
        """Replay the log in ``path`` onto ``table`` (see the module doc) and log from then on.

        Raises:
            WalCorrupt: the log is corrupted, or does not continue the table's state.
            SpecError: ``table`` has an object storage (not loggable).
        """
        if isinstance(table.storage, ObjectStorage):
            raise SpecError(f"table {table.name!r} stores Python objects: a write-ahead log needs a column storage")
        config = config or WalConfig(dir=os.path.dirname(path) or ".")
        done = Journal(table).wal_lsn  # (the last record the table holds: a checkpoint's)
        wal, records = WriteAheadLog.open(path, config.fsync, config.interval, config.retry_period, after=done)
        self = cls(table, wal, config.log_samples, config.max_log_bytes)
        try:
            for rec in records:
                self._replay(rec)
        except BaseException:
            wal.close()
            raise
        with self.journal.locked():
            self.journal.wal_lsn = wal.last_lsn
        return self

    def __len__(self) -> int:
        return len(self.table)

    def __contains__(self, key: Any) -> bool:
        return key in self.table

    def _check(self) -> None:
        """``Closed`` once :meth:`close` ran; the log's pending write error (``DiskFull``, ...)."""
        if self._closed:
            raise Closed(f"logged table {self.table.name!r} is closed (its write-ahead log {self.wal.path})")
        self.wal.check()

    # -- which keys an insert evicted, for removers that do not evict in key order ----------------------
    def _watch_evictions(self) -> None:
        remover = self.table.remover
        choose = remover.victims
        keys_of_slots = self.journal.keys_of_slots

        def victims(n: int) -> np.ndarray:
            slots = choose(n)
            if self._victims is not None:  # a logged insert (not a replay, which names its victims)
                self._victims.append(keys_of_slots(slots))
            return slots

        remover.victims = victims  # an instance attribute: this table's remover only

    def _taken_victims(self) -> dict[str, np.ndarray]:
        v, self._victims = self._victims, None
        if not v:
            return {}
        return {"victims": v[0] if len(v) == 1 else np.concatenate(v)}

    # -- logged mutations (lsn returned; wait before acknowledging) ----------------------------------
    def _append(
        self,
        op: int,
        meta: dict | None = None,
        head: dict | None = None,
        data: dict | None = None,
        flags: dict | None = None,
    ) -> int:
        lsn = self.wal.append(op, meta, head, data, flags)
        self.journal.wal_lsn = lsn
        return lsn

    def _insert(
        self, op: int, call: Callable[[Any], Any], data: Any, head: dict[str, Any], meta: dict | None = None
    ) -> tuple[Any, int]:
        """Apply ``call(data for the table)`` and log it as ``op`` with the keys it returned."""
        arrays, flags, applied = _encode_data(data)
        self._check()
        with self.journal.locked():
            self._victims = []
            try:
                result = call(applied)
            finally:
                head.update(self._taken_victims())
            head["keys"] = np.atleast_1d(np.asarray(result, dtype=np.int64))
            lsn = self._append(op, meta, head, arrays, flags)
        return result, lsn

    def end_episode(self, streams: Any, truncated: bool = False) -> tuple[int, int]:
        """:meth:`Table.end_episode`, logged: ``(closed, lsn)``."""
        self._check()
        with self.journal.locked():
            n = self.table.end_episode(streams, truncated)
            lsn = self._append(
                OP_END_EPISODE,
                {"truncated": bool(truncated)},
                {"streams": np.atleast_1d(np.asarray(streams, dtype=np.int64))},
            )
        return n, lsn

    def _call(self, op: int, call: Callable[[], Any], meta: dict | None = None, head: dict | None = None, *data: Any):
        self._check()
        with self.journal.locked():
            return call(), self._append(op, meta, head, *data)

    def update_priorities(self, keys: Any, priorities: Any) -> tuple[int, int]:
        """:meth:`Table.update_priorities`, logged: ``(applied, lsn)``."""
        k = np.atleast_1d(np.asarray(keys, dtype=np.int64))
        p = np.asarray(priorities, dtype=np.float64)
        return self._call(OP_UPDATE, lambda: self.table.update_priorities(k, p), None, {"keys": k, "priorities": p})

    def update_fields(self, keys: Any, data: Any) -> tuple[int, int]:
        """:meth:`Table.update_fields`, logged (the fields as raw arrays): ``(rewritten, lsn)``."""
        k = np.atleast_1d(np.asarray(keys, dtype=np.int64))
        arrays, flags, applied = _encode_data(data)
        return self._call(OP_FIELDS, lambda: self.table.update_fields(k, applied), None, {"keys": k}, arrays, flags)

    def delete(self, keys: Any) -> tuple[int, int]:
        """:meth:`Table.delete`, logged: ``(deleted, lsn)``."""
        k = np.atleast_1d(np.asarray(keys, dtype=np.int64))
        return self._call(OP_DELETE, lambda: self.table.delete(k), None, {"keys": k})

    def set_version(self, version: int, reset: bool = False) -> tuple[int, int]:
        """:meth:`Table.set_version`, logged (with ``reset``, so a replay may go down too): ``(dropped, lsn)``."""
        v, r = int(version), bool(reset)
        return self._call(OP_SET_VERSION, lambda: self.table.set_version(v, reset=r), {"version": v, "reset": r})

    def clear(self) -> tuple[None, int]:
        """:meth:`Table.clear`, logged: ``(None, lsn)``."""
        return self._call(OP_CLEAR, self.table.clear)

    # -- waiting, checkpoints, closing ---------------------------------------------------------------------
    def wait(self, lsn: int, timeout: float | None = None) -> None:
        """Block until record ``lsn`` is acknowledged (``DiskFull``/``OSError`` if its write failed)."""
        if lsn:
            self.wal.wait(lsn, timeout)

    async def wait_async(self, lsn: int) -> None:
        """:meth:`wait` without blocking an event loop."""
        if lsn:
            await self.wal.wait_async(lsn)

    def durable(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call a logged ``method`` and wait until it is acknowledged; return its result."""
        result, lsn = getattr(self, method)(*args, **kwargs)
        self.wait(lsn)
        return result

    def needs_checkpoint(self) -> bool:
        """Whether the log grew past ``max_log_bytes`` (a checkpoint would truncate it)."""
        return self.max_log_bytes is not None and self.wal.nbytes > self.max_log_bytes

    def save(self, path: str) -> None:
        """Checkpoint the table to ``path``, then delete the log segments the checkpoint covers.

        The log is rotated before the snapshot, so the segments before the rotation hold only
        records the checkpoint includes; records in the new segment that the snapshot also
        includes are skipped at replay (by ``wal_lsn``).
        """
        rotated_at = self.wal.rotate(timeout=60.0)
        self.table.save(path)
        self.wal.drop_through(rotated_at)

    def stats(self) -> dict[str, Any]:
        """The log's counters.

        ``records``, ``groups``, ``fsyncs``, ``bytes`` (written), ``write_errors``, plus ``log_bytes``
        (on disk), ``last_lsn``, ``durable_lsn`` and ``failing`` (0/1).
        """
        out = dict(self.wal.stats)
        out.update(
            log_bytes=self.wal.nbytes,
            last_lsn=self.wal.last_lsn,
            durable_lsn=self.wal.durable_lsn,
            failing=int(self.wal.error is not None),
        )
        return out

    def close(self) -> None:
        """Write what is queued and close the log (the table stays as it is); later calls raise ``Closed``."""
        self._closed = True
        self.wal.close()

    # -- replay ---------------------------------------------------------------------------------------------
    def _replay(self, rec: Record) -> None:
        t, j = self.table, self.journal
        where = f"{self.wal.path}: record {rec.lsn}"
        head = rec.head
        try:
            with j.locked():
                if rec.op in _INSERTS.values():
                    self._replay_insert(rec, where)
                elif rec.op == OP_SAMPLE:
                    j.replay_sample(head["keys"], rec.meta.get("draws"), sampler=bool(rec.meta.get("sampler", True)))
                elif rec.op == OP_UPDATE:
                    t.update_priorities(head["keys"], head["priorities"])
                elif rec.op == OP_DELETE:
                    t.delete(head["keys"])
                elif rec.op == OP_FIELDS:
                    t.update_fields(head["keys"], _decode_data(rec))
                elif rec.op == OP_SET_VERSION:
                    t.set_version(int(rec.meta["version"]), reset=bool(rec.meta.get("reset", False)))
                elif rec.op == OP_CLEAR:
                    t.clear()
                elif rec.op == OP_END_EPISODE:
                    t.end_episode(head["streams"], bool(rec.meta["truncated"]))
                else:
                    raise WalCorrupt(f"{where}: unknown operation {rec.op}")
                j.wal_lsn = rec.lsn
        except WalCorrupt:
            raise
        except (KeyError, TypeError, ValueError) as e:  # ReplayErrors are ValueErrors/KeyErrors too
            raise WalCorrupt(f"{where} does not apply to the table: {type(e).__name__}: {e}") from None

    def _replay_insert(self, rec: Record, where: str) -> None:
        head = rec.head
        data = _decode_data(rec)
        want = np.atleast_1d(head["keys"]).astype(np.int64)
        steps = None
        if rec.op in (OP_STEPS, OP_STEP):
            steps = {k: _optional(head, k) for k in ("streams", "terminated", "truncated")}
        elif rec.op == OP_EPISODE:
            n = len(want)
            term, trunc = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
            term[-1], trunc[-1] = bool(rec.meta["terminated"]), bool(rec.meta["truncated"])
            steps = {"streams": _optional(head, "streams"), "terminated": term, "truncated": trunc, "new_episode": True}
        got = self.journal.replay_insert(
            data,
            _optional(head, "priorities"),
            _optional(head, "version"),
            evict_keys=head.get("victims"),
            batched=rec.op not in (OP_ADD, OP_STEP),
            steps=steps,
        )
        if not np.array_equal(np.atleast_1d(got), want):
            raise WalCorrupt(
                f"{where}: replayed insert got keys {np.atleast_1d(got)[:4].tolist()}..., the log says "
                f"{want[:4].tolist()}...: the log does not continue this table"
            )


def _read(call: contract.Call) -> Callable:
    """``LoggedTable.<call>`` for a call that changes nothing: the table's own (no record, no lsn)."""

    def method(self: LoggedTable, *args: Any, **kwargs: Any) -> Any:
        if call.mutating:  # a mutation the log cannot record would make replays diverge
            raise Unsupported(f"{call.name}() is not logged yet: a logged table refuses it")
        return getattr(self.table, call.name)(*args, **kwargs)

    return contract.forwarded(call, method, LoggedTable)


def _logged_insert(name: str, op: int) -> Callable:
    """``LoggedTable.<name>`` for an insert, logged: ``(keys, lsn)``, with the Table method's signature.

    The record's head holds the priorities and versions as given, and for a step write the rows'
    streams and flags as the table took them (``add_episode``: the stream it chose, ``stream=None``
    too, and the last step's flags in the record's meta). ``DiskFull`` before any change if the
    log is failing.
    """
    call = contract.CALLS[name]
    first, *rest = list(call.signature().parameters)[1:]  # the item, batch or steps, then the options
    prio, stream = (next((p for p in rest if p.startswith(s)), None) for s in ("priorit", "stream"))

    def method(self: LoggedTable, *args: Any, **kwargs: Any) -> tuple[Any, int]:
        a = contract.bind(call, args, kwargs)
        data = a.pop(first)
        head = _request_arrays(a[prio], a["version"])
        write = getattr(self.table, name)
        if stream is None:
            return self._insert(op, lambda d: write(d, **a), data, head)
        meta: dict[str, Any] = {}

        def run(d: Any) -> Any:
            keys = write(d, **a)
            if op != OP_EPISODE:
                head.update(_step_arrays(a[stream], a["terminated"], a["truncated"]))  # valid: the table took them
                return keys
            chosen = a[stream]
            if chosen is None and (keys >= 0).any():  # the fresh stream it took (deterministic; logged anyway)
                chosen = int(self.table.episode_info(keys[keys >= 0][:1]).streams[0])
            if chosen is not None:
                head["streams"] = np.asarray(chosen, dtype=np.int64)
            meta.update(terminated=bool(a["terminated"]), truncated=bool(a["truncated"]))
            return keys

        return self._insert(op, run, data, head, meta if op == OP_EPISODE else None)

    out = contract.forwarded(call, method, LoggedTable, call.signature().replace(return_annotation="tuple[Any, int]"))
    out.__doc__ = f":meth:`Table.{name}`, logged: ``(keys, lsn)``."
    return out


def _logged_sample(name: str, sampler: bool) -> Callable:
    """``LoggedTable.<name>`` for a sampling call (NumPy data), logged unless ``log_samples`` is off.

    The record holds the keys the call counted (``sample_episodes``: every step's, and the number
    of episodes drawn) and ``sampler`` (see :data:`_SAMPLES`).
    """
    call = contract.CALLS[name]
    episodes = name == "sample_episodes"

    def method(self: LoggedTable, *args: Any, **kwargs: Any) -> tuple[Any, int]:
        self._check()
        run = getattr(self.table, name)
        if not self.log_samples:
            return run(*args, **kwargs), 0
        with self.journal.locked():
            s = run(*args, **kwargs)
            keys, meta = (np.concatenate(s.keys), {"draws": len(s)}) if episodes else (s.keys, {})
            lsn = self._append(OP_SAMPLE, {"sampler": sampler, **meta}, {"keys": np.ascontiguousarray(keys, np.int64)})
        return s, lsn

    sig = call.signature()
    params = [p for n, p in sig.parameters.items() if n not in call.local]
    out = contract.forwarded(
        call, method, LoggedTable, sig.replace(parameters=params, return_annotation="tuple[Any, int]")
    )
    out.__doc__ = f":meth:`Table.{name}` (NumPy data), logged unless ``log_samples`` is off: ``(sample, lsn)``."
    return out


for _name, _op in _INSERTS.items():
    setattr(LoggedTable, _name, _logged_insert(_name, _op))
for _name, _sampler in _SAMPLES.items():
    setattr(LoggedTable, _name, _logged_sample(_name, _sampler))
del _name, _op, _sampler
contract.install(LoggedTable, _read)
