"""FragmentBuffer: streams of fragments become chunks in a Table; payloads are reference counted.

This is the logic of MineStudio's replay buffer actor, on replaystore's core and without its
failures. It holds metadata only: each fragment's payload lives in a
:class:`~replaystore.storage.fragments.FragmentStore`, named by its fragment id. What it does with
them (streams to chunks, admission and staleness, eviction and reuse, fetches and their leases,
lease expiry, reference counting, persistence, full disks) is docs/ray.md, "Fragments". How:
chunks are items of a :class:`~replaystore.Table` (object storage, ``UniformDistinct`` sampler,
FIFO order, ``max_staleness``); reference counts are explicit
(:class:`~replaystore.storage.fragments.RefCounts`); every operation is one transaction of a
journal (an :class:`~replaystore.checkpoint.journal.LmdbJournal` of JSON records, keys named in
:mod:`~replaystore.fragments.records`) that a new buffer on the same path resumes from; a payload
is deleted from the store only after the transaction that dropped its last reference committed,
and an operation whose transaction fails (:class:`~replaystore.DiskFull`,
:class:`~replaystore.StorageError`) raises it and leaves the buffer as it was (its state is
reloaded from the journal).

Not thread-safe and never blocking: the replay service calls it from its event loop, one call at a
time, and does the waiting (``fetch`` when too few chunks exist) itself.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..checkpoint.journal import JSON, LmdbJournal, NullJournal, restoring
from ..errors import StorageError
from ..limiters import MinSize
from ..samplers import Fifo
from ..samplers.uniform_distinct import UniformDistinct
from ..storage.fragments import FragmentStore, RefCounts, fragment_age
from ..table import Table
from . import records
from .leases import FragmentLeases
from .nodes import FragmentNodes
from .records import COUNTERS, PENDING, STREAM, Chunk, FragmentBufferConfig, FragmentRef, Lease, StreamState, label_of

log = logging.getLogger("replaystore")


class FragmentBuffer(FragmentLeases, FragmentNodes):
    """MineStudio's chunked replay metadata over a Table (see the module doc).

    Args:
        config: a :class:`FragmentBufferConfig`.
        store: the fragment store (default: opened from ``config.path``); the buffer deletes
            payloads from it.
        report: called with a dict of scalars every ``fragments_per_report`` fragments and after
            every fetch (monitoring).
        resume: load the journal (a restart); with ``False`` and ``config.clear_on_start`` the
            store and journal are wiped first.
    """

    def __init__(
        self,
        config: FragmentBufferConfig,
        store: FragmentStore | None = None,
        report: Callable[[dict[str, float]], None] | None = None,
        resume: bool = True,
    ) -> None:
        self.config = c = config
        self.store = store if store is not None else c.open_store()
        self.journal: LmdbJournal | NullJournal = (
            LmdbJournal(os.path.join(c.path, "meta"), JSON, c.journal_map_size, c.journal_reserve, c.sync)
            if c.persist
            else NullJournal()
        )
        self._report_fn = report
        self._reset()
        if not resume and c.clear_on_start:
            self.journal.clear()
            self.store.clear()
        self._restore(self.journal.load())
        self.check_nodes()  # node-local stores: attach every node's store, reconcile it with the journal

    def _reset(self) -> None:
        """Empty in-memory state (then filled from the journal by :meth:`_restore`)."""
        c = self.config
        self.table = Table(
            c.max_chunks,
            sampler=UniformDistinct(),
            remover=Fifo(),
            rate_limiter=MinSize(1),
            max_staleness=c.max_staleness,
            storage="objects",
            seed=c.seed,
            name="chunks",
        )
        self.refs = RefCounts()
        self.version = -1
        self.session = ""
        self._streams: dict[str, StreamState] = {}
        self._chunks: dict[int, Chunk] = {}  # table key -> chunk, FIFO order
        self._leases: dict[str, Lease] = {}
        self._client_lease: dict[str, str] = {}
        self._last_records: list[FragmentRef] = []
        self._next_chunk_id = 0
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._left_reuse: list[int] = []  # use counts of chunks that left since the last report
        self._left_staleness: list[int] = []  # staleness of chunks retired by reuse since then
        self._last_report = (time.time(), 0)
        self._doomed: list[str] = []  # payloads to delete once the current operation is journaled
        self.lost_nodes: set[str] = set()  # node-local stores dropped with their node (journaled)

    # -- helpers ------------------------------------------------------------------------------------
    def _state(self) -> dict:
        state = {
            "version": self.version,
            "session": self.session,
            "next_chunk_id": self._next_chunk_id,
            "counters": self.counters,
        }
        if self.lost_nodes:
            state["lost_nodes"] = sorted(self.lost_nodes)
        return state

    def _free(self, ids: list[str]) -> None:
        """Drop one reference from each id; payloads nobody holds any more are deleted on commit."""
        self._doomed += self.refs.decref(ids)

    def _drop_partial(self, st: StreamState) -> list[str]:
        """Empty a stream's partial chunk (its references dropped); return its journal deletes."""
        deletes = [PENDING + f.fragment_id for f in st.partial]
        self._free([f.fragment_id for f in st.partial])
        st.partial = []
        return deletes

    def _commit(self, puts: dict[str, Any] | None, deletes: list[str]) -> None:
        """Journal the operation, then delete the payloads it freed.

        If the journal write fails (``DiskFull``/``StorageError``), the in-memory state is rebuilt
        from the journal (the last committed state: the operation never happened) and the error
        raised; no payload was deleted.
        """
        try:
            self.journal.write({**(puts or {}), records.STATE: self._state()}, deletes)
        except StorageError:
            log.warning("fragment buffer: journal write failed; the operation is rolled back", exc_info=True)
            self._rollback()
            raise
        self._delete_payloads()

    def _delete_payloads(self) -> None:
        doomed, self._doomed = self._doomed, []
        if self.lost_nodes:  # a lost node's payloads went with it (re-attached: the orphan scan takes them)
            doomed = [f for f in doomed if label_of(f) not in self.lost_nodes]
        if doomed:
            try:
                self.counters["payloads_deleted"] += self.store.delete(doomed)
            except StorageError:  # unreferenced now: housekeeping collects them as orphans later
                self.counters["payload_delete_errors"] += len(doomed)
                log.warning(
                    "fragment buffer: could not delete %d payloads (collected later)", len(doomed), exc_info=True
                )

    def _rollback(self) -> None:
        """Forget uncommitted changes: rebuild every in-memory structure from the journal."""
        self.table.close()
        self._reset()
        self._restore(self.journal.load(), restart=False)

    def _end(self, chunk: Chunk) -> int:
        """The version that decides a chunk's staleness (``staleness_end``)."""
        return chunk.version if self.config.staleness_end == "min" else chunk.versions[1]

    def _partial_stale(self, partial: list[FragmentRef], head_only: bool) -> bool:
        """Whether a partial chunk's head fragment (or, ``head_only=False``, any part) must go.

        With ``staleness_end="max"`` a partial chunk is stale only when its newest fragment is.
        """
        if self.config.staleness_end == "min":
            return any(self._is_stale(f.version, f.session) for f in (partial[:1] if head_only else partial))
        newest = max(f.version for f in partial)
        return partial[0].session != self.session or self._is_stale(newest, partial[0].session)

    def _is_stale(self, version: int, session: str) -> bool:
        return session != self.session or self.version - version > self.config.max_staleness

    @property
    def num_chunks(self) -> int:
        """Chunks available for fetching."""
        return len(self._chunks)

    # -- add ------------------------------------------------------------------------------------------
    def add(self, fragment_id: str, stream: str, seq: int, version: int, session: str, now: float | None = None) -> str:
        """Acknowledge a fragment whose payload is in the store.

        Returns:
            ``"pending"`` (waits in its stream's partial chunk), ``"chunk"`` (completed a chunk),
            ``"stale"`` (dropped: too old or another session), ``"duplicate"`` (ignored: the id or
            the stream's sequence number was seen before; a new payload of a duplicate is deleted),
            ``"lost"`` (node-local stores: the fragment's node was dropped; counted in
            ``fragments_refused_lost_node``).
        """
        now = time.time() if now is None else now
        seq, version = int(seq), int(version)
        c = self.config
        self.journal.check_space()  # refuse (DiskFull) rather than acknowledge what may not be recorded
        if self.lost_nodes and label_of(fragment_id) in self.lost_nodes:
            self.counters["fragments_refused_lost_node"] += 1
            return "lost"
        if fragment_id in self.refs:
            self.counters["duplicates"] += 1
            return "duplicate"
        st = self._streams.get(stream)
        if st is not None and seq <= st.last_seq:
            self.counters["duplicates"] += 1
            self._doomed.append(fragment_id)
            self._delete_payloads()
            return "duplicate"
        puts: dict[str, Any] = {}
        deletes: list[str] = []
        if st is None:
            st = self._streams[stream] = StreamState(seq - 1, now)
        elif seq > st.last_seq + 1:
            self.counters["gaps"] += 1
            self.counters["fragments_dropped_gap"] += len(st.partial)
            deletes += self._drop_partial(st)
        ref = FragmentRef(fragment_id, stream, seq, version, session)
        self.refs.incref([fragment_id])
        st.partial.append(ref)
        st.last_seq, st.last_seen = seq, now
        puts[STREAM + stream] = [seq, now]
        self.counters["fragments_added"] += 1
        status = "pending"
        while st.partial and self._partial_stale(st.partial, head_only=True):
            old = st.partial.pop(0)
            self.counters["fragments_dropped_stale"] += 1
            self._free([old.fragment_id])
            if old is ref:
                status = "stale"
            else:
                deletes.append(PENDING + old.fragment_id)
        if status != "stale":
            puts[PENDING + fragment_id] = list(ref)
        if len(st.partial) >= c.fragments_per_chunk:
            members, st.partial = st.partial, []
            chunk = Chunk(self._next_chunk_id, members, members[0].version, members[0].session)
            self._next_chunk_id += 1
            for f in members:
                puts.pop(PENDING + f.fragment_id, None)
                deletes.append(PENDING + f.fragment_id)
            deletes += self._insert_chunk(chunk, puts)
            status = "chunk"
        self._commit(puts, deletes)
        if c.fragments_per_report and self.counters["fragments_added"] % c.fragments_per_report == 0:
            self.report(now)
        return status

    def _insert_chunk(self, chunk: Chunk, puts: dict[str, Any]) -> list[str]:
        """Admit a complete chunk (evicting the oldest when full); return journal deletes."""
        self.counters["chunks_formed"] += 1
        deletes: list[str] = []
        if self._is_stale(self._end(chunk), chunk.session):  # admission first, then eviction
            self.counters["chunks_dropped_stale"] += 1
            self._left_reuse.append(0)
            self._free([f.fragment_id for f in chunk.fragments])
            return deletes
        while len(self._chunks) >= self.config.max_chunks:
            deletes.append(self._remove_chunk(next(iter(self._chunks)), "chunks_evicted"))
        key = self.table.add(chunk, version=self._end(chunk))
        self._chunks[key] = chunk
        puts[records.chunk_key(chunk.chunk_id)] = chunk.to_json()
        return deletes

    def _remove_chunk(self, key: int, counter: str) -> str:
        """Take a chunk out of the table and drop its references; return its journal key."""
        chunk = self._chunks.pop(key)
        self.table.delete([key])
        self.counters[counter] += 1
        self._left_reuse.append(chunk.use_count)
        self._free([f.fragment_id for f in chunk.fragments])
        return records.chunk_key(chunk.chunk_id)

    # -- model version ----------------------------------------------------------------------------------
    def set_version(self, session: str, version: int, now: float | None = None) -> int:
        """Set the session and model version; drop every chunk and partial chunk that became stale.

        Returns the number of chunks dropped (not only those at the head of the queue).
        """
        self.session, self.version = str(session), int(version)
        stale = [k for k, ch in self._chunks.items() if self._is_stale(self._end(ch), ch.session)]
        deletes = [self._remove_chunk(k, "chunks_dropped_stale") for k in stale]
        self.table.set_version(self.version, reset=True)  # (the buffer's version rules; a new session restarts)
        deletes += self._expire_partials(time.time() if now is None else now)
        self._commit(None, deletes)
        return len(stale)

    def _expire_partials(self, now: float) -> list[str]:
        deletes: list[str] = []
        max_age = self.config.partial_max_age
        for name in list(self._streams):
            st = self._streams[name]
            if st.partial:
                stale = self._partial_stale(st.partial, head_only=False)
                old = max_age is not None and now - st.last_seen > max_age
                if stale or old:
                    self.counters["partials_expired"] += 1
                    self.counters["fragments_dropped_expired"] += len(st.partial)
                    deletes += self._drop_partial(st)
            if not st.partial and now - st.last_seen > self.config.stream_ttl:
                del self._streams[name]
                deletes.append(STREAM + name)
        return deletes

    def expire(self, now: float | None = None) -> None:
        """Housekeeping, run periodically by the service.

        Drops stale or abandoned partial chunks, forgets quiet streams, releases leases whose
        time-to-live passed (counted in ``leases_expired``), and deletes unreferenced payloads older
        than ``orphan_grace``.
        """
        now = time.time() if now is None else now
        deletes = self._expire_partials(now)
        deletes += self._expire_leases(now)
        self._commit(None, deletes)
        self.collect_orphans(now)
        if self.config.compact_ratio is not None:
            self.compact_bloated(self.config.compact_ratio)

    def compact(self, nodes: list[str] | None = None) -> int:
        """Compact the store online (see ``FragmentStore.compact``); return the bytes given back.

        Readers never wait; writers of a shard wait while it is copied. ``DiskFull`` if there is no
        room for the copy (the store is then as it was). With node-local stores, ``nodes`` limits
        it to those node labels (default: every node).
        """
        freed = self.store.compact() if nodes is None else self.store.compact(nodes)
        self.counters["compactions"] += 1
        self.counters["bytes_compacted"] += freed
        return freed

    def collect_orphans(self, now: float | None = None) -> int:
        """Delete payloads no fragment references and older than ``orphan_grace``; return how many."""
        now = time.time() if now is None else now
        grace = self.config.orphan_grace
        orphans = [k for k in self.store.keys() if k not in self.refs and fragment_age(k, now) > grace]
        try:
            n = self.store.delete(orphans) if orphans else 0
        except StorageError:
            log.warning("fragment buffer: could not delete %d orphans (retried next time)", len(orphans), exc_info=True)
            return 0
        self.counters["orphans_deleted"] += n
        return n

    # -- whole-buffer operations ------------------------------------------------------------------------------
    def drain(self) -> None:
        """Drop every chunk, partial chunk and lease (their payloads are deleted); keep the version."""
        deletes = [self._remove_chunk(k, "chunks_evicted") for k in list(self._chunks)]
        for st in self._streams.values():
            deletes += self._drop_partial(st)
        deletes += [self._release(lid) for lid in list(self._leases)]
        self._commit(None, deletes)

    def close(self) -> None:
        """Close the journal and the store handle (the data stays on disk)."""
        self.table.close()
        self.journal.close()
        self.store.close()

    # -- stats ------------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters and gauges: chunk count, version, pending fragments, leases, table stats.

        With node-local stores also ``nodes``: ``{label: {"node_id", "payloads", "disk_bytes",
        "live_bytes", "free_bytes", "leases", "leased_fragments"}}`` of every store that answered
        (``store_disk_bytes`` is their sum); ``leases_by_node`` counts the leases per node label.
        """
        t = self.table.stats()
        store_disk, nodes = self.store_space()
        return {
            **self.counters,
            "model_version": self.version,
            "session_id": self.session,
            "replay_buffer_size_chunks": len(self._chunks),
            "pending_fragments": sum(len(s.partial) for s in self._streams.values()),
            "streams": len(self._streams),
            "leases": len(self._leases),
            "leases_by_node": self.leases_by_node(),
            "lease_ttl": self.config.lease_ttl,
            "lost_nodes": sorted(self.lost_nodes),
            "referenced_payloads": len(self.refs),
            "journal_low_space": self.journal.low_space,
            "store_disk_bytes": store_disk,
            **({"nodes": nodes} if nodes is not None else {}),
            "journal_disk_bytes": self.journal.disk_usage(),
            "staleness_histogram": t["staleness_histogram"],
            "chunk_use_count_mean": float(np.mean([c.use_count for c in self._chunks.values()]))
            if self._chunks
            else 0.0,
        }

    def report(self, now: float | None = None) -> dict[str, float]:
        """Scalars for monitoring (MineStudio's ``replay_buffer/*`` metrics); reset the windows."""
        now = time.time() if now is None else now
        t0, n0 = self._last_report
        added = self.counters["fragments_added"]
        scalars = {
            "fragments_per_second": (added - n0) / max(now - t0, 1e-9),
            "replay_buffer_size": float(len(self._chunks)),
            "model_version": float(self.version),
        }
        if self._left_reuse:
            scalars["avg_reuse"] = float(np.mean(self._left_reuse))
        if self._left_staleness:
            scalars["avg_staleness"] = float(np.mean(self._left_staleness))
        self._left_reuse, self._left_staleness = [], []
        self._last_report = (now, added)
        if self._report_fn is not None:
            try:
                self._report_fn(scalars)
            except Exception:  # noqa: BLE001 - monitoring must not break the buffer
                log.exception("fragment buffer report failed")
        return scalars

    # -- restart ----------------------------------------------------------------------------------------------
    def _restore(self, saved: dict[str, Any], restart: bool = True) -> None:
        with restoring(f"fragment buffer: the journal {self.journal.path}"):
            self._restore_records(saved, restart)

    def _restore_records(self, saved: dict[str, Any], restart: bool) -> None:
        state = saved.get(records.STATE)
        if state is None:
            return
        self.version, self.session = int(state["version"]), state["session"]
        self._next_chunk_id = int(state["next_chunk_id"])
        self.counters.update(state["counters"])
        self.lost_nodes = set(state.get("lost_nodes", ()))
        self.counters["restarts"] += restart
        self.table.set_version(self.version, reset=True)  # (restored)
        for name, (last_seq, last_seen) in records.under(saved, STREAM).items():
            self._streams[name] = StreamState(int(last_seq), float(last_seen))
        for fid, f in sorted(records.under(saved, PENDING).items(), key=lambda kv: (kv[1][1], kv[1][2])):
            ref = FragmentRef(*f)
            st = self._streams.setdefault(ref.stream, StreamState(ref.seq, time.time()))
            st.partial.append(ref)
            self.refs.incref([fid])
        for d in records.under(saved, records.CHUNK).values():
            chunk = Chunk.from_json(d)
            self.refs.incref([f.fragment_id for f in chunk.fragments])
            key = self.table.add(chunk, version=self._end(chunk))
            if key < 0:  # cannot happen with a consistent journal; keep the books straight anyway
                self._free([f.fragment_id for f in chunk.fragments])
                continue
            self._chunks[key] = chunk
        ttl = self.config.lease_ttl
        for lid, d in records.under(saved, records.LEASE).items():
            refs = [FragmentRef(*r) for r in d["records"]]
            expires = d.get("expires")  # journals written before leases expired have none
            expires = None if ttl is None else (time.time() + ttl if expires is None else expires)
            self._leases[lid] = Lease(lid, d["client"], refs, expires)
            self.refs.incref([r.fragment_id for r in refs])
            if d["client"] is not None:
                self._client_lease[d["client"]] = lid
        if not restart:
            return
        log.info(
            "fragment buffer resumed: %d chunks, %d pending fragments, %d leases, version %d",
            len(self._chunks),
            sum(len(s.partial) for s in self._streams.values()),
            len(self._leases),
            self.version,
        )


__all__ = ["Chunk", "FragmentBuffer", "FragmentBufferConfig", "FragmentRef", "Lease"]
