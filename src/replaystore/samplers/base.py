"""The selector interface shared by samplers and removers (as in Reverb's ``ItemSelector``).

A selector tracks the live items of a table, by storage slot, and picks some of them: the table
asks its *sampler* selector which items to return from ``sample`` and its *remover* selector which
items to evict when it is full. The same classes serve both roles where that makes sense (a
``Fifo`` remover evicts the oldest item; a ``Fifo`` sampler returns it).

Contract (the Table guarantees the preconditions and calls everything under its lock, so selectors
need no locking of their own):

- ``insert(slots, keys, priorities)``: ``slots`` are distinct and not currently tracked.
- ``update(slots, keys, priorities)``: ``slots`` are distinct and tracked; priorities changed.
- ``remove(slots)``: ``slots`` are distinct and tracked; forget them.
- ``replace(slots, keys, priorities)``: ``slots`` are distinct and tracked; their items were
  evicted and new items took the same slots (the same as ``remove`` then ``insert``, which is the
  default; selectors for which a slot's membership is all that matters make it cheaper).
- ``sample(n)`` with ``n >= 1`` and at least one tracked item: returns ``(slots, probabilities,
  weights)``; ``weights`` may be ``None`` (all ones). May contain duplicates.
- ``replay_sample(slots)``: a logged sample drew these tracked slots; advance what ``sample``
  would have (default: nothing).
- ``victims(n)`` with ``1 <= n <= size``: ``n`` distinct tracked slots to evict, without changing
  any state (the table calls ``remove`` afterwards).
- ``follow(ring)``: the table's items are one run of keys that leave oldest first (a
  :class:`~replaystore.keys.RingIndex`); a selector whose state that run determines may answer
  ``sample``/``victims`` from it and return ``True``: the table then stops calling its
  ``insert``/``remove``/``replace``/``update`` until ``unfollow(slots, keys, priorities)`` hands it
  the live items (oldest first) to track itself. A selector bound under a placement
  (:func:`replaystore.placement.placing`) keeps its state allocated while it follows, and
  ``unfollow(None, None, None)`` means: that placed state already holds the items (another
  process of a shared table filled it), stop following.
- Placement: arrays come from :func:`replaystore.placement.allocate` (the Table binds the sampler
  under the name scope ``"sampler."``, the remover under ``"remover."``); a selector's mutable
  scalars are listed for the scalar hook (``SCALARS``, ``scalar_parts()``; see the placement doc).
- ``priorities`` are float64, finite, and non-negative when ``requires_nonnegative``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Selector(ABC):
    """Base class of all samplers/removers."""

    #: a remover must support ``victims``
    usable_as_remover: bool = True
    #: the table rejects negative priorities when this is set
    requires_nonnegative: bool = False
    #: whether the selector uses the priorities it is handed (a table whose selectors all say
    #: ``False`` keeps no per-item priority: ``replaystore.rows.META_WIDTH_NO_PRIORITY``)
    reads_priorities: bool = True
    #: ``sample(n, uniforms=u)`` accepts the ``rng.random(n)`` numbers the draw would take, drawn
    #: beforehand by a caller that holds a lock for the draw (it draws them before taking the lock)
    takes_uniforms: bool = False
    #: prefixes of the names of the placed arrays (:mod:`replaystore.placement`) this selector
    #: neither reads nor writes while its table is in ring mode (it follows the ring, or shares
    #: the ring's set of live slots); a shared table reserves their memory when it leaves ring mode
    RING_UNUSED: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.capacity = 0
        self.rng: np.random.Generator = np.random.default_rng()

    def bind(self, capacity: int, rng: np.random.Generator) -> None:
        """Allocate state for ``capacity`` slots; called once by the Table that owns the selector."""
        self.capacity = int(capacity)
        self.rng = rng

    @abstractmethod
    def insert(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Start tracking new items."""

    def update(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Priorities of tracked items changed (default: ignored)."""

    @abstractmethod
    def remove(self, slots: np.ndarray) -> None:
        """Stop tracking items."""

    def replace(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """New items took the tracked ``slots`` (default: ``remove`` then ``insert``)."""
        self.remove(slots)
        self.insert(slots, keys, priorities)

    @abstractmethod
    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Pick ``n`` items: ``(slots, probabilities, weights or None)``.

        Selectors with :attr:`takes_uniforms` also take ``uniforms``: ``self.rng.random(n)`` drawn
        by the caller (the same stream, so the same items for the same seed as drawing them here).
        """

    def warm_up(self, uniforms: np.ndarray, meta: np.ndarray) -> None:
        """Bring into the cache what ``sample(n, uniforms)`` will read; a hint (default: nothing).

        Called without the table's lock by a caller that drew ``uniforms`` beforehand (a shared
        table, so that the draw under the lock finds the table's ``(capacity, 4)`` metadata rows
        in the cache). May read state that changes meanwhile; must not change anything.
        """

    def replay_sample(self, slots: np.ndarray) -> None:
        """A recorded sample drew the tracked ``slots`` (replayed from a log).

        Advance any state ``sample`` would have advanced for this draw (default: none).
        """

    def victims(self, n: int) -> np.ndarray:
        """``n`` distinct slots to evict (state unchanged)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be used as a remover")

    @abstractmethod
    def clear(self) -> None:
        """Forget every item."""

    def follow(self, ring) -> bool:
        """Derive this selector's state from ``ring`` from now on, if it can (default: it cannot)."""
        return False

    def unfollow(self, slots: np.ndarray, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Stop following the ring; track the live ``slots`` (oldest first) explicitly."""
        raise NotImplementedError

    def config(self) -> dict:
        """Constructor arguments as JSON (``{"type": name, **kwargs}``) for checkpoints."""
        return {"type": type(self).__name__}

    def export_state(self, key_of_slot: np.ndarray) -> dict:
        """JSON-able state beyond what re-inserting the items restores (keys, not slots)."""
        return {}

    def import_state(self, state: dict, slot_of_key: dict[int, int]) -> None:
        """Restore :meth:`export_state` output after the items were re-inserted."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "type")
        return f"{type(self).__name__}({args})"
