"""FragmentStore: a disk-backed key-value store for large payloads (LMDB), shared by processes.

Large payloads (a MineStudio fragment is ~20 MB: 256 images plus a recurrent state) do not belong in
a Table or in Ray calls. Producers write them here and send only the returned *fragment id* to the
replay service; loaders on the same node read them back. Every process on the node opens the same
directory directly (LMDB is multi-process safe: one writer per shard at a time, readers never
block); processes on other nodes go through a store actor (:mod:`replaystore.ray.store`).

Layout of ``path/``: ``shard-000/ ... shard-NNN/``, one LMDB environment each (``data.mdb`` and
``lock.mdb``). A key goes to shard ``crc32(key) % num_shards``; more shards let more producers
write at the same time. LMDB files are sparse and never shrink, but pages freed by deletes are
reused, so the disk use follows the live payloads.

Values are pickled with protocol 5 and their large buffers (NumPy arrays) kept out of band, then
packed into one record: reading a 30 MB fragment costs one copy out of the memory map, and the
arrays it returns are writable views of that copy. Pickle runs code on load: open only stores your
own processes wrote.

Fragment ids are strings ``"<time_ns hex>-<uuid4 hex>"``: unique, and their age is readable
(:func:`fragment_age`), which lets a service remove payloads nobody acknowledged.

:class:`RefCounts` is the explicit reference counting that decides when a payload may be deleted
(the service counts every chunk, pending stream and handed-out fetch that holds a fragment).
"""

from __future__ import annotations

import os
import pickle
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import Closed, KeyNotFound

try:  # lmdb is an optional dependency (the [lmdb] extra)
    import lmdb
except ImportError:  # pragma: no cover - exercised only without the extra
    lmdb = None

__all__ = ["FragmentStore", "RefCounts", "decode", "encode", "fragment_age", "new_fragment_id"]

_MAGIC = b"RSF1"
_ALIGN = 64
_HEADER = struct.Struct("<4sIQ")  # magic, number of buffers, length of the pickle
_LEN = struct.Struct("<Q")


# -- ids ------------------------------------------------------------------------------------------
def new_fragment_id() -> str:
    """A new unique fragment id, ``"<time_ns hex>-<uuid4 hex>"`` (sortable by creation time)."""
    return f"{time.time_ns():016x}-{uuid.uuid4().hex}"


def fragment_age(fragment_id: str, now: float | None = None) -> float:
    """Seconds since ``fragment_id`` was made by :func:`new_fragment_id` (``inf`` for other ids)."""
    head, sep, _ = fragment_id.partition("-")
    if not sep or len(head) != 16:
        return float("inf")
    try:
        t = int(head, 16) / 1e9
    except ValueError:
        return float("inf")
    return (time.time() if now is None else now) - t


# -- encoding -------------------------------------------------------------------------------------
def _pad(n: int) -> int:
    return (-n) % _ALIGN


def encode(value: Any) -> bytes:
    """Pack ``value`` into one record: header, pickle (protocol 5), aligned out-of-band buffers."""
    buffers: list[pickle.PickleBuffer] = []
    meta = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    head = _HEADER.size + _LEN.size * len(raws) + len(meta)
    parts: list[Any] = [_HEADER.pack(_MAGIC, len(raws), len(meta))]
    parts += [_LEN.pack(r.nbytes) for r in raws]
    parts += [meta, bytes(_pad(head))]
    for r in raws:
        parts += [r, bytes(_pad(r.nbytes))]
    return b"".join(parts)  # one copy of the payload, no zero-filling


def decode(record: bytes | bytearray | memoryview) -> Any:
    """Inverse of :func:`encode`. Arrays are views of ``record`` (writable if it is)."""
    view = memoryview(record)
    magic, nbuf, meta_len = _HEADER.unpack_from(view, 0)
    if magic != _MAGIC:
        raise ValueError("not a FragmentStore record")
    pos = _HEADER.size
    lens = [_LEN.unpack_from(view, pos + i * _LEN.size)[0] for i in range(nbuf)]
    pos += _LEN.size * nbuf
    meta = view[pos : pos + meta_len]
    off = pos + meta_len
    off += _pad(off)
    bufs = []
    for n in lens:
        bufs.append(view[off : off + n])
        off += n + _pad(n)
    return pickle.loads(meta, buffers=bufs)


# -- one environment per (directory, process) -------------------------------------------------------
class _EnvEntry:
    """An open environment, how many handles of this process use it, and the directory's inode."""

    __slots__ = ("env", "count", "inode")

    def __init__(self, env: Any, inode: int) -> None:
        self.env, self.count, self.inode = env, 0, inode


_ENVS: dict[str, _EnvEntry] = {}  # realpath -> the entry new handles share
_ENVS_LOCK = threading.Lock()


def _acquire_env(path: str, map_size: int, sync: bool, writemap: bool = False) -> _EnvEntry:
    """Open ``path`` once per process (LMDB forbids opening one environment twice in a process).

    A directory that was deleted and created again (a new inode) gets a new environment: the
    cached one still maps the old, deleted files.
    """
    with _ENVS_LOCK:
        os.makedirs(path, exist_ok=True)
        inode = os.stat(path).st_ino
        entry = _ENVS.get(path)
        if entry is None or entry.inode != inode:
            env = lmdb.open(path, map_size=map_size, subdir=True, max_readers=1024, sync=sync,
                            metasync=sync, readahead=False, meminit=False, lock=True, writemap=writemap)
            entry = _ENVS[path] = _EnvEntry(env, inode)  # a stale entry lives on with its handles
        entry.count += 1
        return entry


def _release_env(path: str, entry: _EnvEntry) -> None:
    with _ENVS_LOCK:
        entry.count -= 1
        if entry.count <= 0:
            if _ENVS.get(path) is entry:
                del _ENVS[path]
            entry.env.close()


class FragmentStore:
    """Payloads by string id in LMDB shards under ``path``.

    Args:
        path: directory of the store (created if missing; made absolute, so every process that
            receives the store, pickled, opens the same directory).
        num_shards: number of LMDB environments (more shards: more concurrent writers).
        map_size: the largest size one shard may reach, in bytes (sparse: costs nothing until used).
        sync: flush to disk on every commit. Off by default: a commit then survives the crash of any
            process (the page cache has it), not a crash of the machine.
        writemap: write through a writable memory map (one copy per write instead of three; about
            2x faster writes of large values here). Turn it off for stores much larger than RAM,
            where it forces the kernel to read reused pages before overwriting them. Every process
            opening a store must use the same setting (the store's pickle carries it).

    Thread- and process-safe. A store pickles as its arguments and reopens the directory in the
    receiving process. Raises :class:`~replaystore.Closed` after :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike, num_shards: int = 4, map_size: int = 1 << 40,
                 sync: bool = False, writemap: bool = True) -> None:
        if lmdb is None:
            raise ImportError("FragmentStore needs the lmdb package: pip install 'replaystore[lmdb]'")
        if int(num_shards) < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self.path = os.path.abspath(os.fspath(path))
        self.num_shards = int(num_shards)
        self.map_size = int(map_size)
        self.sync = bool(sync)
        self.writemap = bool(writemap)
        self._paths = [os.path.join(self.path, f"shard-{i:03d}") for i in range(self.num_shards)]
        self._entries = [_acquire_env(p, self.map_size, self.sync, self.writemap) for p in self._paths]
        self._envs = [e.env for e in self._entries]
        self._closed = False

    def __reduce__(self) -> tuple:
        return (FragmentStore, (self.path, self.num_shards, self.map_size, self.sync, self.writemap))

    def __repr__(self) -> str:
        return f"FragmentStore(path={self.path!r}, num_shards={self.num_shards})"

    def _env(self, key: bytes) -> Any:
        if self._closed:
            raise Closed(f"{self!r} is closed")
        return self._envs[zlib.crc32(key) % self.num_shards]

    # -- writes -----------------------------------------------------------------------------------
    def put(self, value: Any, fragment_id: str | None = None) -> str:
        """Store ``value`` (any picklable object); return its id (a new one unless given).

        An existing id is overwritten. Raises ``lmdb.MapFullError`` when the shard is full.
        """
        fid = new_fragment_id() if fragment_id is None else str(fragment_id)
        self.put_encoded(fid, encode(value))
        return fid

    def put_encoded(self, fragment_id: str, record: bytes | bytearray | memoryview) -> None:
        """Store an already :func:`encode`-d record under ``fragment_id``."""
        key = fragment_id.encode()
        with self._env(key).begin(write=True) as txn:
            txn.put(key, record)

    def delete(self, fragment_ids: str | Iterable[str]) -> int:
        """Delete payloads; return how many existed. Unknown ids are skipped (no error)."""
        ids = [fragment_ids] if isinstance(fragment_ids, str) else list(fragment_ids)
        if not ids:
            return 0
        by_shard: dict[int, list[bytes]] = {}
        for fid in ids:
            key = fid.encode()
            by_shard.setdefault(zlib.crc32(key) % self.num_shards, []).append(key)
        if self._closed:
            raise Closed(f"{self!r} is closed")
        n = 0
        for shard, keys in by_shard.items():
            with self._envs[shard].begin(write=True) as txn:
                for key in keys:
                    n += bool(txn.delete(key))
        return n

    def clear(self) -> None:
        """Delete every payload."""
        for env in self._envs_open():
            with env.begin(write=True) as txn:
                txn.drop(env.open_db(txn=txn), delete=False)

    # -- reads ------------------------------------------------------------------------------------
    def get(self, fragment_id: str) -> Any:
        """The value stored under ``fragment_id``; raises :class:`~replaystore.KeyNotFound`."""
        return decode(self.get_encoded(fragment_id))

    def get_encoded(self, fragment_id: str) -> bytearray:
        """The raw record of ``fragment_id`` (one copy out of the memory map)."""
        key = fragment_id.encode()
        with self._env(key).begin(buffers=True) as txn:
            view = txn.get(key)
            if view is None:
                raise KeyNotFound(f"fragment {fragment_id!r} is not in {self!r}")
            return bytearray(view)

    def __contains__(self, fragment_id: object) -> bool:
        if not isinstance(fragment_id, str):
            return False
        key = fragment_id.encode()
        with self._env(key).begin() as txn:
            with txn.cursor() as cur:
                return cur.set_key(key)

    def keys(self) -> Iterator[str]:
        """Every stored id (shard by shard, each in byte order)."""
        for env in self._envs_open():
            with env.begin() as txn:
                ids = [k.decode() for k in txn.cursor().iternext(keys=True, values=False)]
            yield from ids

    def __len__(self) -> int:
        return sum(env.stat()["entries"] for env in self._envs_open())

    def disk_usage(self) -> int:
        """Bytes of pages in use (live payloads plus B-tree overhead), over all shards."""
        total = 0
        for env in self._envs_open():
            s = env.stat()
            total += s["psize"] * (s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"])
        return total

    def _envs_open(self) -> list:
        if self._closed:
            raise Closed(f"{self!r} is closed")
        return self._envs

    # -- lifetime -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Release this handle (the environment closes with the last handle of the process)."""
        if not self._closed:
            self._closed = True
            for p, entry in zip(self._paths, self._entries):
                _release_env(p, entry)

    def __enter__(self) -> "FragmentStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RefCounts:
    """Explicit reference counts of fragment ids (no ``__del__``, no reliance on the GC).

    A holder (a chunk, a pending stream, a handed-out fetch) calls :meth:`incref` when it starts
    holding ids and :meth:`decref` when it lets go; ``decref`` returns the ids nobody holds any
    more, which the owner then deletes from the store. Not thread-safe: one owner (the service's
    event loop) drives it.
    """

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def incref(self, ids: Iterable[str]) -> None:
        """Add one reference to each id (an id listed twice gains two)."""
        c = self._counts
        for i in ids:
            c[i] = c.get(i, 0) + 1

    def decref(self, ids: Iterable[str]) -> list[str]:
        """Drop one reference from each id; return the ids whose count reached zero.

        Raises:
            KeyNotFound: an id holds no reference (a bookkeeping bug: nothing is changed).
        """
        ids = list(ids)
        c = self._counts
        need: dict[str, int] = {}
        for i in ids:
            need[i] = need.get(i, 0) + 1
        for i, k in need.items():
            if c.get(i, 0) < k:
                raise KeyNotFound(f"fragment {i!r} has {c.get(i, 0)} references, cannot drop {k}")
        freed = []
        for i, k in need.items():
            left = c[i] - k
            if left:
                c[i] = left
            else:
                del c[i]
                freed.append(i)
        return freed

    def count(self, fragment_id: str) -> int:
        """References held on ``fragment_id`` (0 if none)."""
        return self._counts.get(fragment_id, 0)

    def __contains__(self, fragment_id: object) -> bool:
        return fragment_id in self._counts

    def __len__(self) -> int:
        return len(self._counts)

    def ids(self) -> list[str]:
        """Every referenced id."""
        return list(self._counts)
