"""How a shared-memory segment plugs into the Table: :class:`SegmentHost`, a shared table's host.

A :class:`~replaystore.shared.SharedTable` is the one Table built with this host (the interface,
both directions: :mod:`replaystore.table.host`). This host guards the table with a
:class:`~replaystore.shared.guard.ProcessGuard` (given by ``HostedTable.guard_with`` when the
table opens the segment), sets the insert hooks that apply to it (:meth:`SegmentHost.open`),
reserves the segment's deferred regions when the table leaves ring mode
(:meth:`~replaystore.shared.segment.Segment.reserve_deferred`: may raise ``DiskFull``, nothing
changed), and publishes the episode part (:class:`~replaystore.shared.episodes.EpisodeSync`) with
the table's scalars: its changes written before the state is published, caught up after another
process changed it.

Thread-safety: as the table's (every hook runs with its lock held).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..table.host import HostedTable, TableHost

if TYPE_CHECKING:
    from .episodes import EpisodeSync
    from .guard import ProcessGuard
    from .segment import Segment


class SegmentHost(TableHost):
    """A shared table's host (see the module doc): built empty, bound by the Table, opened by the SharedTable."""

    def __init__(self) -> None:
        self.table: HostedTable | None = None
        self.segment: Segment | None = None
        self.guard: ProcessGuard | None = None
        #: the episode part (episodic tables), set before the table's state layout is compiled
        self.episync: EpisodeSync | None = None

    def bind(self, table: HostedTable) -> None:
        """Keep the view of the table (at the end of its construction)."""
        self.table = table

    def open(
        self,
        segment: "Segment",
        guard: "ProcessGuard",
        wait_for_head: Callable[[], None] | None,
        mark_unordered: Callable[[], None] | None,
    ) -> None:
        """The segment is open: its lock guards the table from now on; the insert hooks that apply here.

        ``wait_for_head`` (the host's ``await_head``): waits while another process copies into
        ring slots it reserved (:mod:`.reserve`; None: this table does not reserve).
        ``mark_unordered`` (its ``unordered_write``): marks the section for samples that copy
        outside the lock (:mod:`.reads`; None: they do not). Bound as they are: the table calls
        them with no frame of the host's in between.
        """
        self.segment, self.guard = segment, guard
        self.await_head, self.unordered_write = wait_for_head, mark_unordered  # type: ignore[method-assign]
        self.table.refresh_hooks()
        self.table.guard_with(guard)

    def reserve_outside_ring(self) -> None:
        """Reserve the out-of-ring structures' memory, left unreserved in ring mode (may raise ``DiskFull``)."""
        self.segment.reserve_deferred("leaving ring mode (a delete of items that are not the oldest)")

    def scalar_parts(self) -> dict[str, Any]:
        """The episode part, whose scalars are published with the table's."""
        return {} if self.episync is None else {"episync": self.episync}

    def before_publish(self) -> None:
        """The episode part writes this critical section's changes."""
        sync = self.episync
        if sync is not None:
            sync.push(self.table.ring(), self.guard.generation)

    def state_moved(self) -> None:
        """The episode index of this process catches up (not while it repairs the table: later, with the repair)."""
        sync = self.episync
        if sync is not None and not self.guard.recovering:
            table = self.table
            sync.pull(table.ring(), table.priorities, table.slot_keys)
