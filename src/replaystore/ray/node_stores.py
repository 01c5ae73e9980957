"""Node-local fragment stores: one store per node, and the router the fragment buffer deletes through.

With ``FragmentBufferConfig(node_local="database")`` every alive node that declares the Ray
resource ``database`` keeps its own :class:`~replaystore.storage.fragments.FragmentStore` in
``<path>/node-<label>``, served by a :class:`NodeStoreServer` actor pinned to that node (hard node
affinity), named ``"<service>:store:<label>"``. A fragment id names its store:
``"<time>-<uuid>@<label>"`` (:func:`label_of`), so the metadata, every fetched record and every
loader know where a payload is without asking.

:class:`NodeStores` is the service-side router: it has the :class:`FragmentStore` methods the
:class:`~replaystore.ray.fragment_buffer.FragmentBuffer` calls (``delete``, ``keys``, ``clear``,
``compact``, ``disk_usage``, ``live_bytes``, ``close``) and sends each node's share to that node's
store actor. :meth:`NodeStores.refresh` (run by housekeeping) starts stores on new nodes and
reports nodes that died; the buffer then drops their fragments (:meth:`FragmentBuffer.drop_node`).

The label of a node is its IP address when that is unique among the nodes declaring the resource
(a real cluster: a node restarted with its disk comes back under the same label and is
re-attached), else its node id (a simulated cluster on one machine).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..errors import KeyNotFound, StorageError
from ..storage.fragments import FragmentStore, new_fragment_id
from ._runtime import get, import_ray
from .store import StoreServer

log = logging.getLogger("replaystore")

SEP = "@"


class NodeLost(KeyNotFound):
    """The payload lived on a node that left the cluster (its store is gone with it)."""


def label_of(fragment_id: str) -> str | None:
    """The store label a node-local fragment id names (``None`` for a one-store id)."""
    _, sep, label = fragment_id.rpartition(SEP)
    return label if sep else None


def node_dir(path: str, label: str) -> str:
    """Directory of the store of node ``label`` under the buffer's ``path``."""
    return os.path.join(path, f"node-{label}")


def store_actor_name(service: str, label: str) -> str:
    """The Ray actor name of node ``label``'s store of ``service``."""
    return f"{service}:store:{label}"


def node_labels(resource: str) -> dict[str, str]:
    """``{label: node_id}`` of the alive nodes declaring ``resource`` (see the module doc for labels)."""
    ray = import_ray()
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(resource, 0) > 0]
    ips = [n.get("NodeManagerAddress") for n in nodes]
    unique = len(set(ips)) == len(ips)
    return {(n["NodeManagerAddress"] if unique else n["NodeID"][:16]): n["NodeID"] for n in nodes}


class NodeStoreServer(StoreServer):
    """Actor class: the store of one node. Its ``put`` returns ids naming this node's label."""

    def __init__(self, path: str, num_shards: int, map_size: int, label: str) -> None:
        self.label = label
        self.store = FragmentStore(path, num_shards, map_size)

    def put(self, value: Any) -> str:
        """Store ``value``; return its new id ``"<time>-<uuid>@<label>"``."""
        return self.store.put(value, new_fragment_id() + SEP + self.label)

    def keys(self) -> list[str]:
        """Every stored id."""
        return list(self.store.keys())

    def clear(self) -> None:
        """Delete every payload."""
        self.store.clear()

    def compact(self) -> int:
        """Compact the store online; return the bytes given back."""
        return self.store.compact()

    def space(self) -> tuple[int, int]:
        """``(disk_usage, live_bytes)`` of the store."""
        return self.store.disk_usage(), self.store.live_bytes()

    def node_id(self) -> str:
        """The node this store runs on."""
        return import_ray().get_runtime_context().get_node_id()


class NodeStores:
    """The service's router over the node stores (the buffer's ``store`` with ``node_local`` set).

    Args:
        path, num_shards, map_size: the buffer's store settings (each node gets ``node_dir(path, label)``).
        resource: the Ray resource that marks a node as keeping a store.
        service: the service's name (store actors are named after it).
        namespace: the service's Ray namespace.
        timeout: seconds for each call to a store actor.

    Deletes are sent without waiting (a payload a failed delete leaves behind is an orphan the
    orphan scan collects); ``delete`` returns the count of earlier deletes that completed. Ids of
    nodes not attached (lost) are skipped. Not thread-safe: the service calls it from its loop.
    """

    def __init__(
        self,
        path: str,
        num_shards: int,
        map_size: int,
        resource: str,
        service: str,
        namespace: str | None,
        timeout: float = 30.0,
    ) -> None:
        self.path, self.num_shards, self.map_size = path, num_shards, map_size
        self.resource, self.service, self.namespace, self.timeout = resource, service, namespace, timeout
        self.actors: dict[str, Any] = {}
        self.nodes: dict[str, str] = {}  # label -> node id
        self._deleting: list[Any] = []
        self.refresh()

    # -- membership ----------------------------------------------------------------------------------
    def refresh(self) -> tuple[list[str], list[str]]:
        """Start stores on new nodes, forget dead ones; return ``(attached, lost)`` labels."""
        ray = import_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = node_labels(self.resource)
        lost = [lb for lb in self.actors if lb not in alive or alive[lb] != self.nodes[lb]]
        for lb in lost:
            del self.actors[lb], self.nodes[lb]
        attached = []
        for lb, nid in alive.items():
            if lb in self.actors:
                continue
            actor = (
                ray.remote(NodeStoreServer)
                .options(
                    name=store_actor_name(self.service, lb),
                    namespace=self.namespace,
                    get_if_exists=True,
                    num_cpus=0,
                    max_concurrency=16,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False),
                )
                .remote(node_dir(self.path, lb), self.num_shards, self.map_size, lb)
            )
            self.actors[lb], self.nodes[lb] = actor, nid
            attached.append(lb)
        if attached:
            get([self.actors[lb].size.remote() for lb in attached], self.timeout, "node store start")
        return attached, lost

    def info(self) -> dict[str, str]:
        """``{label: node_id}`` of the attached stores."""
        return dict(self.nodes)

    def _all(self, method: str, *args: Any) -> dict[str, Any]:
        """Call ``method`` on every attached store; answers by label (stores that fail are skipped)."""
        refs = {lb: getattr(a, method).remote(*args) for lb, a in self.actors.items()}
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

    def clear(self) -> None:
        """Delete every payload on every attached node."""
        self._all("clear")

    def compact(self) -> int:
        """Compact every node's store; return the bytes given back."""
        return sum(self._all("compact").values())

    def disk_usage(self) -> int:
        """Bytes the attached stores' file systems hold."""
        return sum(s[0] for s in self._all("space").values())

    def live_bytes(self) -> int:
        """Bytes of live pages in the attached stores."""
        return sum(s[1] for s in self._all("space").values())

    def close(self) -> None:
        """Kill the store actors (their data stays on disk)."""
        ray = import_ray()
        for a in self.actors.values():
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
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
            self._local[label] = FragmentStore(
                node_dir(self.info["path"], label), self.info["num_shards"], self.info["map_size"]
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
        from ..errors import Closed

        try:
            return get(getattr(self._actor(label), method).remote(*args), self.timeout, f"node store {label}.{method}")
        except Closed:
            self._actors.pop(label, None)
            raise NodeLost(f"node store {label!r} is gone (its node left the cluster)") from None

    def put(self, value: Any) -> str:
        """Store ``value`` on this node (through a store actor if this node keeps none); return its id."""
        label = self._mine()
        if label is None:
            self._refresh()
            label = self._mine()
        if label is not None:
            return self._open(label).put(value, new_fragment_id() + SEP + label)
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
    "label_of",
    "node_dir",
    "node_labels",
    "store_actor_name",
]
