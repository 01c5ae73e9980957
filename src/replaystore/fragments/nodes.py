"""Node membership of a fragment buffer with node-local stores: drop a lost node, re-attach one.

A mixin of :class:`~replaystore.fragments.buffer.FragmentBuffer` (its methods act on the
buffer's own state). What a lost, returned or restarted node means for chunks, leases and payloads:
docs/ray.md, "Fragments" (a node that leaves, a service restart, a node that comes back); the
calls: :meth:`~FragmentNodes.check_nodes`, :meth:`~FragmentNodes.drop_node`,
:meth:`~FragmentNodes.attach_node`, :meth:`~FragmentNodes.reconcile_node`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .records import label_of

if TYPE_CHECKING:
    from .records import Chunk, Lease, StreamState

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
        def _drop_partial(self, st: StreamState) -> list[str]: ...
        def _commit(self, puts: dict[str, Any] | None, deletes: list[str]) -> None: ...
        def compact(self, nodes: list[str] | None = None) -> int:
            """See ``FragmentBuffer.compact``."""
            ...

    def drop_node(self, label: str) -> int:
        """Drop every chunk and partial chunk with a fragment on node ``label``; return fragments lost.

        One journal transaction. Idempotent (a dropped label returns 0). Fragments of the dropped
        chunks that live on other nodes are freed (deleted unless a lease holds them).
        """
        if label in self.lost_nodes:
            return 0
        self.lost_nodes.add(label)
        self.counters["nodes_lost"] += 1
        try:
            lost = self._drop_fragments(lambda fid: label_of(fid) == label)
        except Exception:
            self.lost_nodes.discard(label)  # rolled back with the rest (the journal never saw it)
            raise
        log.warning("fragment buffer: node %s lost with %d fragments", label, lost)
        return lost

    def reconcile_node(self, label: str, stored: set[str]) -> int:
        """Node ``label``'s store (re)attached with the payloads ``stored``: drop what it lacks.

        Every chunk and partial chunk holding a fragment of ``label`` that is not in ``stored`` is
        dropped (counted in ``fragments_lost_with_node`` and ``chunks_lost_with_node``, one journal
        transaction); the rest count again as they were. Returns the fragments lost (0: all there).
        """
        missing = {fid for fid in self._ids_referenced() if label_of(fid) == label and fid not in stored}
        if not missing:
            return 0
        lost = self._drop_fragments(missing.__contains__)
        log.warning("fragment buffer: node %s re-attached without %d of its fragments", label, lost)
        return lost

    def _drop_fragments(self, gone: Callable[[str], bool]) -> int:
        """Drop chunks and partial chunks holding a fragment ``gone(id)``; count; journal; return the count."""
        lost: set[str] = set()
        deletes: list[str] = []
        for key in [k for k, ch in self._chunks.items() if any(gone(f.fragment_id) for f in ch.fragments)]:
            lost.update(f.fragment_id for f in self._chunks[key].fragments if gone(f.fragment_id))
            deletes.append(self._remove_chunk(key, "chunks_lost_with_node"))
        for st in self._streams.values():
            if any(gone(f.fragment_id) for f in st.partial):
                lost.update(f.fragment_id for f in st.partial if gone(f.fragment_id))
                deletes += self._drop_partial(st)
        for lease in self._leases.values():
            lost.update(r.fragment_id for r in lease.records if gone(r.fragment_id))
        self.counters["fragments_lost_with_node"] += len(lost)
        self._commit(None, deletes)
        return len(lost)

    def attach_node(self, label: str) -> bool:
        """Accept fragments of node ``label`` again (a lost node came back); return whether it was lost."""
        if label not in self.lost_nodes:
            return False
        self.lost_nodes.discard(label)
        self.counters["nodes_reattached"] += 1
        self._commit(None, [])
        return True

    def _ids_referenced(self) -> set[str]:
        """Every fragment id in a chunk, a partial chunk or a lease."""
        ids = {f.fragment_id for ch in self._chunks.values() for f in ch.fragments}
        ids.update(f.fragment_id for s in self._streams.values() for f in s.partial)
        ids.update(r.fragment_id for lease in self._leases.values() for r in lease.records)
        return ids

    def _labels_referenced(self) -> set[str]:
        """Node labels of every fragment in a chunk, a partial chunk or a lease."""
        return {lb for lb in map(label_of, self._ids_referenced()) if lb is not None}

    def check_nodes(self) -> tuple[list[str], list[str]]:
        """With node-local stores: refresh the router, drop lost nodes, re-attach returned ones.

        A node is lost when its store's node left, or when the metadata names a label no store
        answers for (it left while the service was down). A store started by this check (every
        store after a service restart, a new node, a node that came back under its label) is
        re-attached: if its label had been dropped, it accepts fragments again and its old payloads
        are orphans (their chunks were counted lost for good); otherwise it is reconciled
        (:meth:`reconcile_node`): every fragment the metadata holds for it counts again, and only
        those its directory lacks are dropped and counted.

        Returns ``(attached, lost)`` labels (both empty with one store).
        """
        refresh = getattr(self.store, "refresh", None)
        if refresh is None:
            return [], []
        attached, lost = refresh()
        alive = set(self.store.info()) | set(getattr(self.store, "starting", ()))  # starting: node alive
        # labels the metadata references but no store answers for (e.g. a node that left while the
        # service was down and restarted): lost too
        lost += sorted(self._labels_referenced() - alive - self.lost_nodes - set(lost))
        for label in lost:
            self.drop_node(label)
        referenced = self._labels_referenced() if attached else set()
        for label in attached:
            if not self.attach_node(label) and label in referenced:
                stored = self.store.keys_of(label)
                if stored is not None:
                    self.reconcile_node(label, stored)
        return attached, lost

    def compact_bloated(self, ratio: float) -> int:
        """Compact where the files hold more than ``ratio`` x the live pages + 64 MiB; return bytes freed.

        With node-local stores each node's files are compared with its own live pages, and only
        those nodes are compacted (a bloated node is not hidden by the others' sums).
        """
        node_space = getattr(self.store, "node_space", None)
        if node_space is None:
            if self.store.disk_usage() > ratio * self.store.live_bytes() + (64 << 20):
                return self.compact()
            return 0
        over = [lb for lb, s in node_space().items() if s["disk_bytes"] > ratio * s["live_bytes"] + (64 << 20)]
        return self.compact(over) if over else 0

    def store_space(self) -> tuple[int, dict[str, dict[str, Any]] | None]:
        """``(bytes the store's files hold, per-node space or None)``.

        Node-local stores report each node's ``node_id``, ``payloads``, ``disk_bytes``, ``live_bytes``
        and ``free_bytes``.
        """
        node_space = getattr(self.store, "node_space", None)
        if node_space is None:
            return self.store.disk_usage(), None
        nodes = node_space()
        held = self.leases_by_node()
        for label, n in nodes.items():
            n.update(held.get(label, {"leases": 0, "leased_fragments": 0}))
        return sum(n["disk_bytes"] for n in nodes.values()), nodes

    def leases_by_node(self) -> dict[str, dict[str, int]]:
        """``{label: {"leases", "leased_fragments"}}``: the leases holding a fragment of each node.

        ``leases``: leases with at least one fragment whose id names the node; ``leased_fragments``:
        their fragments there (a fragment in two leases counts twice). Ids without a node label
        (one shared store) are not counted. O(leased fragments); not thread-safe (the buffer's caller
        serialises calls, as for every method).
        """
        out: dict[str, dict[str, int]] = {}
        for lease in self._leases.values():
            labels = [label_of(r.fragment_id) for r in lease.records]
            for lb in set(labels):
                if lb is not None:
                    d = out.setdefault(lb, {"leases": 0, "leased_fragments": 0})
                    d["leases"] += 1
                    d["leased_fragments"] += labels.count(lb)
        return out
