"""LoggedTable: a Table whose every acknowledged mutation is in a write-ahead log first.

What is logged (one record per successful call, appended under the Table's lock, so the log's
order is the order in which the calls changed the table):

- ``extend`` / ``add``: the data exactly as the table received it (each leaf as raw array bytes;
  Python scalars and lists flagged so that they are converted again the same way), the
  priorities and versions as given, the keys returned, and, for removers other than ``Fifo``, the
  keys of the items the insert evicted (``Uniform`` and the heaps choose them with randomness or
  ties that a rebuilt table would not reproduce);
- ``sample`` (unless ``log_samples=False``): the keys returned, in order. Replaying it applies
  what a sample changes: ``times_sampled``, retirement at ``max_times_sampled``, the
  ``WithoutReplacement`` epoch, the rate limiter's and the table's sample counters;
- ``update_priorities``, ``delete``, ``set_version``, ``clear``: their arguments (replayed through
  the same Table methods, which are deterministic).

Replay (:meth:`LoggedTable.open`) starts from the table it is given (a loaded checkpoint, or a new
one), skips records the checkpoint already holds (the table's ``stats()["wal_lsn"]`` counter is the
number of the last record applied, saved inside each checkpoint), and applies the rest. Inserts
replay without the rate limiter (they were admitted when they happened) and are checked against
the keys they got then; a record that does not fit the table (a sampled or evicted key that is
not there) raises :class:`~replaystore.errors.WalCorrupt`.

Exactly restored: keys, payloads, priorities, versions, ``times_sampled``, the model version,
``max_priority``, every counter in ``stats()``, the rate limiter's counts, the sampler's and
remover's membership, the ``WithoutReplacement`` epoch. Not restored exactly: the random
generator's stream (samples are replayed from their keys, not re-drawn, so samples after a
restart are not the samples the original table would have drawn next), time spent blocked
(``insert_blocked_s``/``sample_blocked_s``), and the internal order of the selectors (which the
checkpoint does not keep either). Object storages cannot be logged (their items would have to be
pickled) and neither can tables with episode structure (``episodes=``: their steps, streams and
episode boundaries are not recorded yet): :meth:`open` refuses both.

Calls return ``(result, lsn)``; the caller acknowledges the result only after
``wait(lsn)``/``wait_async(lsn)`` (the plain-Python convenience methods ``*_durable`` do both). A
call made while the log cannot write (full disk) raises :class:`~replaystore.errors.DiskFull`
before changing anything. A call whose record then fails to be written raises it from ``wait``:
that call was applied in memory but not acknowledged; its record stays queued and is written
when space returns (or is lost if the process dies first), never leaving a hole in the log.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import InvalidArgument, SpecError, WalCorrupt
from ..items import Sample
from ..samplers import Fifo, WithoutReplacement
from ..storage import ObjectStorage
from ..storage.spec import flatten, unflatten
from ..table import Table
from .wal import Record, WalConfig, WriteAheadLog, check_arrays

OP_EXTEND, OP_ADD, OP_SAMPLE, OP_UPDATE, OP_DELETE, OP_SET_VERSION, OP_CLEAR = range(1, 8)
LSN_COUNTER = "wal_lsn"
_LOOSE = (bool, int, float, complex, list, tuple)  # what a column storage converts leniently


def _encode_data(data: Any) -> tuple[dict[str, np.ndarray], dict[str, int], Any]:
    """``(arrays, flags, data for the table)``: every leaf as an array; the table gets these arrays.

    Flag 1: the leaf was a Python scalar or list, which the table converts leniently (and replay
    passes it back as a list).
    """
    if not isinstance(data, Mapping):
        raise SpecError(f"a logged table takes a dict of arrays, got {type(data).__name__}")
    flat = flatten(data)
    arrays: dict[str, np.ndarray] = {}
    flags: dict[str, int] = {}
    applied: dict[str, Any] = {}
    for path, leaf in flat.items():
        loose = isinstance(leaf, _LOOSE)
        try:
            arr = leaf if isinstance(leaf, np.ndarray) else np.asarray(leaf)
        except ValueError as e:
            raise SpecError(f"field {path!r}: cannot convert to an array ({e})") from None
        arrays[path] = arr
        flags[path] = int(loose)
        applied[path] = leaf if loose else arr
    try:
        check_arrays(arrays)
    except TypeError as e:
        raise SpecError(str(e)) from None
    return arrays, flags, unflatten(applied)


def _decode_data(rec: Record, names: list[str]) -> Any:
    flat = {}
    for name in names:
        arr = rec.arrays[name]
        flat[name] = arr.tolist() if rec.flags.get(name) else arr
    return unflatten(flat)


def _optional(rec: Record, name: str) -> Any:
    if name in rec.arrays:
        a = rec.arrays[name]
        return a.item() if a.ndim == 0 else a
    return rec.meta.get(name)


class LoggedTable:
    """A :class:`~replaystore.Table` plus its :class:`~replaystore.ray.wal.WriteAheadLog`.

    Build it with :meth:`open`. The mutating methods (``extend``, ``add``, ``sample``,
    ``update_priorities``, ``delete``, ``set_version``, ``clear``) take the Table's arguments and
    return ``(result, lsn)`` (``lsn`` 0: nothing to wait for); they are thread-safe. Reads go to
    :attr:`table` directly. Only this object may mutate the table.
    """

    def __init__(self, table: Table, wal: WriteAheadLog, log_samples: bool = True,
                 max_log_bytes: int | None = None) -> None:
        self.table = table
        self.wal = wal
        self.log_samples = log_samples
        self.max_log_bytes = max_log_bytes
        self._victims: list[np.ndarray] = []
        self._forced: np.ndarray | None = None
        if type(table.remover) is not Fifo:
            self._hook_remover()

    @classmethod
    def open(cls, table: Table, path: str, config: WalConfig | None = None) -> "LoggedTable":
        """Replay the log in ``path`` onto ``table`` (see the module doc) and log from then on.

        Raises:
            WalCorrupt: the log is corrupted, or does not continue the table's state.
            SpecError: ``table`` has an object storage (not loggable).
        """
        if isinstance(table.storage, ObjectStorage):
            raise SpecError(f"table {table.name!r} stores Python objects: a write-ahead log needs a column storage")
        if getattr(table, "episodic", False):
            raise InvalidArgument(f"table {table.name!r} has episode structure (episodes=), which the write-ahead "
                                  "log does not record yet: serve it without wal=")
        config = config or WalConfig(dir=os.path.dirname(path) or ".")
        after = int(table._counters.get(LSN_COUNTER, 0))
        wal, records = WriteAheadLog.open(path, config.fsync, config.interval, config.retry_period, after=after)
        self = cls(table, wal, config.log_samples, config.max_log_bytes)
        try:
            for rec in records:
                self._replay(rec)
        except BaseException:
            wal.close()
            raise
        table._counters[LSN_COUNTER] = wal.last_lsn
        return self

    # -- eviction record/replay for removers that do not evict in key order -------------------------
    def _hook_remover(self) -> None:
        remover = self.table.remover
        choose = remover.victims
        key_of_slot = self.table._index.key_of_slot

        def victims(n: int) -> np.ndarray:
            forced = self._forced
            if forced is None:
                slots = choose(n)
            elif len(forced) != n:
                raise WalCorrupt(f"replay: the log evicted {len(forced)} items here, the table wants {n}")
            else:
                slots = forced
            self._victims.append(key_of_slot[slots].copy())
            return slots

        remover.victims = victims  # an instance attribute: this table's remover only

    def _taken_victims(self) -> dict[str, np.ndarray]:
        if not self._victims:
            return {}
        v = self._victims[0] if len(self._victims) == 1 else np.concatenate(self._victims)
        self._victims = []
        return {"victims": v}

    # -- logged mutations (lsn returned; wait before acknowledging) ----------------------------------
    def _append(self, op: int, meta: dict | None = None, head: dict | None = None, data: dict | None = None,
                flags: dict | None = None) -> int:
        lsn = self.wal.append(op, meta, head, data, flags)
        self.table._counters[LSN_COUNTER] = lsn
        return lsn

    def extend(self, data: Any, priorities: Any = None, version: Any = None,
               timeout: float | None = None) -> tuple[np.ndarray, int]:
        """:meth:`Table.extend`, logged: ``(keys, lsn)``. ``DiskFull`` before any change if the log is failing."""
        arrays, flags, applied = _encode_data(data)
        head = _request_arrays(priorities, version)
        self.wal.check()
        t = self.table
        with t._lock:
            self._victims = []
            keys = t.extend(applied, priorities, version, timeout=timeout)
            head["keys"] = keys
            head.update(self._taken_victims())
            lsn = self._append(OP_EXTEND, None, head, arrays, flags)
        return keys, lsn

    def add(self, item: Any, priority: float | None = None, version: int | None = None,
            timeout: float | None = None) -> tuple[int, int]:
        """:meth:`Table.add`, logged: ``(key, lsn)``."""
        arrays, flags, applied = _encode_data(item)
        head = _request_arrays(priority, version)
        self.wal.check()
        t = self.table
        with t._lock:
            self._victims = []
            key = t.add(applied, priority, version, timeout=timeout)
            head["keys"] = np.asarray(key, dtype=np.int64)
            head.update(self._taken_victims())
            lsn = self._append(OP_ADD, None, head, arrays, flags)
        return key, lsn

    def sample(self, batch_size: int, timeout: float | None = None) -> tuple[Sample, int]:
        """:meth:`Table.sample` (NumPy data), logged unless ``log_samples`` is off: ``(sample, lsn)``."""
        t = self.table
        if not self.log_samples:
            return t.sample(batch_size, timeout=timeout), 0
        self.wal.check()
        with t._lock:
            s = t.sample(batch_size, timeout=timeout)
            lsn = self._append(OP_SAMPLE, None, {"keys": np.ascontiguousarray(s.keys)})
        return s, lsn

    def update_priorities(self, keys: Any, priorities: Any) -> tuple[int, int]:
        """:meth:`Table.update_priorities`, logged: ``(applied, lsn)``."""
        k = np.atleast_1d(np.asarray(keys, dtype=np.int64))
        p = np.asarray(priorities, dtype=np.float64)
        self.wal.check()
        t = self.table
        with t._lock:
            n = t.update_priorities(k, p)
            lsn = self._append(OP_UPDATE, None, {"keys": k, "priorities": p})
        return n, lsn

    def delete(self, keys: Any) -> tuple[int, int]:
        """:meth:`Table.delete`, logged: ``(deleted, lsn)``."""
        k = np.atleast_1d(np.asarray(keys, dtype=np.int64))
        self.wal.check()
        t = self.table
        with t._lock:
            n = t.delete(k)
            lsn = self._append(OP_DELETE, None, {"keys": k})
        return n, lsn

    def set_version(self, version: int) -> tuple[int, int]:
        """:meth:`Table.set_version`, logged: ``(dropped, lsn)``."""
        v = int(version)
        self.wal.check()
        t = self.table
        with t._lock:
            n = t.set_version(v)
            lsn = self._append(OP_SET_VERSION, {"version": v})
        return n, lsn

    def clear(self) -> tuple[None, int]:
        """:meth:`Table.clear`, logged: ``(None, lsn)``."""
        self.wal.check()
        t = self.table
        with t._lock:
            t.clear()
            lsn = self._append(OP_CLEAR)
        return None, lsn

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
        out.update(log_bytes=self.wal.nbytes, last_lsn=self.wal.last_lsn, durable_lsn=self.wal.durable_lsn,
                   failing=int(self.wal.error is not None))
        return out

    def close(self) -> None:
        """Write what is queued and close the log (the table stays as it is)."""
        self.wal.close()

    # -- replay ---------------------------------------------------------------------------------------------
    def _replay(self, rec: Record) -> None:
        t = self.table
        where = f"{self.wal.path}: record {rec.lsn}"
        try:
            with t._cond:
                t._flush_pending()
                if rec.op in (OP_EXTEND, OP_ADD):
                    self._replay_insert(rec, where)
                elif rec.op == OP_SAMPLE:
                    self._replay_sample(rec.arrays["keys"], where)
                elif rec.op == OP_UPDATE:
                    t.update_priorities(rec.arrays["keys"], rec.arrays["priorities"])
                elif rec.op == OP_DELETE:
                    t.delete(rec.arrays["keys"])
                elif rec.op == OP_SET_VERSION:
                    t.set_version(int(rec.meta["version"]))
                elif rec.op == OP_CLEAR:
                    t.clear()
                else:
                    raise WalCorrupt(f"{where}: unknown operation {rec.op}")
                t._counters[LSN_COUNTER] = rec.lsn
        except WalCorrupt:
            raise
        except (KeyError, TypeError, ValueError) as e:  # ReplayErrors are ValueErrors/KeyErrors too
            raise WalCorrupt(f"{where} does not apply to the table: {type(e).__name__}: {e}") from None

    def _replay_insert(self, rec: Record, where: str) -> None:
        t = self.table
        names = [d for d in rec.arrays if d not in ("keys", "victims", "priorities", "version")]
        data = _decode_data(rec, names)
        batched = rec.op == OP_EXTEND
        prepared, n = t.storage.prepare(data, batched=batched)
        want = np.atleast_1d(rec.arrays["keys"]).astype(np.int64)
        if n == 0:
            return
        victims = rec.arrays.get("victims")
        if victims is not None:
            slots = t._index.lookup(victims.astype(np.int64))
            if (slots < 0).any():
                raise WalCorrupt(f"{where}: evicts keys the table does not hold")
            self._forced = slots
        try:
            got = t._insert(prepared, n, _optional(rec, "priorities"), _optional(rec, "version"), None,
                            admitted=True)
        finally:
            self._forced = None
            self._victims = []
        if not np.array_equal(got, want):
            raise WalCorrupt(f"{where}: replayed insert got keys {got[:4].tolist()}..., the log says "
                             f"{want[:4].tolist()}...: the log does not continue this table")

    def _replay_sample(self, keys: np.ndarray, where: str) -> None:
        t = self.table
        n = len(keys)
        slots = t._index.lookup(keys.astype(np.int64))
        if n == 0 or (slots < 0).any():
            raise WalCorrupt(f"{where}: a sample of keys the table does not hold")
        sampler = t.sampler
        if isinstance(sampler, WithoutReplacement):  # what its sample() did: consume the epoch in order
            i = 0
            while i < n:
                if sampler._remaining.size == 0:
                    sampler._remaining.add(sampler._all.contents().copy())
                    sampler.epoch += 1
                k = min(n - i, sampler._remaining.size)
                sampler._remaining.discard(slots[i:i + k])
                i += k
        np.add.at(t._times_sampled, slots, 1)
        times = t._times_sampled[slots]
        t.rate_limiter.samples += n
        t._counters["samples"] += n
        t._counters["sample_calls"] += 1
        if t.max_times_sampled:
            done = np.unique(slots[times >= t.max_times_sampled])
            if len(done):
                t._remove_slots(done)
                t._counters["retired"] += len(done)


def _request_arrays(priorities: Any, version: Any) -> dict[str, Any]:
    """The insert's priorities and versions as the arrays to log (and to pass to the table)."""
    head: dict[str, Any] = {}
    if priorities is not None:
        p = np.asarray(priorities, dtype=np.float64)
        head["priorities"] = p
    if version is not None:
        v = np.asarray(version)
        if v.dtype.kind not in "iub":
            raise SpecError(f"version must be an integer or an array of integers, got dtype {v.dtype}")
        head["version"] = v.astype(np.int64)
    return head
