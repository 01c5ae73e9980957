"""Loaders on every node that keeps a node-local store: each record is read on its payload's node.

:class:`NodeLoaderPool` (``create_loader_pool(..., per_node=True)``, docs/ray.md, "Node-local
stores") holds loader actors per store label; :func:`~replaystore.ray.loader.data_iter` sends each
record to a loader (round robin) on the node its id names.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Sequence
from typing import Any

from ...errors import Timeout
from .._runtime import import_ray, kill
from ..detach import detach
from .node_stores import NodeLost, label_of

log = logging.getLogger("replaystore")


class NodeLoaderPool:
    """Loader actors by store label; the load interface :func:`data_iter` uses.

    Args:
        actors: ``{label: [FragmentLoader actor, ...]}``, each pinned to that label's node.
        service: the replay service's actor, told the loads in flight per node (:meth:`queued`)
            at most every ``report_period`` seconds while loads start or finish, and zeros when the
            pool drains or closes (fire and forget: a report lost costs nothing); ``None``: no reports.

    A record on a node without loaders (lost, or joined after the pool was made) fails with
    :class:`~replaystore.ray.fragments.node_stores.NodeLost` when its turn comes, as does a load whose loader
    died with its node. Not thread-safe: one ``data_iter`` at a time.
    """

    def __init__(self, actors: dict[str, list[Any]], service: Any = None, report_period: float = 0.5) -> None:
        self.actors = {lb: list(a) for lb, a in actors.items() if a}
        self._next = dict.fromkeys(self.actors, 0)
        self._running: dict[Any, str] = {}  # object ref -> label
        self._failed: deque[Exception] = deque()
        self.service = service
        self.report_period = float(report_period)
        self.pool_id = uuid.uuid4().hex
        self._reported = -float("inf")
        self._report_seq = 0  # reports may run out of order on the async service: the newest wins

    def queued(self) -> dict[str, int]:
        """Loads submitted and not yet collected, per store label (every label of the pool, 0s included)."""
        out = dict.fromkeys(self.actors, 0)
        for label in self._running.values():
            out[label] = out.get(label, 0) + 1
        return out

    def report(self) -> None:
        """Tell the service :meth:`queued` now (fire and forget; nothing without a service)."""
        self._report(force=True)

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.service is None or (not force and now - self._reported < self.report_period):
            return
        self._reported = now
        self._report_seq += 1
        try:
            self.service.note_loader_queue.remote(self.pool_id, self.queued(), self._report_seq)
        except Exception:  # noqa: BLE001 - monitoring must not break loading
            log.debug("loader queue report failed", exc_info=True)

    @property
    def labels(self) -> list[str]:
        """Store labels this pool has loaders on."""
        return list(self.actors)

    def submit(self, record: Sequence[Any]) -> None:
        """Start loading ``record = (index, fragment_id, ...)`` on its payload's node."""
        label = label_of(str(record[1]))
        actors = self.actors.get(label) if label is not None else None
        if not actors:
            self._failed.append(
                NodeLost(
                    f"fragment {record[1]!r}: no loader on node store {label!r} "
                    "(its node left the cluster, or the id names no node store)"
                )
            )
            return
        i = self._next[label]
        self._next[label] = (i + 1) % len(actors)
        self._running[actors[i].load.remote(record)] = label
        self._report()

    def next_loaded(self, timeout: float | None) -> Any:
        """The result of any finished load (its error if it failed); ``Timeout`` if none in time."""
        if self._failed:
            raise self._failed.popleft()
        ray = import_ray()
        ready, _ = ray.wait(list(self._running), num_returns=1, timeout=timeout)
        if not ready:
            raise Timeout(f"data_iter: no load finished within {timeout:.3g}s")
        label = self._running.pop(ready[0])
        self._report()
        try:
            return detach(ray.get(ready[0]))
        except ray.exceptions.RayActorError:
            raise NodeLost(f"the loader on node store {label!r} died (its node left the cluster?)") from None
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            raise (cause if isinstance(cause, Exception) else e) from None

    def drain(self, timeout: float | None) -> None:
        """Forget every load in flight (waiting up to ``timeout`` for them)."""
        ray = import_ray()
        if self._running:
            ray.wait(list(self._running), num_returns=len(self._running), timeout=timeout)
        self._running.clear()
        self._failed.clear()
        self._report(force=True)

    def node_ids(self) -> dict[str, list[str]]:
        """``{label: [node id of each loader]}`` (a check of the placement)."""
        ray = import_ray()
        return {lb: ray.get([a.node_id.remote() for a in actors], timeout=60) for lb, actors in self.actors.items()}

    def close(self) -> None:
        """Kill the loader actors."""
        self._running.clear()
        self._report(force=True)
        for actors in self.actors.values():
            for a in actors:
                kill(a)
        self.actors.clear()


__all__ = ["NodeLoaderPool"]
