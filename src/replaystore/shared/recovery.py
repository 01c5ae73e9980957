"""Recovery after a process died inside a shared table's critical section.

What the dead process may have left: the current state copy is complete (copies are flipped, never
written in place), but it is the state from *before* the dead call, while the shared arrays may
hold part of that call's writes:

- an insert (its ``intent`` says how many rows) may have overwritten the payload of the oldest
  items when the table was full: those items are dropped (the rows at keys ``next_key ..
  next_key + intent - 1`` map to their slots);
- metadata rows: new keys written into free slots, ``-1`` written over items being removed
  (evictions, retirements, deletes of the oldest items), times-sampled counts;
- the ``Prioritized`` trees: leaves and ancestors half updated.

:func:`reconcile` makes every part agree with the ring ``[lo, hi)`` again: it drops the live items
the insert may have overwritten and every live item up to the last whose metadata row no longer
holds its key (removals take the oldest first, so that is a prefix), clears the rows of free
slots, rebuilds the sampler's trees from the metadata (a ``remove`` of the free slots and an
``update`` of the live ones: every ancestor is recomputed), and counts the dropped items as
deleted and evicted. ``O(capacity)``, once per crash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..samplers import Prioritized

if TYPE_CHECKING:
    from ..table import Table
    from .segment import Segment


def reconcile(
    table: "Table", segment: "Segment", names: tuple[str, ...], values: tuple, intent: int
) -> tuple[tuple, int]:
    """The repaired state (as ``Table.state_scalars`` values) and how many items were dropped.

    Writes the repairs into the segment's arrays (metadata rows, sampler trees); the caller
    publishes the state.
    """
    v = dict(zip(names, values))
    cap = table.capacity
    base, lo, hi = v["ring_base"], v["ring_lo"], v["ring_hi"]
    old_size = hi - lo
    if intent > 0:  # an insert at next_key may have written the slots of the oldest items
        lo = max(lo, min(v["next_key"] + intent - cap, hi))
    meta = segment.view("table.meta")
    keys = np.arange(lo, hi, dtype=np.int64)
    slots = (keys - base) % cap
    bad = np.flatnonzero(meta[slots, 0] != keys)
    if len(bad):
        lo += int(bad[-1]) + 1
        keys, slots = keys[int(bad[-1]) + 1 :], slots[int(bad[-1]) + 1 :]
    free = np.ones(cap, dtype=bool)
    free[slots] = False
    free_slots = np.flatnonzero(free)
    meta[free_slots, 0] = -1
    sampler = table.sampler
    if isinstance(sampler, Prioritized):
        if len(free_slots):
            sampler.remove(free_slots)
        if len(slots):
            order = np.argsort(slots)
            s = slots[order]
            sampler.update(s, keys[order], meta.view(np.float64)[s, 3].copy())
    dropped = old_size - (hi - lo)
    v.update(ring_lo=lo, size=hi - lo, nfree=cap - (hi - lo))
    for name in ("limiter_deletes", "deletes", "evictions"):
        v[name] += dropped
    return tuple(v[n] for n in names), dropped
