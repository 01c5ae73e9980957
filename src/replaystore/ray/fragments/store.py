"""Reaching a FragmentStore from any node: directly on its node, through a store actor elsewhere.

:class:`StoreServer` is the actor class placed on the store's node (next to the replay service);
:func:`open_store` returns a :class:`LocalStore` when the caller runs on that node and a
:class:`RemoteStore` otherwise. Both have the same small interface: ``put``, ``get``, ``delete``,
``contains``, ``close``.
"""

from __future__ import annotations

from typing import Any

from ...errors import Closed
from ...storage.fragments import FragmentStore
from .._runtime import get, import_ray


class _StoreCalls:
    """The calls both store fronts answer, delegated to ``self.store`` (a :class:`FragmentStore`)."""

    store: FragmentStore

    def put(self, value: Any) -> str:
        """Store ``value``; return its new id."""
        return self.store.put(value)

    def get(self, fragment_id: str) -> Any:
        """The value of ``fragment_id`` (``KeyNotFound`` if missing)."""
        return self.store.get(fragment_id)

    def delete(self, fragment_ids: list[str]) -> int:
        """Delete payloads; return how many existed."""
        return self.store.delete(fragment_ids)

    def contains(self, fragment_id: str) -> bool:
        """Whether ``fragment_id`` is stored."""
        return fragment_id in self.store

    def size(self) -> int:
        """Number of stored payloads."""
        return len(self.store)


class StoreServer(_StoreCalls):
    """Actor class wrapping a :class:`FragmentStore` on the store's node (one per service)."""

    def __init__(self, path: str, num_shards: int, map_size: int) -> None:
        self.store = FragmentStore(path, num_shards, map_size)


class LocalStore(_StoreCalls):
    """The store opened directly (caller on the store's node). Thread-safe."""

    local = True

    def __init__(self, info: dict[str, Any]) -> None:
        self.store = FragmentStore(info["path"], info["num_shards"], info["map_size"])

    def close(self) -> None:
        """Release the handle."""
        self.store.close()


class RemoteStore:
    """The store through the service's store actor (caller on another node).

    Each call is one Ray call with a timeout of ``timeout`` seconds; payloads travel through Ray's
    object store. If the actor died (the service restarted), the handle is fetched again once.
    """

    local = False

    def __init__(self, service: Any, timeout: float | None = 120.0) -> None:
        self.service = service
        self.timeout = timeout
        self._actor = None

    def _call(self, method: str, *args: Any) -> Any:
        for attempt in range(2):
            if self._actor is None:
                self._actor = get(self.service.store_actor.remote(), self.timeout, "store_actor")[0]
            try:
                return get(getattr(self._actor, method).remote(*args), self.timeout, f"store.{method}")
            except Closed:
                self._actor = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def put(self, value: Any) -> str:
        """Write ``value`` on the store's node; return its id."""
        return self._call("put", value)

    def get(self, fragment_id: str) -> Any:
        """Read a payload from the store's node."""
        return self._call("get", fragment_id)

    def delete(self, fragment_ids: list[str]) -> int:
        """Delete payloads; return how many existed."""
        return self._call("delete", list(fragment_ids))

    def contains(self, fragment_id: str) -> bool:
        """Whether ``fragment_id`` is stored."""
        return self._call("contains", fragment_id)

    def size(self) -> int:
        """Number of stored payloads."""
        return self._call("size")

    def close(self) -> None:
        """Nothing to release (the actor belongs to the service)."""


def start_store(cls: type, name: str, namespace: str | None, node_id: str, *args: Any) -> Any:
    """The store actor ``name`` (``cls(*args)``) pinned to ``node_id``: started, or the running one of that name."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options = dict(name=name, namespace=namespace, get_if_exists=True, num_cpus=0, max_concurrency=16)
    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return import_ray().remote(cls).options(**options, scheduling_strategy=strategy).remote(*args)


def open_store(service: Any, info: dict[str, Any], timeout: float | None = 120.0) -> LocalStore | RemoteStore:
    """Open the service's store: directly if this process runs on its node, else through its actor."""
    ray = import_ray()
    if ray.get_runtime_context().get_node_id() == info["node_id"]:
        return LocalStore(info)
    return RemoteStore(service, timeout)
