"""FragmentClient: producers and trainers of the fragment buffer (MineStudio's data path, generic).

A producer writes the payload to the store (directly on the store's node, through the store actor
elsewhere) and then acknowledges its id with metadata: the payload never passes through the
service. A trainer fetches, reads the payloads (here or with a loader pool) and releases the lease,
or renews it (:meth:`FragmentClient.keep_alive`) while it is held longer than ``lease_ttl``. The
walk-through and the semantics (leases, reference counts, full disks): docs/ray.md, "Fragments".
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ...fragments.buffer import FragmentRef
from ...fragments.contract import CALLS, CLIENT
from ...online.heartbeat import KeepAlive
from ...table import contract
from .._runtime import get, rpc_timeout
from .store import LocalStore, RemoteStore, open_store


@dataclass(frozen=True)
class Fetch:
    """The result of one fetch: a lease id and its fragment records (chunk by chunk).

    The payloads stay readable until the lease is released (:meth:`FragmentClient.release`) or the
    same client fetches again (with ``auto_release``).
    """

    lease_id: str
    records: list[FragmentRef]

    def __len__(self) -> int:
        return len(self.records)


class FragmentClient:
    """Client of a service's fragment buffer.

    Args:
        actor: the service's actor handle.
        name: the service's name.
        rpc_grace: seconds to wait for calls that never block, and beyond a fetch's own timeout.
        client_id: identifies this client's leases (default: a new uuid). With ``auto_release``,
            a fetch releases this client's previous lease (MineStudio's lifetime: the last fetch
            stays readable until the next one).

    Picklable (the store handle is reopened on first use in the receiving process).
    """

    def __init__(
        self,
        actor: Any,
        name: str,
        rpc_grace: float | None = 60.0,
        client_id: str | None = None,
        auto_release: bool = True,
    ) -> None:
        self.actor = actor
        self.name = name
        self.rpc_grace = rpc_grace
        self.client_id = client_id or uuid.uuid4().hex
        self.auto_release = auto_release
        self._store: LocalStore | RemoteStore | None = None
        self._info: dict[str, Any] | None = None

    def __reduce__(self) -> tuple:
        return (FragmentClient, (self.actor, self.name, self.rpc_grace, self.client_id, self.auto_release))

    def _call(self, method: str, *args: Any, op_timeout: float | None = 0.0) -> Any:
        return get(
            getattr(self.actor, method).remote(*args), rpc_timeout(op_timeout, self.rpc_grace), f"{self.name}.{method}"
        )

    @property
    def store_info(self) -> dict[str, Any]:
        """``path``, ``num_shards``, ``map_size`` and ``node_id`` of the service's store."""
        if self._info is None:
            self._info = self._call("store_info")
        return self._info

    @property
    def store(self) -> Any:
        """The store: opened directly on its node, through the store actor elsewhere.

        With node-local stores, a :class:`~replaystore.ray.fragments.node_stores.NodeStoreClient` (puts into
        this node's store, reads from the node holding each fragment).
        """
        if self._store is None:
            if self.store_info.get("node_local") is not None:
                from .node_stores import NodeStoreClient

                self._store = NodeStoreClient(self.actor, self.store_info, self.rpc_grace)
            else:
                self._store = open_store(self.actor, self.store_info, self.rpc_grace)
        return self._store

    # -- producers -----------------------------------------------------------------------------------
    def put(self, payload: Any) -> str:
        """Write a payload to the store; return its fragment id (not yet known to the buffer).

        Raises ``rs.DiskFull`` when the store's disk is full (node-local stores: naming the node;
        nothing is written) and, node-local through another node's store, ``NodeLost``.
        """
        return self.store.put(payload)

    def add(self, fragment_id: str, stream: str, seq: int, version: int, session: str) -> str:
        """Acknowledge a stored fragment.

        Returns ``"pending"``, ``"chunk"``, ``"stale"``, ``"duplicate"`` or (node-local stores: its
        node was dropped) ``"lost"``.
        """
        return self._call("add_fragment", fragment_id, stream, int(seq), int(version), session)

    def add_many(self, records: list[tuple[str, str, int, int, str]]) -> list[str]:
        """Acknowledge several ``(fragment_id, stream, seq, version, session)`` in one call."""
        return self._call("add_fragments", [tuple(r) for r in records])

    def write(self, payload: Any, stream: str, seq: int, version: int, session: str) -> str:
        """``put`` then ``add``; returns the fragment id."""
        fid = self.put(payload)
        self.add(fid, stream, seq, version, session)
        return fid

    # -- trainers ------------------------------------------------------------------------------------------
    def fetch(self, num_fragments: int, timeout: float | None = None) -> Fetch:
        """Fetch ``num_fragments`` fragments (whole chunks, chosen uniformly without replacement).

        Waits while too few chunks exist. Raises ``rs.Timeout`` after ``timeout`` seconds
        (``None``: wait forever), ``ValueError`` for an impossible request.
        """
        client = self.client_id if self.auto_release else None
        lease, records = self._call("fetch_fragments", num_fragments, timeout, client, op_timeout=timeout)
        return Fetch(lease, [FragmentRef(*r) for r in records])

    def release(self, fetch: Fetch | str) -> int:
        """Release a fetch (its payloads may be deleted); returns its size. ``KeyNotFound`` if not held."""
        return self._call("release", fetch.lease_id if isinstance(fetch, Fetch) else fetch)

    def renew(self, fetch: Fetch | str) -> float:
        """Extend the lease by the buffer's ``lease_ttl``; return the seconds it has left.

        Raises ``KeyNotFound`` if the lease is not held (released, or expired: its payloads may be gone).
        """
        return self._call("renew_lease", fetch.lease_id if isinstance(fetch, Fetch) else fetch)

    @contextlib.contextmanager
    def keep_alive(self, fetch: Fetch | str, period: float | None = None) -> Iterator[None]:
        """Renew the lease from a background thread while the ``with`` block runs.

        ``period``: seconds between renewals (default: a third of the time-to-live). As
        :class:`~replaystore.online.KeepAlive`: a renewal that fails is logged and retried next
        period; one that finds the lease gone (or the service closed) stops the thread.
        """
        lease = fetch.lease_id if isinstance(fetch, Fetch) else fetch
        left = self.renew(lease)
        if left == float("inf"):
            yield
            return
        renewer = SimpleNamespace(renew=lambda _: self.renew(lease))  # KeepAlive's owner: renews the lease
        with KeepAlive(renewer, (), period if period is not None else max(left / 3.0, 0.05)):
            yield

    def prepared(self, fetch: Fetch | str | None = None) -> list[FragmentRef]:
        """Records of a fetch, or of the last fetch by any client."""
        lease = fetch.lease_id if isinstance(fetch, Fetch) else fetch
        return [FragmentRef(*r) for r in self._call("prepared_fragments", lease)]

    def node_of(self, fragment_id: str) -> str | None:
        """The node id holding ``fragment_id`` (one store: the store's node).

        With node-local stores, from the store map this client last read (``None``: its node was
        not attached then).
        """
        if self.store_info.get("node_local") is None:
            return self.store_info["node_id"]
        from .node_stores import label_of

        return self.store_info["nodes"].get(label_of(fragment_id) or "")

    def load(self, fragment_id: str) -> Any:
        """Read a payload (``KeyNotFound`` if it was deleted; node-local: ``NodeLost`` if its node left)."""
        return self.store.get(fragment_id)

    # -- versions and service -------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The fragment buffer's stats."""
        return self._call("stats")["fragments"]

    def compact(self, timeout: float | None = 600.0) -> int:
        """Compact the store online (readers never wait); returns the bytes given back to the file system.

        ``timeout``: seconds to wait for the answer beyond ``rpc_grace`` (``rs.Timeout`` after).
        """
        return self._call("compact_store", op_timeout=timeout)

    def housekeeping(self) -> None:
        """Run the buffer's housekeeping now (expire partial chunks, delete orphans)."""
        self._call("housekeeping")


def _send(client: FragmentClient, method: str, call: contract.Call, a: dict[str, Any]) -> Any:
    """``FragmentClient.<served>``: one Ray call of the service's method."""
    return client._call(method, *a.values())


contract.forward(FragmentClient, {n: CALLS[n] for n in CLIENT}, send=_send)
