"""The records of the fragment buffer: its configuration, fragments, chunks, streams and leases.

Plain data (JSON-able for the journal); the logic that moves them is
:class:`~replaystore.fragments.buffer.FragmentBuffer`. The journal (an
:class:`~replaystore.checkpoint.journal.LmdbJournal` with the JSON codec at ``<store path>/meta``)
holds them under these keys:

- ``s``             the service state: model version, session, counters, next chunk id;
- ``p/<id>``        a pending fragment (acknowledged, waiting in its stream's partial chunk);
- ``h/<stream>``    a stream's high-water mark (last sequence number seen, last time seen);
- ``c/<chunk id>``  a chunk: its fragments, version, session, use count (ids in FIFO order);
- ``l/<lease id>``  a handed-out fetch: its fragments and the client that holds it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from ..errors import InvalidArgument
from ..storage.fragments import FragmentStore

#: The counters of a fragment buffer (``stats()``; journaled with its state).
COUNTERS = (
    "fragments_added",
    "duplicates",
    "gaps",
    "fragments_dropped_gap",
    "fragments_dropped_stale",
    "partials_expired",
    "fragments_dropped_expired",
    "chunks_formed",
    "chunks_evicted",
    "chunks_dropped_stale",
    "chunks_retired",
    "fetches",
    "fragments_fetched",
    "leases_released",
    "leases_expired",
    "lease_renewals",
    "payloads_deleted",
    "payload_delete_errors",
    "orphans_deleted",
    "compactions",
    "bytes_compacted",
    "restarts",
    "nodes_lost",
    "nodes_reattached",
    "fragments_lost_with_node",
    "chunks_lost_with_node",
    "fragments_refused_lost_node",
)

STATE = "s"
PENDING = "p/"
STREAM = "h/"
CHUNK = "c/"
LEASE = "l/"


def chunk_key(chunk_id: int) -> str:
    """Journal key of a chunk (zero-padded, so keys sort in FIFO order)."""
    return f"{CHUNK}{chunk_id:016d}"


def under(records: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The journal's records whose keys start with ``prefix``, by the rest of the key (key order)."""
    return {k[len(prefix) :]: v for k, v in records.items() if k.startswith(prefix)}


#: Separates a node-local fragment id from the label of the node's store (``<id>@<label>``).
SEP = "@"


def label_of(fragment_id: str) -> str | None:
    """The store label a node-local fragment id names (``None`` for a one-store id)."""
    _, sep, label = fragment_id.rpartition(SEP)
    return label if sep else None


@dataclass
class FragmentBufferConfig:
    """Configuration of a :class:`FragmentBuffer` (MineStudio's keys first).

    Attributes:
        max_chunks: capacity in chunks (FIFO eviction beyond).
        max_staleness: chunks more than this many model versions behind are dropped.
        max_reuse: a chunk is retired after this many fetches.
        fragments_per_chunk: consecutive fragments of one stream per chunk.
        fragments_per_report: write a monitoring report every this many fragments (``None``: off).
        path: directory of the fragment store (the journal lives in ``path/meta``).
        num_shards: LMDB shards of the store.
        map_size: LMDB map size per shard, bytes.
        partial_max_age: drop a stream's partial chunk when the stream sent nothing for this many
            seconds (``None``: only staleness drops partials). Covers producers that died mid-chunk.
        stream_ttl: forget a quiet stream's high-water mark (used to spot duplicates) after this long.
        orphan_grace: payloads in the store that no fragment references are deleted once older
            than this (a producer wrote them but its ``add`` never arrived).
        seed: seed of the chunk selection (``None``: from the OS).
        persist: keep the journal (needed to survive restarts).
        clear_on_start: wipe store and journal when the service is first created (never on a
            restart after a crash).
        lease_ttl: seconds a fetch's lease lives without renewal (``None``: forever). Renewed by
            :meth:`FragmentBuffer.renew` (``FragmentClient.renew``/``keep_alive``) and by every
            fetch of the same client; housekeeping releases expired leases (``leases_expired``).
        sync: LMDB ``sync``/``metasync`` of the store and the journal: flush every commit, so it
            survives a machine crash (off: a process crash only).
        writemap: open the store's shards with a writable memory map (faster large writes; each
            write reserves its blocks first). ``None``: the setting recorded in the store, else off.
        shrink_threshold: a shard emptied by deletes that holds more than this many bytes is replaced
            by an empty one, giving its space back (``None``: never); see ``FragmentStore``.
        journal_reserve: bytes the journal keeps allocated ahead, so fetches and releases can be
            recorded on a full disk; new fragments are refused when it cannot be kept.
        journal_map_size: LMDB map size of the journal, bytes.
        staleness_end: which end of a chunk's version range (its fragments' oldest and newest
            versions: a stream that continued across a weight update) decides its staleness:
            ``"min"`` (MineStudio's, the default) or ``"max"``.
        compact_ratio: housekeeping compacts the store online (``FragmentStore.compact``) when its
            files hold more than this many times its live pages, plus 64 MiB (``None``: never; call
            :meth:`FragmentBuffer.compact`). LMDB reuses freed pages, so this matters only after the
            live data shrank for good.
        node_local: a Ray resource name (e.g. ``"database"``): every node declaring it keeps its
            own store in ``path/node-<label>`` and producers write into their own node's store
            (:mod:`~replaystore.ray.fragments.node_stores`). ``None`` (default): one store in ``path`` on the
            service's node.
    """

    max_chunks: int
    max_staleness: int
    max_reuse: int
    fragments_per_chunk: int = 1
    fragments_per_report: int | None = None
    path: str = "replay_buffer_cache"
    num_shards: int = 4
    map_size: int = 1 << 40
    partial_max_age: float | None = 600.0
    stream_ttl: float = 3600.0
    orphan_grace: float = 300.0
    seed: int | None = None
    persist: bool = True
    clear_on_start: bool = False
    lease_ttl: float | None = 600.0
    sync: bool = False
    writemap: bool | None = None
    shrink_threshold: int | None = 1 << 20
    journal_reserve: int = 8 << 20
    journal_map_size: int = 1 << 32
    staleness_end: str = "min"
    compact_ratio: float | None = None
    node_local: str | None = None

    def __post_init__(self) -> None:
        if self.max_chunks < 1 or self.max_reuse < 1 or self.fragments_per_chunk < 1:
            raise InvalidArgument("max_chunks, max_reuse and fragments_per_chunk must be >= 1")
        if self.max_staleness < 0:
            raise InvalidArgument(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.staleness_end not in ("min", "max"):
            raise InvalidArgument(f"staleness_end must be 'min' or 'max', got {self.staleness_end!r}")
        if self.lease_ttl is not None and not self.lease_ttl > 0:
            raise InvalidArgument(f"lease_ttl must be > 0 or None, got {self.lease_ttl}")
        if self.node_local is not None and not (isinstance(self.node_local, str) and self.node_local):
            raise InvalidArgument(f"node_local must be a Ray resource name or None, got {self.node_local!r}")
        self.path = os.path.abspath(self.path)

    def open_store(self, path: str | None = None) -> FragmentStore:
        """The fragment store this configuration describes (in ``path``: a node's store, default ``path``)."""
        return FragmentStore(
            self.path if path is None else path,
            self.num_shards,
            self.map_size,
            sync=self.sync,
            writemap=self.writemap,
            shrink_threshold=self.shrink_threshold,
        )


class FragmentRef(NamedTuple):
    """One acknowledged fragment: payload id plus the metadata the buffer needs."""

    fragment_id: str
    stream: str
    seq: int
    version: int
    session: str


@dataclass
class Chunk:
    """Consecutive fragments of one stream, sampled together."""

    chunk_id: int
    fragments: list[FragmentRef]
    version: int
    session: str
    use_count: int = 0

    def to_json(self) -> dict:
        """JSON-able form for the journal (the fragments as tuples: JSON arrays)."""
        return asdict(self)

    @property
    def versions(self) -> tuple[int, int]:
        """``(oldest, newest)`` version of its fragments (a chunk can span a weight update)."""
        vs = [f.version for f in self.fragments]
        return min(vs), max(vs)

    @classmethod
    def from_json(cls, d: dict) -> "Chunk":
        """Inverse of :meth:`to_json`."""
        return cls(d["chunk_id"], [FragmentRef(*f) for f in d["fragments"]], d["version"], d["session"], d["use_count"])


@dataclass
class StreamState:
    """A producer stream: its last sequence number, when it was last heard, its partial chunk."""

    last_seq: int
    last_seen: float
    partial: list[FragmentRef] = field(default_factory=list)


@dataclass
class Lease:
    """The fragments handed out by one fetch; their payloads stay until the lease is released."""

    lease_id: str
    client: str | None
    records: list[FragmentRef]
    expires: float | None = None  # wall-clock time (persisted across restarts); None: never

    def to_json(self) -> dict:
        """JSON-able form for the journal."""
        return {"client": self.client, "records": [list(r) for r in self.records], "expires": self.expires}
