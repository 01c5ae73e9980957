"""Reaching a FragmentStore from any node: directly on its node, through a store actor elsewhere.

:class:`StoreServer` is the actor class placed on the store's node (next to the replay service);
:func:`open_store` returns a :class:`LocalStore` when the caller runs on that node and a
:class:`RemoteStore` otherwise. Both have the same small interface, :data:`CALLS` (``put``,
``get``, ``delete``, ``contains``, ``size``) plus ``close``: the three fronts' methods are
generated from it with the Table's mechanism (:mod:`replaystore.table.contract`: the store
method's docstring and signature), not written three times.
"""

from __future__ import annotations

import functools
from typing import Any

from ...errors import Closed
from ...storage.fragments import FragmentStore
from ...table import contract
from .._runtime import get, import_ray

_call = functools.partial(contract.Call, of=FragmentStore)

#: the calls every store front answers: served name -> the FragmentStore call it is
CALLS: dict[str, contract.Call] = {
    "put": _call("put"),
    "get": _call("get"),
    "delete": _call("delete"),
    "contains": _call("__contains__"),
    "size": _call("__len__"),
}


def on_store(front: Any, name: str, call: contract.Call, a: dict[str, Any]) -> Any:
    """A store front's generated ``<name>``: the call on ``front.store`` (a :class:`FragmentStore`)."""
    return getattr(front.store, call.name)(*a.values())


class _StoreCalls:
    """The :data:`CALLS` run on ``self.store`` (a :class:`FragmentStore`), methods generated below."""

    store: FragmentStore


contract.forward(_StoreCalls, CALLS, send=on_store)


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

    def close(self) -> None:
        """Nothing to release (the actor belongs to the service)."""


contract.forward(RemoteStore, CALLS, send=lambda self, name, call, a: self._call(name, *a.values()))


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
