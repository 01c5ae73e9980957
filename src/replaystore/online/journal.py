"""OnlineJournal: a RolloutBuffer's state on disk, so a restarted service resumes it.

One LMDB environment holds pickled records (the payloads are the producers' Python objects):

- ``s``           buffer state: version, counters, histograms, the budget (tickets with deadlines);
- ``p/<group>``   a pending group (members so far);
- ``c/<arrival>`` a complete group (members, order, times sampled), keys in arrival order.

- ``t/<id>``, ``tb/<batch>``, ``tc``  the budget's held tickets, open over-provisioning batches and
  recently cancelled ids (``s`` holds the budget's counters only).

Each buffer operation writes what it changed, and only that, in one transaction
(:meth:`OnlineJournal.write`): a write costs O(records changed), not O(state), whatever number
of tickets or groups is held (``bench/bench_online_journal.py``). LMDB commits are atomic: a
process killed mid-write (``SIGKILL``) leaves the journal as of its last committed write, and a
restart replays the ``s`` snapshot with every record; there is no torn tail to cut and nothing to
compact (LMDB reuses the pages of deleted records). Each record carries a CRC32 of its bytes,
checked on load: a damaged record (a flipped bit, a foreign file) raises
:class:`~replaystore.CheckpointError`, as does a record that unpickles to something the buffer
never writes. Records are unpickled on load: the directory must be as trusted as a checkpoint
loaded with ``allow_pickle=True``. Not thread-safe (the buffer writes under its lock).
"""

from __future__ import annotations

import os
import pickle
import shutil
import struct
import zlib
from collections.abc import Iterable
from typing import Any

from ..errors import CheckpointError
from ..storage.lmdb_envs import acquire_env, lmdb, release_env

MAGIC = b"RJ1"  # a record: MAGIC, CRC32 of the pickle (u32, little-endian), the pickle
_CRC = struct.Struct("<I")
_LMDB_ERRORS = (lmdb.Error,) if lmdb is not None else ()


def encode(value: Any) -> bytes:
    """A record's bytes: :data:`MAGIC`, the CRC32 of the pickle, the pickle."""
    data = pickle.dumps(value, protocol=5)
    return MAGIC + _CRC.pack(zlib.crc32(data)) + data


def decode(raw: bytes, key: str, path: str) -> Any:
    """The value of a record's bytes (:func:`encode`; records of older journals have no CRC).

    Raises:
        CheckpointError: the CRC does not match, or the bytes do not unpickle.
    """
    if raw[:3] == MAGIC:
        data = raw[7:]
        if len(raw) < 7 or _CRC.unpack_from(raw, 3)[0] != zlib.crc32(data):
            raise CheckpointError(f"online journal {path}: record {key!r} is damaged (CRC mismatch)")
    elif raw[:2] == b"\x80\x05":  # a journal written before records had a CRC
        data = raw
    else:
        raise CheckpointError(f"online journal {path}: record {key!r} is damaged (not a journal record)")
    try:
        return pickle.loads(data)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a damaged record
        raise CheckpointError(f"online journal {path}: record {key!r} is damaged ({e})") from e


class OnlineJournal:
    """Durable records of a :class:`~replaystore.online.RolloutBuffer` (see the module doc).

    Args:
        path: directory of the journal (created if missing).
        map_size: LMDB map size in bytes (the payloads of held groups must fit).

    Raises:
        CheckpointError: the directory holds a file LMDB cannot open (damaged or foreign).
    """

    def __init__(self, path: str, map_size: int = 1 << 34) -> None:
        self.path = os.path.abspath(path)
        try:
            self._entry = acquire_env(self.path, map_size, False)
        except _LMDB_ERRORS as e:
            raise CheckpointError(f"online journal {self.path}: cannot open ({type(e).__name__}: {e})") from e
        self._env = self._entry.env
        self._closed = False

    def write(self, puts: dict[str, Any], deletes: Iterable[str] = ()) -> None:
        """Apply ``puts`` (key -> picklable value) and ``deletes`` atomically."""
        with self._env.begin(write=True) as txn:
            for k in deletes:
                txn.delete(k.encode())
            for k, v in puts.items():
                txn.put(k.encode(), encode(v))

    def load(self) -> dict[str, Any]:
        """Every record, ``{key: value}``.

        Raises:
            CheckpointError: a record cannot be read back (a damaged or foreign file, a CRC mismatch).
        """
        out: dict[str, Any] = {}
        try:
            with self._env.begin() as txn:
                for k, v in txn.cursor():
                    key = k.decode(errors="replace")
                    out[key] = decode(bytes(v), key, self.path)
        except _LMDB_ERRORS as e:
            raise CheckpointError(f"online journal {self.path}: damaged ({type(e).__name__}: {e})") from e
        return out

    def clear(self) -> None:
        """Forget everything."""
        with self._env.begin(write=True) as txn:
            txn.drop(self._env.open_db(txn=txn), delete=False)

    def close(self) -> None:
        """Release the environment (idempotent)."""
        if not self._closed:
            self._closed = True
            release_env(self.path, self._entry)

    def destroy(self) -> None:
        """Close and delete the journal's directory."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


__all__ = ["OnlineJournal"]
