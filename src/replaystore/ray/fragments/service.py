"""The fragment-buffer part of the replay service: methods of :class:`~replaystore.ray.server.ReplayServer`.

A mixin class: the service's actor class inherits these methods; they act on its one
:class:`~replaystore.fragments.buffer.FragmentBuffer` (``self.fragments``), acknowledging fragments,
serving fetches that wait for enough chunks, and leases. The calls that forward to the buffer as
they are (``release``, ``renew_lease``, ``update_model_version``, ...) are generated from
:data:`replaystore.fragments.contract.CALLS`. See docs/ray.md.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ...errors import KeyNotFound, Timeout
from ...fragments.contract import CALLS
from ...table import contract

#: seconds a loader pool's report of its queue counts (it reports at least every
#: ``NodeLoaderPool.report_period`` while it loads, and zeros when it drains or closes)
LOADER_QUEUE_TTL = 60.0

if TYPE_CHECKING:
    from ...fragments.buffer import FragmentBuffer
    from ...fragments.records import FragmentBufferConfig


class FragmentService:
    """Fragment-buffer methods of the replay service (mixed into ``ReplayServer``).

    Relies on the service core for ``name``, ``node_id``, ``namespace``, ``fragments``, ``_closed``,
    ``_check_open()``, ``_start()`` (the asyncio condition) and ``_notify()``.
    """

    name: str
    node_id: str
    namespace: str
    fragments: FragmentBuffer | None
    _closed: bool
    _store_actor: Any

    if TYPE_CHECKING:

        def _check_open(self) -> None: ...
        def _start(self) -> asyncio.Condition: ...
        async def _notify(self) -> None: ...
        def _housekeeping(self) -> None: ...

    async def note_loader_queue(self, pool_id: str, queued: dict[str, int], seq: int = 0) -> None:
        """A per-node loader pool's loads in flight, ``{store label: count}`` (it calls this itself).

        Shown as ``loader_queue`` per node in ``stats()["fragments"]["nodes"]``: the sum over the
        pools that reported within :data:`LOADER_QUEUE_TTL` seconds (a pool that died stops counting).
        ``seq`` numbers a pool's reports: Ray does not keep the order of calls to an async actor, so
        a report older than the one kept is ignored.
        """
        reports = self.__dict__.setdefault("_loader_queues", {})
        kept = reports.get(str(pool_id))
        if kept is not None and kept[2] > int(seq):
            return
        reports[str(pool_id)] = (time.monotonic(), {str(k): int(v) for k, v in dict(queued).items()}, int(seq))

    def _fragment_stats(self) -> dict[str, Any]:
        """The buffer's ``stats()``, each node with the loaders' queue (:meth:`note_loader_queue`)."""
        assert self.fragments is not None
        st = self.fragments.stats()
        nodes = st.get("nodes")
        if nodes is not None:
            now, reports = time.monotonic(), self.__dict__.get("_loader_queues", {})
            for pool in [p for p, (t, _, _) in reports.items() if now - t > LOADER_QUEUE_TTL]:
                del reports[pool]
            for label, n in nodes.items():
                n["loader_queue"] = sum(q.get(label, 0) for _, q, _ in reports.values())
        return st

    def _buffer(self) -> FragmentBuffer:
        self._check_open()
        if self.fragments is None:
            raise KeyNotFound(f"service {self.name!r} has no fragment buffer")
        return self.fragments

    def _fragment_store(self, config: FragmentBufferConfig) -> Any:
        """The buffer's store: ``None`` (one store, opened by the buffer) or the node-local router."""
        if config.node_local is None:
            return None
        from .node_stores import NodeStores

        return NodeStores(config, self.name, self.namespace)

    async def store_info(self) -> dict[str, Any]:
        """Where the fragment store lives: ``path``, ``num_shards``, ``map_size``, ``node_id``.

        With node-local stores also ``node_local`` (the resource) and ``nodes`` (``{label: node_id}``
        of the attached stores); ``node_id`` is then the service's node.
        """
        buf = self._buffer()
        c = buf.config
        info = {k: getattr(c, k) for k in ("path", "num_shards", "map_size", "node_local", "sync")}
        info.update(node_id=self.node_id, store_actor=f"{self.name}:store", namespace=self.namespace, service=self.name)
        if c.node_local is not None:
            info["nodes"] = buf.store.info()
        return info

    async def store_actor(self) -> Any:
        """A store actor on this node for clients on other nodes (created on first request)."""
        if self._store_actor is None:
            from .store import StoreServer, start_store

            c = self._buffer().config
            args = (c.path, c.num_shards, c.map_size)
            self._store_actor = start_store(StoreServer, f"{self.name}:store", self.namespace, self.node_id, *args)
        return [self._store_actor]  # in a list: Ray would otherwise resolve nothing, but keep it explicit

    async def add_fragment(self, fragment_id: str, stream: str, seq: int, version: int, session: str) -> str:
        """Acknowledge one fragment (see :meth:`FragmentBuffer.add`); wakes waiting fetches."""
        return (await self.add_fragments([(fragment_id, stream, seq, version, session)]))[0]

    async def add_fragments(self, records: list[tuple[str, str, int, int, str]]) -> list[str]:
        """Acknowledge several fragments in one call; returns each status."""
        buf = self._buffer()
        out = [buf.add(*r) for r in records]
        if "chunk" in out:
            await self._notify()
        return out

    async def fetch_fragments(
        self, num_fragments: int, timeout: float | None = None, client: str | None = None
    ) -> tuple[str, list]:
        """Wait until ``num_fragments / fragments_per_chunk`` chunks exist, then fetch.

        See :meth:`FragmentBuffer.fetch`. Returns ``(lease_id, records)``.

        Raises:
            Timeout: not enough chunks within ``timeout`` seconds (``None``: wait).
            Closed: the service closed while waiting.
            ValueError: impossible request.
        """
        buf = self._buffer()
        need = buf.chunks_for(num_fragments)
        if buf.num_chunks < need:
            cond = self._start()
            start = time.monotonic()
            try:
                async with cond:
                    await asyncio.wait_for(cond.wait_for(lambda: self._closed or buf.num_chunks >= need), timeout)
            except (asyncio.TimeoutError, TimeoutError):
                raise Timeout(
                    f"fetch of {num_fragments} fragments ({need} chunks) from {self.name!r}: only "
                    f"{buf.num_chunks} chunks after {time.monotonic() - start:.3g}s"
                ) from None
            self._check_open()
        lease = buf.fetch(num_fragments, client)
        return lease.lease_id, [tuple(r) for r in lease.records]

    async def prepared_fragments(self, lease_id: str | None = None) -> list:
        """Records of a lease, or of the last fetch by anyone."""
        return [tuple(r) for r in self._buffer().prepared(lease_id)]

    async def housekeeping(self) -> None:
        """Run the fragment buffer's housekeeping now (also runs every ``housekeeping_period``)."""
        self._housekeeping()

    def _expire_fragments(self) -> None:
        if self.fragments is not None and not self._closed:
            self.fragments.check_nodes()
            self.fragments.expire()


async def _serve(service: FragmentService, call: contract.Call, _: None, a: dict[str, Any]) -> Any:
    """``FragmentService.<served>``: the ``FragmentBuffer`` call as is."""
    return getattr(service._buffer(), call.name)(**a)


contract.forward(FragmentService, CALLS, serve=_serve)
