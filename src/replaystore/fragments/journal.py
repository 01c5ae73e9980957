"""Journal: the fragment buffer's metadata on disk, next to the payloads, so a restart loses nothing.

One LMDB environment at ``<store path>/meta`` holds JSON records under four prefixes:

- ``s``             the service state: model version, session, counters, next chunk id;
- ``p/<id>``        a pending fragment (acknowledged, waiting in its stream's partial chunk);
- ``h/<stream>``    a stream's high-water mark (last sequence number seen, last time seen);
- ``c/<chunk id>``  a chunk: its fragments, version, session, use count (ids in FIFO order);
- ``l/<lease id>``  a handed-out fetch: its fragments and the client that holds it.

Each buffer operation writes its changes in one transaction (:meth:`Journal.write`), so the
journal always describes a state the buffer was in. Only the service process writes it.

**Full disks.** The journal writes with ``pwrite`` (no writable map), so a write that finds no
room fails with :class:`~replaystore.DiskFull` and changes nothing. It also keeps ``reserve``
bytes allocated past its last page (``posix_fallocate``): writes that fit in the reserve cannot
fail for room even when the payloads have filled the disk. The buffer refuses new fragments
(:meth:`Journal.check_space` raises ``DiskFull``) as soon as the reserve cannot be kept, so fetches,
releases and version updates, which free space rather than take it, keep working from the reserve.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import DiskFull, StorageError
from ..storage.diskspace import allocated_bytes, lmdb_write_error, reserve
from ..storage.lmdb_envs import acquire_env as _acquire_env
from ..storage.lmdb_envs import release_env as _release_env

STATE = b"s"
PENDING = "p/"
STREAM = "h/"
CHUNK = "c/"
LEASE = "l/"


def chunk_key(chunk_id: int) -> str:
    """Journal key of a chunk (zero-padded, so keys sort in FIFO order)."""
    return f"{CHUNK}{chunk_id:016d}"


class Journal:
    """Durable metadata of a fragment buffer (see the module doc). Not thread-safe.

    Args:
        path: directory of the journal (created if missing).
        map_size: LMDB map size in bytes.
        reserve: bytes kept allocated past the journal's last page (see the module doc); 0: none.
        sync: flush every commit to disk (survives a machine crash, not only a process crash).
    """

    def __init__(self, path: str, map_size: int = 1 << 32, reserve: int = 8 << 20, sync: bool = False) -> None:
        self.path = os.path.abspath(path)
        self.reserve = int(reserve)
        self._entry = _acquire_env(self.path, map_size, sync)
        self._env = self._entry.env
        self._map_size = map_size
        self._sync = sync
        self._closed = False
        self._data = os.path.join(self.path, "data.mdb")
        self._fd = os.open(self._data, os.O_RDWR)
        self._reserved_end = 0  # the file's blocks are allocated up to here
        self.low_space = False  # the reserve could not be kept: new fragments are refused
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
                    f"{self.reserve}-byte reserve; new fragments are refused until space is freed",
                    self._data,
                    self.reserve,
                )

    def write(
        self, puts: Mapping[str, Any] | None = None, deletes: Iterable[str] = (), state: Mapping[str, Any] | None = None
    ) -> None:
        """Apply ``puts`` (key -> JSON-able value), ``deletes`` and the new ``state`` atomically.

        Raises:
            DiskFull: no room for the transaction (nothing was written).
            StorageError: another I/O error (nothing was written).
        """
        records = [(k.encode(), json.dumps(v, separators=(",", ":")).encode()) for k, v in (puts or {}).items()]
        if state is not None:
            records.append((STATE, json.dumps(state).encode()))
        wanted = sum(len(k) + len(v) for k, v in records)
        for attempt in range(2):
            try:
                with self._env.begin(write=True) as txn:
                    for k in deletes:
                        txn.delete(k.encode())
                    for k, v in records:
                        txn.put(k, v)
                break
            except Exception as e:  # lmdb.Error: the transaction was aborted
                if not _is_lmdb_error(e):
                    raise
                err = lmdb_write_error(e, self.path, wanted, self._map_size)
                if attempt or not isinstance(err, DiskFull):
                    raise err from None
                try:  # pages freed by the last commit become reusable after one more (see FragmentStore)
                    with self._env.begin(write=True) as txn:
                        txn.put(b"\x00bump", b"")
                        txn.delete(b"\x00bump")
                except Exception:  # noqa: BLE001
                    raise err from None
        self._top_up()

    def disk_usage(self) -> int:
        """Bytes the file system holds for the journal (reserve included)."""
        return allocated_bytes([self._data, os.path.join(self.path, "lock.mdb")])

    def load(self) -> dict[str, Any]:
        """Everything in the journal.

        Returns ``{"state": dict | None, "pending": {id: v}, "streams": {name: v},
        "chunks": [v, ...] (FIFO order), "leases": {id: v}}``.
        """
        out: dict[str, Any] = {"state": None, "pending": {}, "streams": {}, "chunks": [], "leases": {}}
        with self._env.begin() as txn:
            for k, v in txn.cursor():
                if k.startswith(b"\x00"):
                    continue
                if k == STATE:
                    out["state"] = json.loads(v)
                    continue
                key = k.decode()
                val = json.loads(v)
                if key.startswith(PENDING):
                    out["pending"][key[len(PENDING) :]] = val
                elif key.startswith(STREAM):
                    out["streams"][key[len(STREAM) :]] = val
                elif key.startswith(CHUNK):
                    out["chunks"].append(val)
                elif key.startswith(LEASE):
                    out["leases"][key[len(LEASE) :]] = val
        return out

    def clear(self) -> None:
        """Forget everything: the journal's files are deleted and created again (their space given back).

        Only the service process may have the journal open. Raises ``DiskFull`` if even an empty
        journal and its reserve find no room (the journal is then closed).
        """
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self.__init__(self.path, self._map_size, self.reserve, self._sync)  # type: ignore[misc]

    def close(self) -> None:
        """Release the environment (idempotent)."""
        if not self._closed:
            self._closed = True
            os.close(self._fd)
            _release_env(self.path, self._entry)

    def destroy(self) -> None:
        """Close and delete the journal's directory."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


def _is_lmdb_error(e: BaseException) -> bool:
    import lmdb

    return isinstance(e, lmdb.Error)


class NullJournal(Journal):
    """A journal that keeps nothing (``persist=False``)."""

    def __init__(self) -> None:  # noqa: D107 - nothing to open
        self.path = ""
        self.low_space = False

    def check_space(self) -> None:  # noqa: D102
        pass

    def disk_usage(self) -> int:  # noqa: D102
        return 0

    def write(
        self, puts: Mapping[str, Any] | None = None, deletes: Iterable[str] = (), state: Mapping[str, Any] | None = None
    ) -> None:
        """Nothing is kept."""

    def load(self) -> dict[str, Any]:  # noqa: D102
        return {"state": None, "pending": {}, "streams": {}, "chunks": [], "leases": {}}

    def clear(self) -> None:  # noqa: D102
        pass

    def close(self) -> None:  # noqa: D102
        pass

    def destroy(self) -> None:  # noqa: D102
        pass
