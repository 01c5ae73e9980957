"""Journal: the fragment buffer's metadata on disk, next to the payloads, so a restart loses nothing.

One LMDB environment at ``<store path>/meta`` holds JSON records under four prefixes:

- ``s``             the service state: model version, session, counters, next chunk id;
- ``p/<id>``        a pending fragment (acknowledged, waiting in its stream's partial chunk);
- ``h/<stream>``    a stream's high-water mark (last sequence number seen, last time seen);
- ``c/<chunk id>``  a chunk: its fragments, version, session, use count (ids in FIFO order);
- ``l/<lease id>``  a handed-out fetch: its fragments and the client that holds it.

Each buffer operation writes its changes in one transaction (:meth:`Journal.write`), so the
journal always describes a state the buffer was in. Only the service process writes it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

from ..storage.fragments import _acquire_env, _release_env

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
    """

    def __init__(self, path: str, map_size: int = 1 << 32) -> None:
        self.path = os.path.abspath(path)
        self._entry = _acquire_env(self.path, map_size, False)
        self._env = self._entry.env
        self._closed = False

    def write(self, puts: Mapping[str, Any] | None = None, deletes: Iterable[str] = (),
              state: Mapping[str, Any] | None = None) -> None:
        """Apply ``puts`` (key -> JSON-able value), ``deletes`` and the new ``state`` atomically."""
        with self._env.begin(write=True) as txn:
            for k in deletes:
                txn.delete(k.encode())
            for k, v in (puts or {}).items():
                txn.put(k.encode(), json.dumps(v, separators=(",", ":")).encode())
            if state is not None:
                txn.put(STATE, json.dumps(state).encode())

    def load(self) -> dict[str, Any]:
        """Everything in the journal.

        Returns ``{"state": dict | None, "pending": {id: v}, "streams": {name: v},
        "chunks": [v, ...] (FIFO order), "leases": {id: v}}``.
        """
        out: dict[str, Any] = {"state": None, "pending": {}, "streams": {}, "chunks": [], "leases": {}}
        with self._env.begin() as txn:
            for k, v in txn.cursor():
                if k == STATE:
                    out["state"] = json.loads(v)
                    continue
                key = k.decode()
                val = json.loads(v)
                if key.startswith(PENDING):
                    out["pending"][key[len(PENDING):]] = val
                elif key.startswith(STREAM):
                    out["streams"][key[len(STREAM):]] = val
                elif key.startswith(CHUNK):
                    out["chunks"].append(val)
                elif key.startswith(LEASE):
                    out["leases"][key[len(LEASE):]] = val
        return out

    def clear(self) -> None:
        """Forget everything."""
        with self._env.begin(write=True) as txn:
            txn.drop(self._env.open_db(txn=txn), delete=False)

    def close(self) -> None:
        """Release the environment (idempotent)."""
        if not self._closed:
            self._closed = True
            _release_env(self.path, self._entry)

    def destroy(self) -> None:
        """Close and delete the journal's directory."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


class NullJournal(Journal):
    """A journal that keeps nothing (``persist=False``)."""

    def __init__(self) -> None:  # noqa: D107 - nothing to open
        self.path = ""

    def write(self, puts: Mapping[str, Any] | None = None, deletes: Iterable[str] = (),  # noqa: D102
              state: Mapping[str, Any] | None = None) -> None:
        pass

    def load(self) -> dict[str, Any]:  # noqa: D102
        return {"state": None, "pending": {}, "streams": {}, "chunks": [], "leases": {}}

    def clear(self) -> None:  # noqa: D102
        pass

    def close(self) -> None:  # noqa: D102
        pass

    def destroy(self) -> None:  # noqa: D102
        pass
