"""Leases of a fragment buffer: fetches hand out leases on chunks' fragments; release, renew, expire.

A mixin of :class:`~replaystore.fragments.buffer.FragmentBuffer` (its methods act on the buffer's
own state); what a lease guarantees: docs/ray.md, "Fragments" (fetch, leases expire).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument, KeyNotFound, StorageError
from .records import LEASE, STATE, FragmentRef, Lease, chunk_key

if TYPE_CHECKING:
    from ..checkpoint.journal import LmdbJournal
    from ..table import Table
    from .records import Chunk, FragmentBufferConfig

log = logging.getLogger("replaystore")


class FragmentLeases:
    """Fetches and their leases (mixed into ``FragmentBuffer``; not thread-safe, like it)."""

    if TYPE_CHECKING:
        config: FragmentBufferConfig
        table: Table
        journal: LmdbJournal
        refs: Any
        version: int
        counters: dict[str, int]
        _chunks: dict[int, Chunk]
        _leases: dict[str, Lease]
        _client_lease: dict[str, str]
        _last_records: list[FragmentRef]
        _left_staleness: list[int]

        def _end(self, chunk: Chunk) -> int: ...
        def _remove_chunk(self, key: int, counter: str) -> str: ...
        def _free(self, ids: list[str]) -> None: ...
        def _commit(self, puts: dict[str, Any] | None, deletes: list[str]) -> None: ...
        def _state(self) -> dict: ...
        def report(self, now: float | None = None) -> dict[str, float]:
            """See ``FragmentBuffer.report``."""
            ...

    def chunks_for(self, num_fragments: int) -> int:
        """How many chunks a fetch of ``num_fragments`` takes; ``ValueError`` if impossible."""
        fpc = self.config.fragments_per_chunk
        if num_fragments < 1 or num_fragments % fpc:
            raise InvalidArgument(
                f"num_fragments must be a positive multiple of fragments_per_chunk={fpc}, got {num_fragments}"
            )
        n = num_fragments // fpc
        if n > self.config.max_chunks:
            raise InvalidArgument(f"a fetch of {n} chunks can never be served by max_chunks={self.config.max_chunks}")
        return n

    def fetch(self, num_fragments: int, client: str | None = None, now: float | None = None) -> Lease:
        """Pick ``num_fragments / fragments_per_chunk`` distinct chunks uniformly; lease their fragments.

        The caller (the service) must have waited until enough chunks exist. Each chosen chunk's use
        count grows by one; chunks that reach ``max_reuse`` are retired (their payloads stay while
        the lease holds them). With ``client``, that client's previous lease is released and its
        other leases renewed. The lease expires ``lease_ttl`` seconds after ``now`` unless renewed.

        Raises:
            ValueError: bad ``num_fragments`` or fewer chunks than needed.
            DiskFull, StorageError: the journal could not record the fetch (nothing changed).
        """
        now = time.time() if now is None else now
        ttl = self.config.lease_ttl
        n = self.chunks_for(num_fragments)
        if n > len(self._chunks):
            raise InvalidArgument(
                f"a fetch of {n} chunks needs at least {n} chunks, the buffer holds {len(self._chunks)}"
            )
        sample = self.table.sample(n, timeout=0)
        records: list[FragmentRef] = []
        puts: dict[str, Any] = {}
        deletes: list[str] = []
        retire = []
        for key, chunk in zip(sample.keys.tolist(), sample.data):
            records += chunk.fragments
            chunk.use_count += 1
            if chunk.use_count >= self.config.max_reuse:
                retire.append(key)
            else:
                puts[chunk_key(chunk.chunk_id)] = chunk.to_json()
        lease = Lease(uuid.uuid4().hex, client, records, None if ttl is None else now + ttl)
        self.refs.incref([r.fragment_id for r in records])  # before retirement drops the chunks' refs
        for key in retire:
            self._left_staleness.append(self.version - self._end(self._chunks[key]))
            deletes.append(self._remove_chunk(key, "chunks_retired"))
        if client is not None:
            previous = self._client_lease.get(client)
            self._client_lease[client] = lease.lease_id
            if previous is not None and previous in self._leases:
                deletes.append(self._release(previous))
            if ttl is not None:  # a client that fetches is alive: renew whatever else it holds
                for other in self._leases.values():
                    if other.client == client:
                        other.expires = now + ttl
                        puts[LEASE + other.lease_id] = other.to_json()
        self._leases[lease.lease_id] = lease
        puts[LEASE + lease.lease_id] = lease.to_json()
        self._last_records = records
        self.counters["fetches"] += 1
        self.counters["fragments_fetched"] += len(records)
        self._commit(puts, deletes)
        self.report()
        return lease

    def release(self, lease_id: str) -> int:
        """Release a lease (payloads nobody else holds are deleted); return its fragment count.

        Raises:
            KeyNotFound: no such lease (never existed or already released).
        """
        if lease_id not in self._leases:
            raise KeyNotFound(f"lease {lease_id!r} is not held (already released?)")
        n = len(self._leases[lease_id].records)
        self._commit(None, [self._release(lease_id)])
        return n

    def renew(self, lease_id: str, now: float | None = None) -> float:
        """Extend a lease by ``lease_ttl`` from ``now``; return the seconds it has left (``inf``: no TTL).

        Raises:
            KeyNotFound: no such lease (released, or already expired: its payloads may be gone).
        """
        lease = self._leases.get(lease_id)
        if lease is None:
            raise KeyNotFound(f"lease {lease_id!r} is not held (released or expired)")
        ttl = self.config.lease_ttl
        if ttl is None:
            return float("inf")
        now = time.time() if now is None else now
        previous = lease.expires
        lease.expires = now + ttl
        self.counters["lease_renewals"] += 1
        try:
            self.journal.write({LEASE + lease_id: lease.to_json(), STATE: self._state()})
        except StorageError:
            lease.expires = previous
            self.counters["lease_renewals"] -= 1
            raise
        return ttl

    def _release(self, lease_id: str, counter: str = "leases_released") -> str:
        lease = self._leases.pop(lease_id)
        if lease.client is not None and self._client_lease.get(lease.client) == lease_id:
            del self._client_lease[lease.client]
        self._free([r.fragment_id for r in lease.records])
        self.counters[counter] += 1
        return LEASE + lease_id

    def prepared(self, lease_id: str | None = None) -> list[FragmentRef]:
        """The records of a lease, or (no id) of the last fetch by anyone (MineStudio's semantics).

        Raises:
            KeyNotFound: ``lease_id`` is not held.
        """
        if lease_id is None:
            return list(self._last_records)
        if lease_id not in self._leases:
            raise KeyNotFound(f"lease {lease_id!r} is not held (already released?)")
        return list(self._leases[lease_id].records)

    def _expire_leases(self, now: float) -> list[str]:
        expired = [lid for lid, lease in self._leases.items() if lease.expires is not None and lease.expires < now]
        for lid in expired:
            log.info(
                "fragment buffer: lease %s of client %s expired (%d fragments released)",
                lid,
                self._leases[lid].client,
                len(self._leases[lid].records),
            )
        return [self._release(lid, "leases_expired") for lid in expired]


__all__ = ["FragmentLeases"]
