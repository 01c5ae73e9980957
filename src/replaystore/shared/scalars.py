"""A shared table's scalars live in its segment: the parts' attributes read and write its words.

Every part of a Table lists the scalars it changes (the placement's scalar hook:
``HostedTable.scalar_fields``): the table's counters and ring numbers, the rate limiter's counters, the
selectors' sizes and heads. In-process they are plain attributes. In a shared table each part's
class is swapped for a subclass (one per table and process, no new slots) whose class attributes
are :class:`~replaystore.shared._sync.Word` descriptors, one per scalar: the value is an int64 or
float64 word of the segment's ``shared.scalars`` region, which every process reads and writes
under the table's lock. No process keeps a copy, so entering the lock loads nothing and leaving
it writes nothing but the published copy for crash recovery (``StateCopies.commit``: the words
as they were when the lock was last left, which a process that finds the holder dead puts back).
Costs: docs/shared.md "How it works".
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

try:
    if os.environ.get("REPLAYSTORE_PURE_PYTHON", "") not in ("", "0"):
        raise ImportError("REPLAYSTORE_PURE_PYTHON is set")
    from ._sync import Word
except ImportError:  # not built: only flock tables, whose processes keep copies of the scalars
    Word = None

#: the region of the scalars' words (int64; floats are stored as their bits)
REGION = "shared.scalars"


class PlacedScalars:
    """The scalars of one Table placed in ``words`` (binds on construction; :meth:`unbind` to undo)."""

    def __init__(self, fields: list[tuple[Any, str, str]], words: np.ndarray, write: bool) -> None:
        """Place ``fields`` (``(object, attribute, code)``, in order) in ``words``, one word each.

        ``write``: first store the objects' current values (a new segment); else the words already
        hold the table's state (another process created it).

        Raises:
            InvalidState: more fields than words.
        """
        if len(fields) > len(words):
            from ..errors import InvalidState

            raise InvalidState(f"the table has {len(fields)} scalars; its segment holds {len(words)}")
        self.words = words
        self.originals: dict[int, tuple[Any, type]] = {}
        values = [getattr(obj, attr) for obj, attr, _ in fields] if write else None
        by_object: dict[int, dict[str, Word]] = {}
        for i, (obj, attr, code) in enumerate(fields):
            self.originals.setdefault(id(obj), (obj, type(obj)))
            by_object.setdefault(id(obj), {})[attr] = Word(words, 8 * i, code)
        for key, (obj, cls) in self.originals.items():
            namespace = {"__slots__": (), "__module__": cls.__module__, **by_object[key]}
            obj.__class__ = type(cls.__name__, (cls,), namespace)
        if write:
            for (obj, attr, _), value in zip(fields, values):
                setattr(obj, attr, value)
        self.fields = fields

    def slots_of(self, *groups: tuple[Any, tuple[str, ...]]) -> bytes | None:
        """The words of the scalars named by ``(object, names)`` groups, in order, as int64 bytes (None: one absent)."""
        index = {(id(obj), attr): i for i, (obj, attr, _) in enumerate(self.fields)}
        try:
            return np.asarray([index[id(obj), n] for obj, names in groups for n in names], np.int64).tobytes()
        except KeyError:
            return None

    def unbind(self) -> None:
        """Give every object its own class back, holding the values the words hold now (a snapshot)."""
        values = [getattr(obj, attr) for obj, attr, _ in self.fields]
        for obj, cls in self.originals.values():
            obj.__class__ = cls
        for (obj, attr, _), value in zip(self.fields, values):
            setattr(obj, attr, value)
