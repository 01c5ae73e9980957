"""Recovery after a process died inside a shared table's critical section (docs/shared.md "Guarantees", "No torn row").

The published state copy (from before the dead call) and the keys are the truth; the arrays may
hold part of the dead call's writes. :func:`reconcile` keeps the items the published
state holds, minus the items whose payload the dead call may have overwritten. In ring mode the
keys are implicit (the ring's bounds): it drops the oldest ones the dead insert's ``intent``
(rows it may write) or the header's *written_hi* word (one past the newest key whose row a write
began: ``shared.reads``) reaches; if that word is -1 the dead call had left ring mode and the key
column it wrote out is the truth, as out of ring mode, where an item stays whose key column
entry still holds a key the published state knows (``key < next_key``), minus the victims the
dead insert noted before writing (``ProcessGuard.note_victims``). New keys of the dead insert
(``>= next_key``) are not published: their slots are free again.

- In ring mode, when the kept items are still one run of keys (removals take the oldest first),
  the ring bounds move past the dropped ones, free rows are cleared and the ``Prioritized`` trees
  are rebuilt from the metadata (a ``remove`` of the free slots and an ``update`` of the live ones:
  every ancestor is recomputed).
- Otherwise (out of ring mode, or a call that had just taken the table out of it) every derived
  structure is rebuilt from the kept rows (``HostedTable.rebuild_from_rows``: keys increase, so
  insertion order is key order; trees and sets from the priorities), and the table is out of ring
  mode.

A storage with derived state of its own (``FrameStackStorage``: a frame ring shared by items)
first says which published items the dead insert may have torn (``intact_after_crash``: frames
it may have overwritten) and then rebuilds its alive flags and log from the kept items
(``rebuild_after_crash``).

The dropped items are counted as deleted and evicted. ``O(capacity)``, once per crash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..rows import META_PRIORITY, UNKEPT_PRIORITY
from ..samplers import Prioritized
from .header import W_WRITTEN_HI

if TYPE_CHECKING:
    from ..table.host import HostedTable
    from .segment import Segment


def reconcile(
    table: "HostedTable",
    segment: "Segment",
    names: tuple[str, ...],
    values: tuple,
    intent: int,
    victims: np.ndarray | None = None,
) -> tuple[tuple, int]:
    """The repaired state (as ``HostedTable.state_scalars`` values) and how many items were dropped.

    Writes the repairs into the segment's arrays; the caller publishes the state. ``victims``:
    the slots the dead insert noted it would overwrite (out of ring mode).
    """
    v = dict(zip(names, values))
    cap = table.capacity
    meta = segment.view("table.meta")
    key_column = segment.view("table.keys")
    hi_word = np.frombuffer(segment.words, dtype=np.int64)[W_WRITTEN_HI : W_WRITTEN_HI + 1]
    # (untrusted: at most what a write or a removal of the oldest items could have set, or -1)
    written_hi = max(-1, min(int(hi_word[0]), v["next_key"] + max(cap, intent)))
    old_size = v["size"]
    if v["ring_mode"]:
        base, lo, hi = v["ring_base"], v["ring_lo"], v["ring_hi"]
        reach = v["next_key"] + max(intent, 0)  # (an insert at next_key may have written the oldest items' slots)
        lo = max(lo, min(max(reach, written_hi) - cap, hi))
        keys = np.arange(lo, hi, dtype=np.int64)
        slots = (keys - base) % cap
        if written_hi < 0:  # the dead call had left ring mode (its regions reserved): the key column it wrote out tells
            good = key_column[slots] == keys
        else:
            good = np.ones(len(keys), dtype=bool)
        hi_word[0] = max(reach, written_hi, lo + cap)  # (ring mode again, if it stays: readers check against it)
        intact = table.storage.intact_after_crash(slots, _storage_scalars(v), intent)
        if intact is not None:  # (frame stacks: frames the dead insert may have overwritten)
            good &= intact
        bad = np.flatnonzero(~good)
        if not len(bad) or bad[-1] == len(bad) - 1:  # the removed items were the oldest: still a ring
            kept = slots[len(bad) :]
            _rebuild_storage(table, kept, v)
            return _ring(table, meta, v, names, keys[len(bad) :], kept, hi, old_size)
        keep = slots[good]  # (rebuild_from_rows takes their keys from the ring, then leaves it)
    else:
        keys = key_column
        live = (keys >= 0) & (keys < v["next_key"])
        if victims is not None and len(victims):
            live[victims] = False
        keep = np.flatnonzero(live)
        intact = table.storage.intact_after_crash(keep, _storage_scalars(v), intent)
        if intact is not None:
            keep = keep[intact]
    table.load_state_scalars(values)
    table.rebuild_from_rows(keep)
    key_column = segment.view("table.keys")  # (written out by the rebuild)
    _rebuild_storage(table, keep[np.argsort(key_column[keep], kind="stable")], v)
    dropped = old_size - len(keep)
    v = dict(zip(names, table.state_scalars()))
    _count(v, dropped)
    return tuple(v[n] for n in names), dropped


def _ring(table: "HostedTable", meta: np.ndarray, v: dict, names: tuple, keys, slots, hi: int, old_size: int):
    """Ring mode whose live items are still the run ``keys`` (at ``slots``): clear the rest, fix the trees."""
    cap = table.capacity
    lo = int(keys[0]) if len(keys) else hi
    free = np.ones(cap, dtype=bool)
    free[slots] = False
    free_slots = np.flatnonzero(free)
    sampler = table.sampler
    if isinstance(sampler, Prioritized):
        if len(free_slots):
            sampler.remove(free_slots)
        if len(slots):
            order = np.argsort(slots)
            s = slots[order]
            prio = meta.view(np.float64)[s, META_PRIORITY].copy() if meta.shape[1] > META_PRIORITY else None
            sampler.update(s, keys[order], prio if prio is not None else np.full(len(s), UNKEPT_PRIORITY))
    dropped = old_size - (hi - lo)
    v.update(ring_lo=lo, size=hi - lo, nfree=cap - (hi - lo))
    _count(v, dropped)
    return tuple(v[n] for n in names), dropped


def _storage_scalars(v: dict) -> dict:
    """The storage's published scalars (named ``storage.<attribute>``), by attribute."""
    return {n[8:]: x for n, x in v.items() if n.startswith("storage.")}


def _rebuild_storage(table: "HostedTable", kept: np.ndarray, v: dict) -> None:
    """Let the storage rebuild what derives from the kept items (in key order); note its scalars in ``v``."""
    for name, value in table.storage.rebuild_after_crash(kept, _storage_scalars(v)).items():
        v["storage." + name] = value


def _count(v: dict, dropped: int) -> None:
    for name in ("limiter.deletes", "deletes", "evictions"):
        v[name] += dropped
