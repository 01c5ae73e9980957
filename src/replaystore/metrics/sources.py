"""Where metrics come from: one snapshot of a local table, a Ray service, a sharded table or a shared table.

Every source reads through public calls only (``stats()``, ``ping()``; for a shared table
:meth:`~replaystore.shared.SharedTable.lock_state`) and returns one plain, JSON-able dict:

``{"source": kind, "name": str, "time": unix seconds, "tables": {table: {"stats": dict,
"shards": [dict | None] (sharded only), "nodes": [node id per shard] (sharded only)}},
"fragments": dict | None, "online": dict | None, "lock": dict | None, "service": dict | None}``

A source that cannot be read now (no such service, a restart under way, a shard down) raises
:class:`~replaystore.errors.Unavailable` naming it; the next :meth:`read` tries again from the
start (a restarted Ray service is looked up anew), so a dashboard recovers by itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from ..errors import ReplayError, Unavailable
from ..sharding.sampling import total_stats as merge_shards


class Source(Protocol):
    """What a :class:`~replaystore.metrics.Recorder` reads."""

    kind: str
    name: str

    def read(self) -> dict[str, Any]:  # noqa: D102
        ...

    def close(self) -> None:  # noqa: D102
        ...


def _snapshot(kind: str, name: str, **parts: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"source": kind, "name": name, "time": time.time(), "tables": {}}
    out.update({k: None for k in ("fragments", "online", "lock", "service")})
    out.update(parts)
    return out


class TableSource:
    """A table of this process (a ``Table``, ``SharedTable``, or anything with a Table's ``stats()``).

    Args:
        tables: one table, or ``{name: table}`` for several.
        name: the source's name on the page (default: the first table's name).
        online: rollout buffers of this process (``replaystore.online.RolloutBuffer``), one or
            ``{name: buffer}``: their staleness budget, tickets, groups and refusals are charted.

    Thread-safe as the tables' ``stats()`` are. Never raises :class:`Unavailable` (a closed table
    still reports its last state).

    Raises:
        ValueError: no table.
    """

    kind = "table"

    def __init__(self, tables: Any, name: str | None = None, online: Any = None) -> None:
        if not isinstance(tables, Mapping):
            tables = {getattr(tables, "name", "table"): tables}
        if not tables:
            raise ValueError("TableSource needs at least one table")
        self.tables = dict(tables)
        self.name = name or next(iter(self.tables))
        if online is not None and not isinstance(online, Mapping):
            online = {getattr(online, "name", "online"): online}
        self.online = dict(online or {})

    def read(self) -> dict[str, Any]:
        """One snapshot of every table's and rollout buffer's ``stats()``."""
        tables = {n: {"stats": t.stats()} for n, t in self.tables.items()}
        online = {n: b.stats() for n, b in self.online.items()} or None
        return _snapshot(self.kind, self.name, tables=tables, online=online)

    def close(self) -> None:
        """Nothing to release (the tables belong to the caller)."""


class ServiceSource:
    """A running replay service (``replaystore.ray.serve``), found by name in the current Ray cluster.

    Args:
        name: the service's actor name. namespace: its Ray namespace.
        rpc_timeout: seconds a ``stats()`` call may take before the service counts as unavailable.

    Raises:
        Unavailable: from :meth:`read` when no service of that name runs (it may be restarting) or it
            does not answer; the next read looks it up again.
    """

    kind = "service"

    def __init__(self, name: str = "replaystore", namespace: str | None = None, rpc_timeout: float = 10.0) -> None:
        self.name = name
        self.namespace = namespace
        self.rpc_timeout = float(rpc_timeout)
        self._client: Any = None

    def _connect(self) -> Any:
        from ..ray import connect

        if self._client is None:
            try:
                self._client = connect(self.name, namespace=self.namespace, rpc_grace=self.rpc_timeout)
            except ReplayError as e:
                raise Unavailable(f"replay service {self.name!r}: {e} (not started yet, or restarting?)") from None
        return self._client

    def read(self) -> dict[str, Any]:
        """The service's ``ping()`` and ``stats()``: its tables, fragment buffer and rollout buffers."""
        client = self._connect()
        try:
            info = client.ping()
            stats = client.stats()
        except Exception as e:  # noqa: BLE001 - a dead actor raises Ray's errors, a restart ours
            self._client = None
            raise Unavailable(f"replay service {self.name!r} does not answer: {type(e).__name__}: {e}") from None
        fragments = stats.pop("fragments", None)
        online = stats.pop("online", None)
        tables = {n: {"stats": st} for n, st in stats.items() if isinstance(st, dict)}
        service = {k: info.get(k) for k in ("node_id", "restarted")}
        return _snapshot(self.kind, self.name, tables=tables, fragments=fragments, online=online, service=service)

    def close(self) -> None:
        """Forget the client (the service keeps running)."""
        self._client = None


class ShardedSource:
    """A sharded table (``replaystore.ray.serve_sharded``): its shard services ``"<name>.shard<i>"``.

    Each shard is read as a :class:`ServiceSource`; a shard that does not answer is ``None`` in
    ``"shards"`` and missing from the total (as ``ShardedClient.stats`` with ``on_dead="skip"``).

    Args:
        name: the sharded table's name. namespace: the shards' Ray namespace.
        shards: how many shards (default: found by looking up ``<name>.shard0``, ``.shard1``, ...).

    Raises:
        Unavailable: from :meth:`read` when no shard answers.
    """

    kind = "sharded"

    def __init__(
        self, name: str, namespace: str | None = None, shards: int | None = None, rpc_timeout: float = 10.0
    ) -> None:
        self.name = name
        self.namespace = namespace
        self.rpc_timeout = rpc_timeout
        self._shards = None if shards is None else [self._shard(i) for i in range(int(shards))]

    def _shard(self, i: int) -> ServiceSource:
        return ServiceSource(f"{self.name}.shard{i}", self.namespace, self.rpc_timeout)

    def read(self) -> dict[str, Any]:
        """Every shard's stats, per table: ``{"stats": total, "shards": [...], "nodes": [...]}``."""
        shards = self._shards if self._shards is not None else self._find()
        if not shards:
            raise Unavailable(f"sharded table {self.name!r}: no shard service {self.name + '.shard0'!r} is running")
        per: list[dict[str, Any] | None] = []
        errors = []
        for s in shards:
            try:
                per.append(s.read())
            except Unavailable as e:
                per.append(None)
                errors.append(str(e))
        if all(p is None for p in per):
            raise Unavailable(f"sharded table {self.name!r}: no shard answers ({'; '.join(errors)})")
        names = sorted({t for p in per if p is not None for t in p["tables"]})
        tables = {}
        for t in names:
            stats = [None if p is None else p["tables"].get(t, {}).get("stats") for p in per]
            nodes = [None if p is None else (p["service"] or {}).get("node_id") for p in per]
            tables[t] = {"stats": merge_shards(stats), "shards": stats, "nodes": nodes}
        return _snapshot(self.kind, self.name, tables=tables, errors=errors)

    def _find(self) -> list[ServiceSource]:
        """Shard services ``<name>.shard0 ...`` that exist now (looked up each read until some are found)."""
        from ..ray import import_ray

        ray = import_ray()
        found = []
        while True:
            try:
                ray.get_actor(f"{self.name}.shard{len(found)}", namespace=self.namespace)
            except ValueError:
                break
            found.append(self._shard(len(found)))
        if found:
            self._shards = found
        return found

    def close(self) -> None:
        """Forget the shard clients."""
        for s in self._shards or []:
            s.close()


class SharedSource:
    """A shared-memory table (``replaystore.shared``) attached by name, with its lock's activity.

    The lock's figures cost the table nothing: the segment's words are read from outside. A
    background thread looks at the lock word ``lock_hz`` times a second; the fraction of looks
    that found it held is ``"held_fraction"`` (the lock's utilisation), the mean of the waiting
    word ``"waiting_mean"`` (by Little's law, mean wait = waiting_mean / acquisitions per second).

    Args:
        name: the shared table's name. directory: its segment directory (default ``/dev/shm``).

    Raises:
        Unavailable: from :meth:`read` while there is no such table (it attaches on the first read
            that finds it).
    """

    kind = "shared"

    def __init__(self, name: str, directory: str | None = None, lock_hz: float = 200.0) -> None:
        self.name = name
        self.directory = directory
        self.lock_hz = float(lock_hz)
        self._table: Any = None
        self._looks = self._held = self._waiting = 0
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _attach(self) -> Any:
        if self._table is None:
            from ..shared import SharedTable, SharedTableNotFound

            try:
                self._table = SharedTable.attach(self.name, self.directory)
            except (SharedTableNotFound, FileNotFoundError) as e:
                raise Unavailable(f"shared table {self.name!r}: {e}") from None
            if self._thread is None and self.lock_hz > 0:
                self._thread = threading.Thread(target=self._watch, name="replaystore-lock-watch", daemon=True)
                self._thread.start()
        return self._table

    def _watch(self) -> None:
        period = 1.0 / self.lock_hz
        while not self._stop.wait(period):
            table = self._table
            if table is None:
                continue
            word = table.lock_state()
            with self._guard:
                self._looks += 1
                self._held += bool(word["busy"])
                self._waiting += word["waiting"]

    def read(self) -> dict[str, Any]:
        """The table's ``stats()`` and its lock: acquisitions, held fraction and mean waiters since the last read."""
        table = self._attach()
        stats = table.stats()
        lock = dict(table.lock_state())
        with self._guard:
            looks, held, waiting = self._looks, self._held, self._waiting
            self._looks = self._held = self._waiting = 0
        lock["held_fraction"] = held / looks if looks else None
        lock["waiting_mean"] = waiting / looks if looks else None
        return _snapshot(self.kind, self.name, tables={stats["name"]: {"stats": stats}}, lock=lock)

    def close(self) -> None:
        """Stop watching the lock and detach (the table stays)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if self._table is not None:
            self._table.close()
            self._table = None
