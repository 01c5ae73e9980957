"""RefCounts: explicit reference counting of fragment ids (when a payload may be deleted)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ..errors import KeyNotFound

__all__ = ["RefCounts"]


class RefCounts:
    """Explicit reference counts of fragment ids (no ``__del__``, no reliance on the GC).

    A holder (a chunk, a pending stream, a handed-out fetch) calls :meth:`incref` when it starts
    holding ids and :meth:`decref` when it lets go; ``decref`` returns the ids nobody holds any
    more, which the owner then deletes from the store. Not thread-safe: one owner (the service's
    event loop) drives it.
    """

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def incref(self, ids: Iterable[str]) -> None:
        """Add one reference to each id (an id listed twice gains two)."""
        c = self._counts
        for i in ids:
            c[i] = c.get(i, 0) + 1

    def decref(self, ids: Iterable[str]) -> list[str]:
        """Drop one reference from each id; return the ids whose count reached zero.

        Raises:
            KeyNotFound: an id holds no reference (a bookkeeping bug: nothing is changed).
        """
        c = self._counts
        need = Counter(ids)
        for i, k in need.items():
            if c.get(i, 0) < k:
                raise KeyNotFound(f"fragment {i!r} has {c.get(i, 0)} references, cannot drop {k}")
        freed = []
        for i, k in need.items():
            left = c[i] - k
            if left:
                c[i] = left
            else:
                del c[i]
                freed.append(i)
        return freed

    def count(self, fragment_id: str) -> int:
        """References held on ``fragment_id`` (0 if none)."""
        return self._counts.get(fragment_id, 0)

    def __contains__(self, fragment_id: object) -> bool:
        return fragment_id in self._counts

    def __len__(self) -> int:
        return len(self._counts)

    def ids(self) -> list[str]:
        """Every referenced id."""
        return list(self._counts)
