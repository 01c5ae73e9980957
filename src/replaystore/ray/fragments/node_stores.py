"""Node-local fragment stores: one store per node, and the router the fragment buffer deletes through.

docs/ray.md, "Fragments", "Node-local stores", is the contract: which nodes keep a store, where
(:func:`node_dir`) and under which actor name (:func:`store_actor_name`), how a node's label is
chosen (:func:`node_labels`), fragment ids ``"<time>-<uuid>@<label>"`` naming their store
(:func:`label_of`). Here: :class:`NodeStoreServer`, a node's store actor (hard node affinity);
:class:`NodeStores`, the service-side router with the :class:`FragmentStore` methods the
:class:`~replaystore.fragments.buffer.FragmentBuffer` calls, each node's share to its store
(:meth:`NodeStores.refresh` starts stores on new nodes and reports lost ones, which the buffer
drops: :meth:`FragmentBuffer.drop_node`); :class:`NodeStoreClient`, a client's puts and reads.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ...errors import DiskFull, KeyNotFound, StorageError
from ...fragments.records import SEP, FragmentBufferConfig, label_of
from ...storage.fragments import FragmentStore, new_fragment_id
from ...table import contract
from .._runtime import get, import_ray, kill
from .store import StoreServer, on_store, start_store

log = logging.getLogger("replaystore")

LABEL_KEY = "replaystore-store"  # a Ray node label naming the node's store (stable across restarts)


class NodeLost(KeyNotFound):
    """The payload lived on a node that left the cluster (its store is gone with it)."""


def node_dir(path: str, label: str) -> str:
    """Directory of the store of node ``label`` under the buffer's ``path``."""
    return os.path.join(path, f"node-{label}")


def store_actor_name(service: str, label: str) -> str:
    """The Ray actor name of node ``label``'s store of ``service``."""
    return f"{service}:store:{label}"


def node_labels(resource: str) -> dict[str, str]:
    """``{label: node_id}`` of the alive nodes declaring ``resource`` (labels: docs/ray.md, "Node-local stores").

    A ``replaystore-store`` node label declared by two alive nodes is ignored for both (logged).
    """
    ray = import_ray()
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(resource, 0) > 0]
    named = [(n.get("Labels") or {}).get(LABEL_KEY) for n in nodes]
    dup = {x for x in named if x is not None and named.count(x) > 1}
    if dup:
        log.warning("node stores: nodes share the %s label(s) %s; using their ids instead", LABEL_KEY, sorted(dup))
    ips = [n.get("NodeManagerAddress") for n in nodes]
    unique = len(set(ips)) == len(ips)
    out = {}
    for n, name in zip(nodes, named):
        if name is not None and name not in dup:
            out[name] = n["NodeID"]
        else:
            out[n["NodeManagerAddress"] if unique else n["NodeID"][:16]] = n["NodeID"]
    return out


def node_full(error: DiskFull, label: str, node_id: str | None) -> DiskFull:
    """``error`` restated to name the node store that is full (same ``path`` and ``wanted``)."""
    where = f"node store {label!r}" + (f" (node {node_id})" if node_id else "")
    return DiskFull(f"{where} is full: {error.message}", error.path, error.wanted)


class NodeStoreServer(StoreServer):
    """Actor class: the store of node ``label`` (``config``'s settings). Its ``put`` returns ids naming ``label``."""

    def __init__(self, config: FragmentBufferConfig, label: str) -> None:
        self.label = label
        self.store = config.open_store(node_dir(config.path, label))

    def put(self, value: Any) -> str:
        """Store ``value``; return its new id ``"<time>-<uuid>@<label>"`` (``DiskFull`` naming this node)."""
        try:
            return self.store.put(value, new_fragment_id() + SEP + self.label)
        except DiskFull as e:
            raise node_full(e, self.label, self.node_id()) from None

    def keys(self) -> list[str]:
        """Every stored id."""
        return list(self.store.keys())

    def space(self) -> dict[str, Any]:
        """``{"node_id", "payloads", "disk_bytes", "live_bytes", "free_bytes"}`` of this node's store.

        ``free_bytes``: what the file system holding the store has left for unprivileged writes.
        """
        st = os.statvfs(self.store.path)
        return {
            "node_id": self.node_id(),
            "payloads": len(self.store),
            "disk_bytes": self.store.disk_usage(),
            "live_bytes": self.store.live_bytes(),
            "free_bytes": st.f_bavail * st.f_frsize,
        }

    def node_id(self) -> str:
        """The node this store runs on."""
        return import_ray().get_runtime_context().get_node_id()


contract.forward(NodeStoreServer, {n: contract.Call(n, of=FragmentStore) for n in ("clear", "compact")}, send=on_store)


class NodeStores:
    """The service's router over the node stores (the buffer's ``store`` with ``node_local`` set).

    Args:
        config: the buffer's configuration: its store settings (each node gets ``node_dir(path,
            label)``) and ``node_local``, the Ray resource that marks a node as keeping a store.
        service: the service's name (store actors are named after it).
        namespace: the service's Ray namespace.
        timeout: seconds for each call to a store actor.

    Deletes are sent without waiting (a payload a failed delete leaves behind is an orphan the
    orphan scan collects); ``delete`` returns the count of earlier deletes that completed. Ids of
    nodes not attached (lost) are skipped. Not thread-safe: the service calls it from its loop.
    """

    def __init__(
        self, config: FragmentBufferConfig, service: str, namespace: str | None, timeout: float = 30.0
    ) -> None:
        self.config, self.service, self.namespace, self.timeout = config, service, namespace, timeout
        self.actors: dict[str, Any] = {}
        self.nodes: dict[str, str] = {}  # label -> node id
        self._deleting: list[Any] = []
        self.starting: set[str] = set()  # labels of alive nodes whose store did not answer yet
        self._unreported, _ = self.refresh()  # reported by the first check (the buffer reconciles them)

    # -- membership ----------------------------------------------------------------------------------
    def refresh(self) -> tuple[list[str], list[str]]:
        """Start stores on new nodes, forget dead ones; return ``(attached, lost)`` labels.

        ``attached``: stores started by this call: on nodes new to the router, including a label
        that came back on another node (a restarted node declaring the same label: its store
        reopens the same directory). A store that does not answer within ``timeout`` is left
        unattached and listed in ``starting`` (its node is alive: not lost; tried again at the next
        refresh). ``lost``: labels whose node is not alive.
        """
        alive = node_labels(self.config.node_local)
        lost = [lb for lb in self.actors if lb not in alive]
        moved = [lb for lb in self.actors if lb in alive and alive[lb] != self.nodes[lb]]
        for lb in lost + moved:
            del self.actors[lb], self.nodes[lb]
        started = {}
        for lb, nid in alive.items():
            if lb not in self.actors:
                name = store_actor_name(self.service, lb)
                started[lb] = start_store(NodeStoreServer, name, self.namespace, nid, self.config, lb)
        attached = []
        self.starting = set()
        for lb, actor in started.items():
            try:  # a handle of the store's previous life (its node just left) fails here
                if get(actor.node_id.remote(), self.timeout, f"node store {lb} start") != alive[lb]:
                    raise StorageError(f"node store {lb!r} answered from another node")
            except Exception:  # noqa: BLE001 - not attached now; the next refresh tries again
                log.warning("node store %s did not start; retried at the next refresh", lb, exc_info=True)
                self.starting.add(lb)
                continue
            self.actors[lb], self.nodes[lb] = actor, alive[lb]
            attached.append(lb)
        earlier = [lb for lb in getattr(self, "_unreported", ()) if lb in self.actors and lb not in attached]
        self._unreported = []
        return earlier + attached, lost

    def info(self) -> dict[str, str]:
        """``{label: node_id}`` of the attached stores."""
        return dict(self.nodes)

    def _all(self, method: str, *args: Any, only: str | None = None) -> dict[str, Any]:
        """Call ``method`` on every attached store (or on ``only``); answers by label (failing stores skipped)."""
        refs = {lb: getattr(a, method).remote(*args) for lb, a in self.actors.items() if only in (None, lb)}
        out = {}
        for lb, ref in refs.items():
            try:
                out[lb] = get(ref, self.timeout, f"node store {lb}.{method}")
            except StorageError:
                raise
            except Exception:  # noqa: BLE001 - a dying node: housekeeping drops it
                log.warning("node store %s: %s failed", lb, method, exc_info=True)
        return out

    # -- the FragmentStore methods the buffer calls ---------------------------------------------------
    def delete(self, fragment_ids: list[str]) -> int:
        """Send each node's share of ``fragment_ids`` to its store; return completed earlier deletes."""
        ray = import_ray()
        by_node: dict[str, list[str]] = {}
        for fid in fragment_ids:
            lb = label_of(fid)
            if lb in self.actors:
                by_node.setdefault(lb, []).append(fid)
        self._deleting += [self.actors[lb].delete.remote(ids) for lb, ids in by_node.items()]
        if not self._deleting:
            return 0
        done, self._deleting = ray.wait(self._deleting, num_returns=len(self._deleting), timeout=0)
        n = 0
        for ref in done:
            try:
                n += ray.get(ref)
            except Exception:  # noqa: BLE001 - left as orphans
                log.warning("node store delete failed", exc_info=True)
        return n

    def keys(self) -> list[str]:
        """Ids stored on every attached node."""
        return [k for ks in self._all("keys").values() for k in ks]

    def keys_of(self, label: str) -> set[str] | None:
        """Ids stored on node ``label`` (``None`` if its store does not answer)."""
        stored = self._all("keys", only=label)
        return set(stored[label]) if label in stored else None

    def clear(self) -> None:
        """Delete every payload on every attached node."""
        self._all("clear")

    def compact(self, labels: list[str] | None = None) -> int:
        """Compact the stores of ``labels`` (default: every node); return the bytes given back.

        ``DiskFull`` (naming the node) if a node has no room for the copy; the others are compacted.
        """
        if labels is None:
            return sum(self._all("compact").values())
        refs = {lb: self.actors[lb].compact.remote() for lb in labels if lb in self.actors}
        freed, full = 0, None
        for lb, ref in refs.items():
            try:
                freed += get(ref, self.timeout, f"node store {lb}.compact")
            except DiskFull as e:
                full = node_full(e, lb, self.nodes.get(lb))
        if full is not None:
            raise full
        return freed

    def node_space(self) -> dict[str, dict[str, Any]]:
        """``{label: NodeStoreServer.space()}`` of every store that answers."""
        return self._all("space")

    def disk_usage(self) -> int:
        """Bytes the attached stores' file systems hold."""
        return sum(s["disk_bytes"] for s in self.node_space().values())

    def live_bytes(self) -> int:
        """Bytes of live pages in the attached stores."""
        return sum(s["live_bytes"] for s in self.node_space().values())

    def close(self) -> None:
        """Kill the store actors (their data stays on disk)."""
        for a in self.actors.values():
            kill(a)
        self.actors.clear()
        self.nodes.clear()


class NodeStoreClient:
    """A client's view of node-local stores: ``put`` into this node's store, ``get`` from the holder's.

    Args:
        service: the replay service's actor handle (asked again for the store map when an unknown
            label shows up).
        info: the service's ``store_info()``.
        timeout: seconds for each call to a store actor.

    ``put`` writes directly into this node's directory when this node keeps a store (no payload
    hop), else through the store actor on the service's node (or any store). ``get`` reads directly
    when the fragment is on this node, else through its node's store actor (one hop), and raises
    :class:`NodeLost` when its node is not attached. Thread-safe.
    """

    local = True

    def __init__(self, service: Any, info: dict[str, Any], timeout: float | None = 120.0) -> None:
        self.service, self.info, self.timeout = service, info, timeout
        self.here = import_ray().get_runtime_context().get_node_id()
        self._local: dict[str, FragmentStore] = {}
        self._actors: dict[str, Any] = {}

    def _refresh(self) -> None:
        self.info = get(self.service.store_info.remote(), self.timeout, "store_info")

    def _mine(self) -> str | None:
        return next((lb for lb, nid in self.info["nodes"].items() if nid == self.here), None)

    def _open(self, label: str) -> FragmentStore:
        if label not in self._local:
            self._local[label] = FragmentStore(  # writemap: as the node's store recorded it
                node_dir(self.info["path"], label),
                self.info["num_shards"],
                self.info["map_size"],
                sync=bool(self.info.get("sync", False)),
            )
        return self._local[label]

    def _actor(self, label: str) -> Any:
        if label not in self.info["nodes"]:
            self._refresh()
            if label not in self.info["nodes"]:
                raise NodeLost(f"node store {label!r} is not attached (its node left the cluster)")
        if label not in self._actors:
            ray = import_ray()
            try:
                self._actors[label] = ray.get_actor(
                    store_actor_name(self.info["service"], label), namespace=self.info["namespace"]
                )
            except ValueError:  # the named actor is gone: its node left
                self._refresh()
                raise NodeLost(f"node store {label!r} is gone (its node left the cluster)") from None
        return self._actors[label]

    def _remote(self, label: str, method: str, *args: Any) -> Any:
        """Call a store actor, looking the store up again once after a dead handle.

        A dead handle: the service restarted (new store actors) or the node left (``NodeLost`` if
        the store is no longer attached).
        """
        from ...errors import Closed

        for attempt in range(2):
            try:
                return get(
                    getattr(self._actor(label), method).remote(*args), self.timeout, f"node store {label}.{method}"
                )
            except Closed:
                self._actors.pop(label, None)
                self._refresh()
                if attempt:
                    break
        raise NodeLost(f"node store {label!r} is gone (its node left the cluster)")

    def put(self, value: Any) -> str:
        """Store ``value`` on this node (through a store actor if this node keeps none); return its id."""
        label = self._mine()
        if label is None:
            self._refresh()
            label = self._mine()
        if label is not None:
            try:
                return self._open(label).put(value, new_fragment_id() + SEP + label)
            except DiskFull as e:
                raise node_full(e, label, self.here) from None
        nodes = self.info["nodes"]
        if not nodes:
            raise NodeLost(f"no node declares the resource {self.info['node_local']!r}: no store to write to")
        target = next((lb for lb, nid in nodes.items() if nid == self.info["node_id"]), next(iter(nodes)))
        return self._remote(target, "put", value)

    def _where(self, fragment_id: str) -> str:
        label = label_of(fragment_id)
        if label is None:
            raise KeyNotFound(f"fragment id {fragment_id!r} names no node store")
        return label

    def get(self, fragment_id: str) -> Any:
        """The payload (``NodeLost`` if its node left, ``KeyNotFound`` if it was deleted)."""
        label = self._where(fragment_id)
        if self.info["nodes"].get(label) == self.here:
            return self._open(label).get(fragment_id)
        return self._remote(label, "get", fragment_id)

    def delete(self, fragment_ids: list[str]) -> int:
        """Delete payloads (each on its node); return how many existed."""
        by_node: dict[str, list[str]] = {}
        for fid in fragment_ids:
            by_node.setdefault(self._where(fid), []).append(fid)
        return sum(self._remote(lb, "delete", ids) for lb, ids in by_node.items())

    def contains(self, fragment_id: str) -> bool:
        """Whether the payload is stored on its node."""
        label = self._where(fragment_id)
        if self.info["nodes"].get(label) == self.here:
            return fragment_id in self._open(label)
        return self._remote(label, "contains", fragment_id)

    def close(self) -> None:
        """Release the directly opened stores."""
        for s in self._local.values():
            s.close()
        self._local.clear()


__all__ = [
    "NodeLost",
    "NodeStoreClient",
    "NodeStoreServer",
    "NodeStores",
    "LABEL_KEY",
    "SEP",
    "label_of",
    "node_dir",
    "node_full",
    "node_labels",
    "store_actor_name",
]
