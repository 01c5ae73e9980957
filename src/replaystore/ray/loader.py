"""Loader pool and prefetching iterator: read fetched fragments in parallel, next to the store.

``create_loader_pool`` starts :class:`FragmentLoader` actors pinned to the store's node (node
affinity: a loader never lands on a node that lacks the files), or with ``local=True`` a
:class:`LocalLoaderPool` of threads in a trainer on that node; ``data_iter`` streams a fetch's
records through either and yields batches as they complete, each actor's result copied out of
Ray's object store once (:func:`detach`). When to use which: docs/ray.md, "Fragments".
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..errors import InvalidArgument, Timeout
from ._runtime import get, import_ray
from .detach import detach


class FragmentLoader:
    """Actor class: reads payloads of one service's store (``load(record)``).

    Args:
        service: name of the replay service.
        namespace: its Ray namespace.
        wrap: builds the result from ``(index, payload)`` (default: ``{"index", "fragment"}``).
    """

    def __init__(
        self, service: str, namespace: str | None = None, wrap: Callable[[Any, Any], Any] | None = None
    ) -> None:
        from .client import connect

        self.fragments = connect(service, namespace=namespace).fragments
        self.fragments.store  # open the store now: the first load should not pay for it  # noqa: B018
        self.wrap = wrap

    def load(self, record: Sequence[Any]) -> Any:
        """Read the payload of ``record = (index, fragment_id)``; ``KeyNotFound`` if it is gone."""
        index, fragment_id = record[0], record[1]
        payload = self.fragments.load(fragment_id)
        if self.wrap is not None:
            return self.wrap(index, payload)
        return {"index": index, "fragment": payload}

    def node_id(self) -> str:
        """The node this loader runs on."""
        return import_ray().get_runtime_context().get_node_id()


class LocalLoaderPool:
    """``num_readers`` threads of this process reading ``service``'s store directly.

    For a trainer on the store's node (checked: ``ValueError`` otherwise). Loads return what a
    :class:`FragmentLoader` returns, with arrays that own their memory (no :func:`detach` needed).
    Use it like the actor pool: pass it to :func:`data_iter`; ``close()`` stops the threads.
    Thread-safe for one ``data_iter`` at a time.
    """

    def __init__(
        self,
        num_readers: int,
        service: str = "replaystore",
        namespace: str | None = None,
        wrap: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        from .client import connect

        if num_readers < 1:
            raise InvalidArgument(f"num_readers must be >= 1, got {num_readers}")
        info = connect(service, namespace=namespace).fragments.store_info
        here = import_ray().get_runtime_context().get_node_id()
        if info["node_id"] != here:
            raise InvalidArgument(
                f"the store of {service!r} is on node {info['node_id']}, this process on {here}: "
                "a local loader pool needs the store's node; use the actor loaders"
            )
        self._loader = FragmentLoader(service, namespace, wrap)
        self._threads = concurrent.futures.ThreadPoolExecutor(int(num_readers), thread_name_prefix="replaystore-load")
        self._running: set[concurrent.futures.Future] = set()

    def submit(self, record: Sequence[Any]) -> None:
        """Start loading ``record``."""
        self._running.add(self._threads.submit(self._loader.load, record))

    def next_loaded(self, timeout: float | None) -> Any:
        """The result of any finished load (its error, if it failed); ``Timeout`` if none finishes in time."""
        done, _ = concurrent.futures.wait(self._running, timeout, concurrent.futures.FIRST_COMPLETED)
        if not done:
            raise Timeout(f"data_iter: no load finished within {timeout:.3g}s")
        future = done.pop()
        self._running.discard(future)
        return future.result()

    def drain(self, timeout: float | None) -> None:
        """Forget every load in flight (those not started are cancelled)."""
        for future in self._running:
            future.cancel()
        concurrent.futures.wait(self._running, timeout)
        self._running.clear()

    def close(self) -> None:
        """Stop the threads and release the store handle."""
        self.drain(None)
        self._threads.shutdown(wait=True)
        self._loader.fragments.store.close()


class _ActorLoads:
    """The actor pool behind the interface :func:`data_iter` uses (results copied out of Ray)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def submit(self, record: Sequence[Any]) -> None:
        self.pool.submit(lambda actor, rec: actor.load.remote(rec), record)

    def next_loaded(self, timeout: float | None) -> Any:
        try:
            item = self.pool.get_next_unordered(timeout=timeout)
        except TimeoutError:
            raise Timeout(f"data_iter: no load finished within {timeout:.3g}s") from None
        except Exception as e:  # a load failed: surface replaystore's error, not Ray's wrapper
            cause = getattr(e, "cause", None)
            raise (cause if isinstance(cause, Exception) else e) from None
        return detach(item)

    def drain(self, timeout: float | None) -> None:
        while self.pool.has_next():
            with contextlib.suppress(Exception):  # draining after an error or an early close
                self.pool.get_next_unordered(timeout=timeout if timeout is not None else 60.0)


def create_loader_pool(
    num_readers: int,
    num_cpus_per_reader: float,
    service: str = "replaystore",
    namespace: str | None = None,
    wrap: Callable[[Any, Any], Any] | None = None,
    local: bool = False,
    per_node: bool = False,
) -> Any:
    """An ``ActorPool`` of ``num_readers`` loaders on the node of ``service``'s store.

    With ``local=True``, a :class:`LocalLoaderPool` of ``num_readers`` threads in this process
    instead (this process must run on the store's node; ``num_cpus_per_reader`` is then unused).
    With ``per_node=True`` (node-local stores), a :class:`~replaystore.ray.fragments.node_loaders.NodeLoaderPool`:
    ``num_readers`` loaders on every node keeping a store; :func:`data_iter` sends each record to a
    loader on the node holding its payload.

    Raises:
        ValueError: no such service, it has no fragment buffer, or (``local``) another node, or
            (``per_node``) the service has no node-local stores.
    """
    if local:
        return LocalLoaderPool(num_readers, service=service, namespace=namespace, wrap=wrap)
    ray = import_ray()
    from ray.util.actor_pool import ActorPool

    from .client import connect

    fragments = connect(service, namespace=namespace).fragments
    info = fragments.store_info
    if per_node:
        from .fragments.node_loaders import NodeLoaderPool

        if info.get("node_local") is None:
            raise InvalidArgument(f"service {service!r} keeps one store: per_node loaders need node_local stores")
        return NodeLoaderPool(
            {
                lb: _loaders(ray, nid, num_readers, num_cpus_per_reader, service, namespace, wrap)
                for lb, nid in info["nodes"].items()
            },
            service=fragments.actor,
        )
    return ActorPool(_loaders(ray, info["node_id"], num_readers, num_cpus_per_reader, service, namespace, wrap))


def node_local(service: str = "replaystore", namespace: str | None = None) -> bool:
    """Whether ``service``'s fragment buffer keeps node-local stores (``ValueError``: no such service)."""
    from .client import connect

    return connect(service, namespace=namespace).fragments.store_info.get("node_local") is not None


def _loaders(
    ray: Any,
    node_id: str,
    n: int,
    num_cpus: float,
    service: str,
    namespace: str | None,
    wrap: Callable[[Any, Any], Any] | None,
) -> list[Any]:
    """``n`` loader actors pinned to ``node_id`` (hard node affinity)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cls = ray.remote(FragmentLoader)
    return [
        cls.options(num_cpus=num_cpus, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
            service, namespace, wrap
        )
        for _ in range(int(n))
    ]


def data_iter(
    loader_pool: Any,
    records: Sequence[Any],
    batch_size: int,
    prefetch_batches: int,
    seed: int | None = None,
    timeout: float | None = None,
    collate: Callable[[list[Any]], Any] | None = None,
    shuffle: bool = True,
    keep_alive: contextlib.AbstractContextManager | None = None,
) -> Iterator[Any]:
    """Yield batches of loaded records, ``batch_size`` each (the last one may be smaller).

    Args:
        loader_pool: from :func:`create_loader_pool` (a per-node pool routes each record to a
            loader on its payload's node; a record whose node left raises ``NodeLost``).
        records: ``(index, fragment_id)`` pairs, e.g. a fetch's records.
        batch_size: items per batch.
        prefetch_batches: batches loaded ahead; ``(prefetch_batches + 1) * batch_size`` loads are
            in flight at any time.
        seed: seed of the shuffle (``None``: unseeded). Batches are formed in completion order.
        timeout: seconds to wait for any one load (``None``: wait); raises ``rs.Timeout``.
        collate: turns a list of loaded items into a batch (default: the list itself).
        shuffle: shuffle the records first.
        keep_alive: a context manager held while the iterator runs, typically
            ``fragment_client.keep_alive(fetch)``, which renews the fetch's lease so the service does
            not release it (``lease_ttl``) while the payloads are still being read.

    The iterator drains the pool when closed early, so the pool can be reused.
    """
    if batch_size < 1:
        raise InvalidArgument(f"batch_size must be >= 1, got {batch_size}")
    todo = list(records)
    if shuffle:
        random.Random(seed).shuffle(todo)
    pending = deque(todo)
    loads = loader_pool if hasattr(loader_pool, "next_loaded") else _ActorLoads(loader_pool)
    in_flight = 0

    def submit() -> None:
        nonlocal in_flight
        loads.submit(pending.popleft())
        in_flight += 1

    for _ in range(min((prefetch_batches + 1) * batch_size, len(pending))):
        submit()
    if hasattr(loads, "report"):
        loads.report()  # a per-node pool: the service shows the loaders' queue per node
    accum: list[Any] = []
    with keep_alive if keep_alive is not None else contextlib.nullcontext():
        try:
            while in_flight:
                in_flight -= 1  # this load is done, one way or the other
                accum.append(loads.next_loaded(timeout))
                if pending:
                    submit()
                if len(accum) >= batch_size:
                    batch, accum = accum[:batch_size], accum[batch_size:]
                    yield collate(batch) if collate else batch
            if accum:
                yield collate(accum) if collate else accum
        finally:
            loads.drain(timeout)  # leave the pool empty for its next user (also after a timeout)


__all__ = ["FragmentLoader", "LocalLoaderPool", "create_loader_pool", "data_iter", "detach", "get", "node_local"]
