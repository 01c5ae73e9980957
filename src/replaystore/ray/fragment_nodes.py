"""Node membership of a fragment buffer with node-local stores: drop a lost node, re-attach one.

A mixin of :class:`~replaystore.ray.fragment_buffer.FragmentBuffer` (its methods act on the
buffer's own state). A node that left the cluster takes its store with it: :meth:`drop_node`
removes every chunk and partial chunk holding one of its fragments in one journal transaction and
counts them (``fragments_lost_with_node``, ``chunks_lost_with_node``, ``nodes_lost``). Leases keep
their records (a holder learns of the loss from the loader: ``NodeLost``); releasing them skips the
lost payloads. The lost label is journaled: fragments naming it are refused (``"lost"``) until the
node is re-attached (:meth:`attach_node`: a node that came back with its directory; its
unreferenced payloads are then orphans the orphan scan deletes).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .journal import PENDING
from .node_stores import label_of

if TYPE_CHECKING:
    from .fragment_records import Chunk, Lease, StreamState

log = logging.getLogger("replaystore")


class FragmentNodes:
    """Node loss and re-attachment (mixed into ``FragmentBuffer``; not thread-safe, like it)."""

    if TYPE_CHECKING:
        store: Any
        counters: dict[str, int]
        lost_nodes: set[str]
        _chunks: dict[int, Chunk]
        _streams: dict[str, StreamState]
        _leases: dict[str, Lease]

        def _remove_chunk(self, key: int, counter: str) -> str: ...
        def _free(self, ids: list[str]) -> None: ...
        def _commit(self, puts: dict[str, Any] | None, deletes: list[str]) -> None: ...

    def drop_node(self, label: str) -> int:
        """Drop every chunk and partial chunk with a fragment on node ``label``; return fragments lost.

        One journal transaction. Idempotent (a dropped label returns 0). Fragments of the dropped
        chunks that live on other nodes are freed (deleted unless a lease holds them).
        """
        if label in self.lost_nodes:
            return 0
        lost: set[str] = set()
        deletes: list[str] = []
        for key in [k for k, ch in self._chunks.items() if any(label_of(f.fragment_id) == label for f in ch.fragments)]:
            lost.update(f.fragment_id for f in self._chunks[key].fragments if label_of(f.fragment_id) == label)
            deletes.append(self._remove_chunk(key, "chunks_lost_with_node"))
        for st in self._streams.values():
            if any(label_of(f.fragment_id) == label for f in st.partial):
                lost.update(f.fragment_id for f in st.partial if label_of(f.fragment_id) == label)
                deletes += [PENDING + f.fragment_id for f in st.partial]
                self._free([f.fragment_id for f in st.partial])
                st.partial = []
        for lease in self._leases.values():
            lost.update(r.fragment_id for r in lease.records if label_of(r.fragment_id) == label)
        self.lost_nodes.add(label)
        self.counters["nodes_lost"] += 1
        self.counters["fragments_lost_with_node"] += len(lost)
        try:
            self._commit(None, deletes)
        except Exception:
            self.lost_nodes.discard(label)  # rolled back with the rest (the journal never saw it)
            raise
        log.warning("fragment buffer: node %s lost with %d fragments", label, len(lost))
        return len(lost)

    def attach_node(self, label: str) -> bool:
        """Accept fragments of node ``label`` again (a lost node came back); return whether it was lost."""
        if label not in self.lost_nodes:
            return False
        self.lost_nodes.discard(label)
        self.counters["nodes_reattached"] += 1
        self._commit(None, [])
        return True

    def _labels_referenced(self) -> set[str]:
        """Node labels of every fragment in a chunk, a partial chunk or a lease."""
        ids = [f.fragment_id for ch in self._chunks.values() for f in ch.fragments]
        ids += [f.fragment_id for s in self._streams.values() for f in s.partial]
        ids += [r.fragment_id for lease in self._leases.values() for r in lease.records]
        return {lb for lb in map(label_of, ids) if lb is not None}

    def check_nodes(self) -> tuple[list[str], list[str]]:
        """With node-local stores: refresh the router, drop lost nodes, re-attach returned ones.

        A node is lost when its store's node left, or when the metadata names a label no store
        answers for (it left while the service was down).

        Returns ``(attached, lost)`` labels (both empty with one store).
        """
        refresh = getattr(self.store, "refresh", None)
        if refresh is None:
            return [], []
        attached, lost = refresh()
        alive = set(self.store.info())
        # labels the metadata references but no store answers for (e.g. a node that left while the
        # service was down and restarted): lost too
        lost += sorted(self._labels_referenced() - alive - self.lost_nodes - set(lost))
        for label in lost:
            self.drop_node(label)
        for label in attached:
            self.attach_node(label)
        return attached, lost
