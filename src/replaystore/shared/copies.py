"""The two copies of a shared table's scalar state in its segment's header.

Each copy is int64/float64 words: a generation number, an insert *intent* (rows an insert in
progress may be writing), then the values of ``HostedTable.state_scalars``, each an int64 or a float64
as its ``struct`` code (``"q"`` / ``"d"``) says. A selector
word says which copy is current. :meth:`publish` fills the copy that is not current and then
flips the selector (one aligned 8-byte store), so a reader, or a process that recovers after a
writer died, always finds one complete copy.

Two implementations of one interface: ``StateCopies`` of the compiled
:mod:`replaystore.shared._sync` (no argument packing: several times cheaper per call) and
:class:`PackedCopies` (``struct``), used when the module is not built or
``REPLAYSTORE_PURE_PYTHON=1``. Neither locks: callers hold the table's mutex.
"""

from __future__ import annotations

import mmap
import os
import struct

from ..errors import InvalidArgument

try:
    if os.environ.get("REPLAYSTORE_PURE_PYTHON", "") not in ("", "0"):
        raise ImportError("REPLAYSTORE_PURE_PYTHON is set")
    from ._sync import StateCopies
except ImportError:  # not built, or refused: struct packing
    StateCopies = None


def state_copies(mm: mmap.mmap, active_word: int, first_word: int, copy_words: int, codes: str):  # noqa: ANN201
    """The copies at word ``first_word`` (and ``first_word + copy_words``) of ``mm``, selected by ``active_word``.

    ``codes``: one ``"q"`` (int64) or ``"d"`` (float64) per scalar.

    Returns an object with ``read() -> (generation, intent, values)``, ``publish(generation,
    values)``, ``generation()`` and ``set_intent(n)`` (the current copy's).

    Raises:
        InvalidArgument: more scalars than a copy holds, or a code that is not ``"q"`` / ``"d"``.
    """
    if 2 + len(codes) > copy_words:
        raise InvalidArgument(f"the table's state has {len(codes)} scalars; a segment copy holds {copy_words - 2}")
    if codes.strip("qd"):
        raise InvalidArgument(f"state codes are 'q' or 'd', got {codes!r}")
    if StateCopies is not None:
        return StateCopies(mm, active_word * 8, first_word * 8, copy_words * 8, codes)
    return PackedCopies(mm, active_word, first_word, copy_words, codes)


class PackedCopies:
    """The ``struct`` implementation (see the module doc)."""

    def __init__(self, mm: mmap.mmap, active_word: int, first_word: int, copy_words: int, codes: str) -> None:
        self.mm = mm
        self.words = memoryview(mm).cast("q")
        self.active = active_word
        self.first = (first_word, first_word + copy_words)
        self.fmt = struct.Struct(f"<qq{codes}")

    def read(self) -> tuple[int, int, tuple]:
        """``(generation, intent, values)`` of the current copy."""
        raw = self.fmt.unpack_from(self.mm, self.first[self.words[self.active] & 1] * 8)
        return raw[0], raw[1], raw[2:]

    def publish(self, generation: int, values: tuple) -> None:
        """Write the copy that is not current (intent 0), then make it current."""
        other = (self.words[self.active] & 1) ^ 1
        self.fmt.pack_into(self.mm, self.first[other] * 8, generation, 0, *values)
        self.words[self.active] = other

    def generation(self) -> int:
        """The current copy's generation."""
        return self.words[self.first[self.words[self.active] & 1]]

    def set_intent(self, n: int) -> None:
        """Set the current copy's insert intent."""
        self.words[self.first[self.words[self.active] & 1] + 1] = n
