"""The Table: one class, built from modules that each hold one concept.

- :mod:`.core`: construction, insert, sample, queries; the lock, waiting and sample accounting.
- :mod:`.edit`: calls by key (get, info, update_priorities, update_fields, delete) and set_version/clear/close.
- :mod:`.insert`: the general insert path (validation, staleness, rate limiter, eviction).
- :mod:`.fast`: the compiled ring writes and the staging of single adds.
- :mod:`.ring`: slot bookkeeping (free slots, removal, eviction in place, leaving ring mode).
- :mod:`.episodic`: the episode methods around the planners of :mod:`replaystore.episodes`.
- :mod:`.host`: where the state lives and who locks it (:class:`TableHost`, given at construction;
  in-process by default, a shared-memory segment's in :mod:`replaystore.shared`).
- :mod:`.journal`: a write-ahead log's view of a table (:class:`Journal`: ``locked``, ``wal_lsn``,
  ``replay_*``), not the Table's own methods.
- :mod:`.persist`: snapshots, ``save``/``load`` through :mod:`replaystore.checkpoint`.
- :mod:`.stats`: ``stats()``.
- :mod:`.state`: :class:`TableState`, every mutable scalar in one object; the metadata rows.
- :mod:`.args`: argument checks shared by the above.
"""

from .core import Table
from .state import STATE_DTYPE, TableState

__all__ = ["STATE_DTYPE", "Table", "TableState"]
