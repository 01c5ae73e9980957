"""LmdbJournal: records by key in one LMDB environment, written atomically, read back as untrusted input.

The journal of the fragment buffer (:data:`JSON` records) and of the rollout buffer
(:class:`~replaystore.online.OnlineJournal`, :data:`PICKLE` records). A buffer writes what an
operation changed, and only that, in one transaction (:meth:`LmdbJournal.write`); LMDB commits are
atomic, so a process killed mid-write (``SIGKILL``) leaves the journal as of its last commit: no torn
tail to cut, nothing to compact (LMDB reuses freed pages). Keys starting with a NUL byte are the
journal's own.

**Records.** A :class:`Codec` turns a value into a body; a record is the codec's 3-byte tag, the
CRC32 of the body (u32, little-endian) and the body. Records of the formats written before the
one journal (bare JSON text; a bare pickle, before the rollout buffer's records had a CRC) are
read as they are. Loading treats the directory as untrusted input: a CRC mismatch, a record of
another codec, bytes that do not decode or a key that is not UTF-8 raise
:class:`~replaystore.CheckpointError`, never another exception. :data:`JSON` decodes nothing but
JSON; :data:`PICKLE` unpickles, so a pickle journal's directory must be as trusted as a checkpoint
loaded with ``allow_pickle=True`` (the CRC catches damage, not an attacker).

**Full disks** (what the buffers make of it: docs/durability.md, "Full disks"). Writes go through
``pwrite``: one that finds no room raises :class:`~replaystore.DiskFull` and changes nothing. With
``reserve`` the journal keeps that many bytes allocated past its last page; when it cannot,
:attr:`LmdbJournal.low_space` is set and :meth:`LmdbJournal.check_space` raises ``DiskFull``.

Not thread-safe (a buffer writes under its lock). Only the process that owns a journal writes it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointError, DiskFull, StorageError
from ..storage.diskspace import allocated_bytes, lmdb_write_error, reserve
from ..storage.lmdb_envs import acquire_env, lmdb, release_env

_CRC = struct.Struct("<I")
_LMDB_ERRORS = (lmdb.Error,) if lmdb is not None else ()
_BUMP = b"\x00bump"  # written and deleted to make the pages of the last commit reusable


@dataclass(frozen=True)
class Codec:
    """How a journal's values become record bytes and back.

    Attributes:
        name: names the journal in errors (``"json"``, ``"pickle"``).
        tag: the 3 bytes a record of this codec starts with.
        dumps: value -> body bytes.
        loads: body bytes -> value (any exception: a damaged record).
        bare: first bytes of the records written before records had a tag and CRC (read as bodies).
    """

    name: str
    tag: bytes
    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]
    bare: tuple[bytes, ...] = ()

    def encode(self, value: Any) -> bytes:
        """A record's bytes: :attr:`tag`, the CRC32 of the body, the body."""
        body = self.dumps(value)
        return self.tag + _CRC.pack(zlib.crc32(body)) + body

    def decode(self, raw: bytes, key: str, path: str) -> Any:
        """The value of a record (:meth:`encode`, or a bare body of the older formats).

        Raises:
            CheckpointError: a CRC mismatch, a record of another codec, or a body that does not decode.
        """
        if raw[:3] == self.tag and len(raw) >= 7:
            body = raw[7:]
            if _CRC.unpack_from(raw, 3)[0] != zlib.crc32(body):
                raise CheckpointError(f"{self.name} journal {path}: record {key!r} is damaged (CRC mismatch)")
        elif raw.startswith(self.bare):
            body = raw
        else:
            raise CheckpointError(f"{self.name} journal {path}: record {key!r} is damaged (not a {self.name} record)")
        try:
            return self.loads(body)
        except Exception as e:  # noqa: BLE001 - any decoding failure (RecursionError too) is a damaged record
            raise CheckpointError(f"{self.name} journal {path}: record {key!r} is damaged ({e!r:.200})") from e


#: JSON values (decoding runs no code: safe on any directory); bare JSON objects and arrays (the
#: fragment buffer's records before the one journal) are read too
_COMPACT = json.JSONEncoder(separators=(",", ":")).encode  # one encoder (json.dumps(..., separators) makes one a call)
JSON = Codec("json", b"RJJ", lambda v: _COMPACT(v).encode(), json.loads, (b"{", b"["))

#: any picklable value (protocol 5); bare protocol-5 pickles (rollout buffers' journals before
#: records had a CRC) are read too
PICKLE = Codec("pickle", b"RJ1", lambda v: pickle.dumps(v, protocol=5), pickle.loads, (b"\x80\x05",))


class LmdbJournal:
    """Records by key, written atomically (see the module doc). Not thread-safe.

    Args:
        path: directory of the journal (created if missing).
        codec: :data:`JSON` or :data:`PICKLE` (or another :class:`Codec`).
        map_size: LMDB map size in bytes (every record must fit).
        reserve: bytes kept allocated past the last page (see the module doc); 0: none.
        sync: flush every commit to disk (survives a machine crash, not only a process crash).

    Raises:
        CheckpointError: the directory holds a file LMDB cannot open (damaged or foreign).
        DiskFull: no room to create the journal's files.
    """

    def __init__(self, path: str, codec: Codec, map_size: int = 1 << 32, reserve: int = 0, sync: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.codec = codec
        self.reserve = int(reserve)
        self._map_size = map_size
        self._sync = sync
        self._open()

    def _open(self) -> None:
        try:
            self._entry = acquire_env(self.path, self._map_size, self._sync)
        except _LMDB_ERRORS as e:
            raise CheckpointError(
                f"{self.codec.name} journal {self.path}: cannot open ({type(e).__name__}: {e})"
            ) from e
        self._env = self._entry.env
        self._closed = False
        self._data = os.path.join(self.path, "data.mdb")
        self._fd = os.open(self._data, os.O_RDWR) if self.reserve > 0 else -1
        self._reserved_end = 0  # the file's blocks are allocated up to here
        self.low_space = False  # the reserve could not be kept
        self._top_up()

    def _top_up(self) -> None:
        """Keep ``reserve`` bytes allocated past the last page; sets :attr:`low_space` on failure."""
        if self.reserve <= 0:
            return
        end = (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"]
        if end + self.reserve // 2 <= self._reserved_end and not self.low_space:
            return
        try:
            reserve(self._fd, end, self.reserve, self._data)
        except StorageError:
            self.low_space = True
            return
        self._reserved_end, self.low_space = end + self.reserve, False

    def check_space(self) -> None:
        """Raise :class:`~replaystore.DiskFull` if the journal's reserve cannot be kept (disk full)."""
        if self.low_space:
            self._top_up()
            if self.low_space:
                raise DiskFull(
                    f"the disk holding the journal {self.path} is full: no room to keep its "
                    f"{self.reserve}-byte reserve; new writes that take space are refused until space is freed",
                    self._data,
                    self.reserve,
                )

    def write(self, puts: Mapping[str, Any], deletes: Iterable[str] = ()) -> None:
        """Apply ``puts`` (key -> value the codec encodes) and ``deletes`` in one transaction.

        Raises:
            DiskFull: no room for the transaction (nothing was written).
            StorageError: another I/O error (nothing was written).
        """
        encode = self.codec.encode
        records = [(k.encode(), encode(v)) for k, v in puts.items()]
        for attempt in range(2):
            try:
                with self._env.begin(write=True) as txn:
                    for k in deletes:
                        txn.delete(k.encode())
                    for k, v in records:
                        txn.put(k, v)
                break
            except _LMDB_ERRORS as e:  # the transaction was aborted
                err = lmdb_write_error(e, self.path, sum(len(k) + len(v) for k, v in records), self._map_size)
                if attempt or not isinstance(err, DiskFull):
                    raise err from None
                try:  # pages freed by the last commit become reusable after one more (see FragmentStore)
                    with self._env.begin(write=True) as txn:
                        txn.put(_BUMP, b"")
                        txn.delete(_BUMP)
                except _LMDB_ERRORS:
                    raise err from None
        if self.reserve > 0:
            self._top_up()

    def load(self) -> dict[str, Any]:
        """Every record, ``{key: value}`` (in key order).

        Raises:
            CheckpointError: a record cannot be read back (see the module doc), or LMDB finds the file damaged.
        """
        out: dict[str, Any] = {}
        decode = self.codec.decode
        try:
            with self._env.begin() as txn:
                for k, v in txn.cursor():
                    if k[:1] == b"\x00":
                        continue
                    key = k.decode()  # (a key that is not UTF-8: damaged)
                    out[key] = decode(bytes(v), key, self.path)
        except (*_LMDB_ERRORS, UnicodeDecodeError) as e:
            raise CheckpointError(f"{self.codec.name} journal {self.path}: damaged ({type(e).__name__}: {e})") from e
        return out

    def disk_usage(self) -> int:
        """Bytes the file system holds for the journal (reserve included)."""
        return allocated_bytes([self._data, os.path.join(self.path, "lock.mdb")])

    def clear(self) -> None:
        """Forget everything: the journal's files are deleted and created again (their space given back).

        Only this handle may have the journal open. Raises ``DiskFull`` if even an empty journal
        and its reserve find no room (the journal is then closed).
        """
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._open()

    def close(self) -> None:
        """Release the environment (idempotent)."""
        if not self._closed:
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
            release_env(self.path, self._entry)


@contextmanager
def restoring(what: str) -> Iterator[None]:
    """Context of a restore from journal records: a record that reads but is not a valid state raises.

    ``KeyError``, ``TypeError``, ``ValueError``, ``AttributeError`` or ``IndexError`` inside (a
    missing or malformed field of records that did unpickle or parse) becomes
    :class:`~replaystore.CheckpointError` ``"<what> holds no valid state (<type>: <message>)"``,
    chained to the original; other exceptions (a damaged record's own ``CheckpointError``,
    ``StorageError``) pass unchanged. ``what`` names the journal, e.g. ``"fragment buffer: the
    journal /path"``.
    """
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise CheckpointError(f"{what} holds no valid state ({type(e).__name__}: {e})") from e


class NullJournal:
    """A journal that keeps nothing (a buffer without persistence): :class:`LmdbJournal`'s calls, no-ops."""

    path, low_space = "", False

    def write(self, puts: Mapping[str, Any], deletes: Iterable[str] = ()) -> None:
        """Nothing is kept."""

    def load(self) -> dict[str, Any]:
        """Nothing: ``{}``."""
        return {}

    def disk_usage(self) -> int:
        """``0`` bytes."""
        return 0

    def check_space(self) -> None:
        """Never raises."""

    clear = close = check_space


__all__ = ["JSON", "PICKLE", "Codec", "LmdbJournal", "NullJournal"]
