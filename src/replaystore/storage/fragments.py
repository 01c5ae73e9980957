"""FragmentStore: a disk-backed key-value store for large payloads (LMDB), shared by processes.

Large payloads (a MineStudio fragment is ~20 MB: 256 images plus a recurrent state) do not belong in
a Table or in Ray calls. Producers write them here and send only the returned *fragment id* to the
replay service; loaders on the same node read them back. Every process on the node opens the same
directory directly (LMDB is multi-process safe: one writer per shard at a time, readers never
block); processes on other nodes go through a store actor (:mod:`replaystore.ray.fragments.store`).
A key goes to shard ``crc32(key) % num_shards`` under ``path/``; shards, their generations and the
environments: :mod:`~replaystore.storage.lmdb_envs`; full disks and disk space: docs/durability.md.

Values are records of :mod:`~replaystore.storage.fragment_codec` (pickle protocol 5, arrays out of
band): reading a 30 MB fragment costs one copy out of the memory map, and the arrays it returns are
writable views of that copy. Pickle runs code on load: open only stores your own processes wrote.
:class:`~replaystore.storage.refcounts.RefCounts` (re-exported here) is the explicit reference
counting that decides when a payload may be deleted.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import Closed, DiskFull, InvalidArgument, KeyNotFound, StorageError
from .diskspace import allocated_bytes, lmdb_write_error, reserve
from .fragment_codec import decode, encode, fragment_age, new_fragment_id
from .lmdb_envs import (
    BUMP,
    DELETE_SLACK,
    ENVS_LOCK,
    GEN,
    KEEP,
    PUT_SLACK,
    SPARE,
    EnvEntry,
    Moved,
    ShardLink,
    checkin,
    delete_slack,
    make_spare,
    next_generation,
    open_env_locked,
    read_target,
    release_env_locked,
)
from .refcounts import RefCounts

try:  # lmdb is an optional dependency (the [lmdb] extra)
    import lmdb
except ImportError:  # pragma: no cover - exercised only without the extra
    lmdb = None

__all__ = ["FragmentStore", "RefCounts", "decode", "encode", "fragment_age", "new_fragment_id"]

log = logging.getLogger("replaystore")

_OPTIONS = "store.json"


class FragmentStore:
    """Payloads by string id in LMDB shards under ``path``.

    Args:
        path: directory of the store (created if missing; made absolute, so every process that
            receives the store, pickled, opens the same directory).
        num_shards: number of LMDB environments (more shards: more concurrent writers).
        map_size: the largest size one shard may reach, in bytes (sparse: costs nothing until used).
            A put that would pass it raises :class:`~replaystore.DiskFull`.
        sync: flush to disk on every commit. Off by default: a commit then survives the crash of any
            process (the page cache has it), not a crash of the machine.
        writemap: write through a writable memory map (one copy per write instead of three; faster
            writes of large values). Off by default. With it, each write first reserves its blocks
            (``posix_fallocate`` past the last page), so a full disk raises ``DiskFull`` rather than
            ``SIGBUS``. The setting is recorded in ``path/store.json`` at creation and every process
            uses the recorded one (``None``: whatever is recorded; a conflicting value raises
            ``ValueError``).
        shrink_threshold: when a delete leaves a shard empty and its files hold more than this many
            bytes, the shard is replaced by a fresh, empty generation (its space goes back to the file
            system). ``None``: never.

    **Full disks.** Every write (put, delete, clear, compact) either completes or raises
    :class:`~replaystore.DiskFull` (no space, or the shard's ``map_size`` reached; ``path`` and
    ``wanted`` set) or :class:`~replaystore.StorageError` (another I/O error); then nothing was
    written and every payload stored before is readable. The store works again once space is freed.

    **Disk space follows the live payloads** (pages freed by deletes are reused; emptied shards are
    swapped for empty generations, :meth:`compact` rewrites the others): docs/durability.md "Disk space".

    Thread- and process-safe. A store pickles as its arguments and reopens the directory in the
    receiving process. Raises :class:`~replaystore.Closed` after :meth:`close`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        num_shards: int = 4,
        map_size: int = 1 << 40,
        sync: bool = False,
        writemap: bool | None = None,
        shrink_threshold: int | None = 1 << 20,
    ) -> None:
        if lmdb is None:
            raise ImportError("FragmentStore needs the lmdb package: pip install 'replaystore[lmdb]'")
        if int(num_shards) < 1:
            raise InvalidArgument(f"num_shards must be >= 1, got {num_shards}")
        self.path = os.path.abspath(os.fspath(path))
        self.num_shards = int(num_shards)
        self.map_size = int(map_size)
        self.sync = bool(sync)
        self.shrink_threshold = None if shrink_threshold is None else int(shrink_threshold)
        os.makedirs(self.path, exist_ok=True)
        self.writemap = self._recorded_writemap(writemap)
        self._shards = [ShardLink(os.path.join(self.path, f"shard-{i:03d}")) for i in range(self.num_shards)]
        self._closed = False
        for i in range(self.num_shards):
            self._ensure_spare(i)  # opens every shard now: errors surface here

    def _recorded_writemap(self, writemap: bool | None) -> bool:
        """The store's writemap setting, recorded in ``store.json`` by the process that created it."""
        file = os.path.join(self.path, _OPTIONS)
        if not os.path.exists(file):
            first = os.path.join(self.path, "shard-000")
            legacy = os.path.isdir(first) and not os.path.islink(first)  # stores of the older layout used writemap
            value = legacy if writemap is None else bool(writemap)
            tmp = f"{file}.{os.getpid()}.{uuid.uuid4().hex}"
            try:
                with open(tmp, "w") as f:
                    json.dump({"writemap": value}, f)
                os.link(tmp, file)  # the first process to create the store decides, atomically
            except FileExistsError:
                pass
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise DiskFull(f"no space to create {file}", file, None) from None
                raise
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        try:
            with open(file) as f:
                recorded = bool(json.load(f)["writemap"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StorageError(f"{file} is unreadable: {e}", file, None) from None
        if writemap is not None and bool(writemap) != recorded:
            raise InvalidArgument(
                f"the store at {self.path} was created with writemap={recorded}; "
                f"every process must open it the same way (got writemap={writemap})"
            )
        return recorded

    def __reduce__(self) -> tuple:
        return (
            FragmentStore,
            (self.path, self.num_shards, self.map_size, self.sync, self.writemap, self.shrink_threshold),
        )

    def __repr__(self) -> str:
        return f"FragmentStore(path={self.path!r}, num_shards={self.num_shards})"

    # -- shard plumbing -------------------------------------------------------------------------------
    def _shard_of(self, key: bytes) -> int:
        return zlib.crc32(key) % self.num_shards

    def _checkout(self, i: int) -> EnvEntry:
        """The current generation of shard ``i``, marked in use (pair with :func:`checkin`)."""
        if self._closed:
            raise Closed(f"{self!r} is closed")
        sh = self._shards[i]
        for _ in range(1000):
            target = read_target(sh.link)
            with ENVS_LOCK:
                if sh.entry is None or target != sh.target:
                    try:  # a generation is never re-created: if it vanished, it was just replaced
                        entry = open_env_locked(
                            sh.dir_of(target), self.map_size, self.sync, self.writemap, create=target is None
                        )
                    except FileNotFoundError:
                        continue  # swapped between readlink and open: read the link again
                    old = sh.entry
                    sh.entry, sh.target = entry, target
                    if old is not None:
                        release_env_locked(old.path, old)  # closes once its last transaction ends
                sh.entry.active += 1
                return sh.entry
        raise StorageError(f"shard {sh.link} keeps moving: cannot open its current generation", sh.link, None)

    def _ensure_spare(self, i: int) -> None:
        """Open shard ``i`` and make sure its next generation is ready (see :func:`make_spare`)."""
        sh = self._shards[i]
        entry = self._checkout(i)
        try:
            if entry.path == sh.link:
                return
            current = os.path.basename(entry.path)
            nxt = f"{os.path.basename(sh.link)}{GEN}{int(current.rsplit(GEN, 1)[1]) + 1:06d}"
            if os.path.exists(os.path.join(os.path.dirname(sh.link), nxt, SPARE)):
                return
            with entry.env.begin(write=True):  # spares are made and used under the shard's write lock
                if read_target(sh.link) == current:
                    make_spare(sh.link, current)
        except lmdb.Error:
            pass
        finally:
            checkin(entry)

    def _read(self, i: int, fn: Callable[[Any], Any]) -> Any:
        entry = self._checkout(i)
        try:
            with entry.env.begin(buffers=True) as txn:
                return fn(txn)
        finally:
            checkin(entry)

    def _write(self, i: int, fn: Callable[[Any], Any], wanted: int, slack: int | Callable[[Any], int]) -> Any:
        """Run ``fn(txn)`` in a write transaction of shard ``i``'s current generation; commit.

        ``wanted`` is the payload's size (reported in errors), ``slack`` what the B-tree and the
        free list may add (or a function of the transaction computing it).
        Raises ``DiskFull``/``StorageError`` (nothing written) when LMDB or the reservation fails.

        Pages freed by the last commit are still part of the previous snapshot, so LMDB reuses
        them only after one more commit: when a write fails for room, one small commit (a marker
        put and deleted) is made and the write retried once.
        """
        sh = self._shards[i]
        retried = False
        while True:
            entry = self._checkout(i)
            try:
                with entry.env.begin(write=True, buffers=True) as txn:
                    if entry.path != sh.link and read_target(sh.link) != os.path.basename(entry.path):
                        raise Moved
                    if self.writemap or wanted:  # a put without writemap: see _reserve_for_put
                        reserve = self._reserve if self.writemap else self._reserve_for_put
                        reserve(entry, wanted + (slack(txn) if callable(slack) else slack), wanted)
                    return fn(txn)
            except Moved:
                continue
            except lmdb.Error as e:
                err = lmdb_write_error(e, entry.path, wanted, self.map_size)
                if retried or not isinstance(err, DiskFull) or isinstance(e, lmdb.MapFullError):
                    raise err from None
                retried = True
                try:
                    with entry.env.begin(write=True) as txn:  # makes the last commit's free pages reusable
                        txn.put(BUMP, b"")
                        txn.delete(BUMP)
                except lmdb.Error:
                    raise err from None
            finally:
                checkin(entry)

    def _reserve_for_put(self, entry: EnvEntry, nbytes: int, wanted: int) -> None:
        """Keep room for deletes: a put (without writemap) must leave ``KEEP`` bytes allocated past the end.

        A delete copies a few pages; on a disk filled by puts it would find none and the store
        could never shrink again. So a put first allocates its bytes past the last page; if that
        fails, it goes ahead only when ``KEEP`` bytes can be allocated there (it may still fit in
        pages freed by deletes; if not, LMDB's write fails cleanly with ``DiskFull``). Pages past the
        end that a failed commit wrote stay allocated, so the next delete finds them.
        """
        try:
            self._reserve(entry, nbytes, wanted)
        except DiskFull:
            self._reserve(entry, KEEP, wanted)

    def _reserve(self, entry: EnvEntry, nbytes: int, wanted: int) -> None:
        """Allocate ``nbytes`` past the last page (the caller holds the write lock)."""
        if entry.fd < 0:
            entry.fd = os.open(os.path.join(entry.path, "data.mdb"), os.O_RDWR)
        psize = entry.env.stat()["psize"]
        try:
            reserve(entry.fd, (entry.env.info()["last_pgno"] + 1) * psize, nbytes, os.path.join(entry.path, "data.mdb"))
        except DiskFull as e:
            raise DiskFull(f"{e} (for a write of {wanted} bytes)", e.path, wanted) from None

    # -- writes -----------------------------------------------------------------------------------
    def put(self, value: Any, fragment_id: str | None = None) -> str:
        """Store ``value`` (any picklable object); return its id (a new one unless given).

        An existing id is overwritten. Raises :class:`~replaystore.DiskFull` (no space, or the
        shard reached ``map_size``; nothing stored) or :class:`~replaystore.StorageError`.
        """
        fid = new_fragment_id() if fragment_id is None else str(fragment_id)
        self.put_encoded(fid, encode(value))
        return fid

    def put_encoded(self, fragment_id: str, record: bytes | bytearray | memoryview) -> None:
        """Store an already :func:`encode`-d record under ``fragment_id`` (errors as :meth:`put`)."""
        key = fragment_id.encode()
        self._write(self._shard_of(key), lambda txn: txn.put(key, record), len(record), PUT_SLACK + len(record) // 64)

    def delete(self, fragment_ids: str | Iterable[str]) -> int:
        """Delete payloads; return how many existed. Unknown ids are skipped (no error).

        A shard left empty whose files hold more than ``shrink_threshold`` bytes is replaced by an
        empty generation (its space goes back to the file system). Raises ``DiskFull`` if even the
        delete's few copied pages find no room (only possible with ``writemap``... or a disk filled
        to the last block); then nothing was deleted.
        """
        ids = [fragment_ids] if isinstance(fragment_ids, str) else list(fragment_ids)
        if not ids:
            return 0
        by_shard: dict[int, list[bytes]] = {}
        for fid in ids:
            key = fid.encode()
            by_shard.setdefault(self._shard_of(key), []).append(key)
        if self._closed:
            raise Closed(f"{self!r} is closed")
        n = 0
        for shard, keys in by_shard.items():

            def drop(txn: Any, keys: list[bytes] = keys) -> tuple[int, int]:
                return sum(bool(txn.delete(k)) for k in keys), txn.stat()["entries"]

            gone, left = self._write(shard, drop, 0, functools.partial(delete_slack, keys=keys))
            n += gone
            if gone and left == 0:
                self._maybe_shrink(shard)
        return n

    def clear(self) -> None:
        """Delete every payload; every shard becomes a fresh, empty generation (space given back)."""
        for i in range(self.num_shards):
            if not self._swap(i, empty=True):  # a store of the older layout: delete in place
                self._write(
                    i,
                    lambda txn: [txn.delete(bytes(k)) for k in list(txn.cursor().iternext(values=False))],
                    0,
                    DELETE_SLACK,
                )

    def compact(self) -> int:
        """Rewrite every shard without its free pages; return the bytes given back to the file system.

        Online: writers of a shard wait for its copy, readers never wait (docs/durability.md "Disk
        space", "Online compaction"). Needs free space for a copy of the largest shard's live data
        (``DiskFull`` otherwise; the shard is then left as it was).
        """
        before = self.disk_usage()
        for i in range(self.num_shards):
            self._swap(i, empty=False)
        return max(before - self.disk_usage(), 0)

    def _maybe_shrink(self, i: int) -> None:
        if self.shrink_threshold is None:
            return
        if allocated_bytes(self._files(i)) > self.shrink_threshold:
            try:
                self._swap(i, empty=True, only_if_empty=True)
            except StorageError as e:  # the delete itself succeeded; the space stays for now
                log.warning("fragment store %s: could not shrink shard %d: %s", self.path, i, e)

    def _swap(self, i: int, empty: bool, only_if_empty: bool = False) -> bool:
        """Replace shard ``i`` by a compacted copy (``empty``: by an empty environment).

        Returns ``False`` for a shard of the older layout (a plain directory; nothing done).
        """
        sh = self._shards[i]
        while True:
            entry = self._checkout(i)
            if entry.path == sh.link:
                checkin(entry)
                return False
            try:
                with entry.env.begin(write=True) as txn:  # blocks every writer of this shard
                    current = read_target(sh.link)
                    if current != os.path.basename(entry.path):
                        raise Moved
                    if only_if_empty and txn.stat()["entries"]:
                        return True
                    next_generation(entry, sh.link, current, self.map_size, self.writemap, empty)
            except Moved:
                continue
            finally:
                checkin(entry)
            checkin(self._checkout(i))  # move this handle to the new generation: the old one closes
            return True

    # -- reads ------------------------------------------------------------------------------------
    def get(self, fragment_id: str) -> Any:
        """The value stored under ``fragment_id``; raises :class:`~replaystore.KeyNotFound`."""
        return decode(self.get_encoded(fragment_id))

    def get_encoded(self, fragment_id: str) -> bytearray:
        """The raw record of ``fragment_id`` (one copy out of the memory map)."""
        key = fragment_id.encode()

        def read(txn: Any) -> bytearray | None:
            view = txn.get(key)
            return None if view is None else bytearray(view)

        out = self._read(self._shard_of(key), read)
        if out is None:
            raise KeyNotFound(f"fragment {fragment_id!r} is not in {self!r}")
        return out

    def __contains__(self, fragment_id: object) -> bool:
        """Whether ``fragment_id`` is stored."""
        if not isinstance(fragment_id, str):
            return False
        key = fragment_id.encode()

        def has(txn: Any) -> bool:
            with txn.cursor() as cur:
                return cur.set_key(key)

        return self._read(self._shard_of(key), has)

    def keys(self) -> Iterator[str]:
        """Every stored id (shard by shard, each in byte order)."""

        def ids(txn: Any) -> list[str]:
            return [bytes(k).decode() for k in txn.cursor().iternext(keys=True, values=False)]

        for i in self._indices():
            yield from self._read(i, ids)

    def __len__(self) -> int:
        """Number of stored payloads."""
        return sum(self._read(i, lambda txn: txn.stat()["entries"]) for i in self._indices())

    def live_bytes(self) -> int:
        """Bytes of pages in use (live payloads plus B-tree overhead), over all shards."""
        stats = [self._read(i, lambda txn: txn.stat()) for i in self._indices()]
        return sum(s["psize"] * (s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]) for s in stats)

    def disk_usage(self) -> int:
        """Bytes the file system holds for the shards' files (``st_blocks * 512``), over all shards."""
        return allocated_bytes(f for i in self._indices() for f in self._files(i))

    def _files(self, i: int) -> list[str]:
        sh = self._shards[i]
        d = sh.dir_of(read_target(sh.link))
        return [os.path.join(d, "data.mdb"), os.path.join(d, "lock.mdb")]

    def _indices(self) -> range:
        if self._closed:
            raise Closed(f"{self!r} is closed")
        return range(self.num_shards)

    # -- lifetime -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Release this handle (the environment closes with the last handle of the process).

        Empty shards whose files hold more than ``shrink_threshold`` bytes are shrunk first.
        """
        if not self._closed:
            if self.shrink_threshold is not None:
                for i in range(self.num_shards):
                    try:
                        if self._read(i, lambda txn: txn.stat()["entries"]) == 0:
                            self._maybe_shrink(i)
                    except (StorageError, lmdb.Error):  # closing must not fail over space
                        pass
            self._closed = True
            with ENVS_LOCK:
                for sh in self._shards:
                    if sh.entry is not None:
                        release_env_locked(sh.entry.path, sh.entry)
                        sh.entry = None

    def __enter__(self) -> "FragmentStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
