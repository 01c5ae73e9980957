"""The last few draws of a table handle: catches a sample's ``indices`` passed where keys belong.

Why, and what the user sees: ``docs/per.md``, "Keys, not indices". Keys and slots are both int64
arrays, so the table cannot tell them apart by type; it keeps the ``(indices, keys)`` of its last
:data:`KEPT` draws (two references each, no copy) and refuses an update whose key array is element
for element one of those draws' indices while differing from that draw's keys (and from every kept
draw's keys). Arrays of one element are not checked (a single key equal to a recent single slot is
too likely to be a coincidence).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from ..errors import InvalidArgument

#: how many draws a table handle remembers (a prefetching iterator may be a few samples ahead)
KEPT = 8


class RecentDraws:
    """``(indices, keys)`` of a table handle's last :data:`KEPT` draws.

    Thread-safe: ``record`` is one ``deque.append``; ``check`` reads a snapshot.
    """

    def __init__(self) -> None:
        # (indices, keys, first index, first key): the firsts as Python ints, a cheap first test
        self._draws: deque[tuple[np.ndarray, np.ndarray, int, int]] = deque(maxlen=KEPT)

    def record(self, indices: np.ndarray, keys: np.ndarray) -> None:
        """Remember one draw (the arrays the returned :class:`~replaystore.Sample` holds)."""
        if len(keys):
            self._draws.append((indices, keys, int(indices[0]), int(keys[0])))

    def check(self, keys: np.ndarray, given: Any = None) -> None:
        """Raise if ``keys`` (int64, 1-D) are a recent draw's indices rather than keys.

        ``given`` is the caller's argument before conversion: a view of a kept draw's metadata
        rows (``Sample.keys`` as returned, a strided column that the conversion copies) is
        recognised by its base array alone, without comparing elements (a draw's indices are
        their own array, never a view of its rows).

        Raises:
            InvalidArgument: ``keys`` equal a kept draw's ``indices`` and no kept draw's ``keys``.
        """
        n = len(keys)
        if n < 2 or not self._draws:
            return
        base = given.base if isinstance(given, np.ndarray) else None
        draws = list(self._draws)[::-1]  # newest first: usually the draw being answered
        if base is not None:
            for _, k, _, _ in draws:
                if k.base is base:
                    return
        first = int(keys[0])
        for _, k, _, k0 in draws:
            if k is keys or (k0 == first and len(k) == n and np.array_equal(k, keys)):
                return
        for i, _, i0, _ in draws:
            if i0 == first and len(i) == n and np.array_equal(i, keys):
                raise InvalidArgument(
                    "update_priorities takes keys (Sample.keys), but got the indices (storage slots) "
                    "of a recent sample: slots are reused once the table wraps, so they name other "
                    "items or none. Pass s.keys (see docs/per.md, 'Keys, not indices')"
                )
