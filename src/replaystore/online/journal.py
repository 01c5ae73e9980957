"""OnlineJournal: a RolloutBuffer's state on disk, so a restarted service resumes it.

One LMDB environment holds pickled records (the payloads are the producers' Python objects):

- ``s``           buffer state: version, counters, histograms, the budget (tickets with deadlines);
- ``p/<group>``   a pending group (members so far);
- ``c/<arrival>`` a complete group (members, order, times sampled), keys in arrival order.

Each buffer operation writes its changes in one transaction (:meth:`OnlineJournal.write`), so the
journal always describes a state the buffer was in. Records are unpickled on load: the directory
must be as trusted as a checkpoint loaded with ``allow_pickle=True``. Not thread-safe (the buffer
writes under its lock).
"""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Iterable
from typing import Any

from ..errors import CheckpointError
from ..storage.lmdb_envs import acquire_env, release_env


class OnlineJournal:
    """Durable records of a :class:`~replaystore.online.RolloutBuffer` (see the module doc).

    Args:
        path: directory of the journal (created if missing).
        map_size: LMDB map size in bytes (the payloads of held groups must fit).
    """

    def __init__(self, path: str, map_size: int = 1 << 34) -> None:
        self.path = os.path.abspath(path)
        self._entry = acquire_env(self.path, map_size, False)
        self._env = self._entry.env
        self._closed = False

    def write(self, puts: dict[str, Any], deletes: Iterable[str] = ()) -> None:
        """Apply ``puts`` (key -> picklable value) and ``deletes`` atomically."""
        with self._env.begin(write=True) as txn:
            for k in deletes:
                txn.delete(k.encode())
            for k, v in puts.items():
                txn.put(k.encode(), pickle.dumps(v, protocol=5))

    def load(self) -> dict[str, Any]:
        """Every record, ``{key: value}``.

        Raises:
            CheckpointError: a record cannot be read back (a damaged or foreign file).
        """
        out: dict[str, Any] = {}
        with self._env.begin() as txn:
            for k, v in txn.cursor():
                key = k.decode(errors="replace")
                try:
                    out[key] = pickle.loads(v)
                except Exception as e:  # noqa: BLE001 - any unpickling failure means a damaged record
                    raise CheckpointError(f"online journal {self.path}: record {key!r} is damaged ({e})") from e
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
