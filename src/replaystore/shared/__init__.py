"""Shared tables: one Table that several processes on one host open by name (docs/shared.md).

``SharedTable.create(name, capacity, spec, ...)`` makes the segment (in ``/dev/shm`` by default),
``SharedTable.attach(name)`` opens it from any process; ``list_segments`` and ``remove`` find and
delete leftovers of crashed runs (also ``replaystore shm list|rm``).
"""

from __future__ import annotations

from pathlib import Path

from .directory import list_segments, path_of, remove_dir
from .errors import LayoutMismatch, LockUnsupported, SharedTableExists, SharedTableNotFound
from .lock import set_spin
from .table import SharedTable


def remove(name: str, directory: str | None = None, force: bool = False) -> bool:
    """Remove the shared table ``name``'s files; only when no process has it open, unless ``force``.

    Returns whether it was removed. Raises :class:`SharedTableNotFound` if there is no such table,
    :class:`SharedTableExists` if it is open somewhere and ``force`` is not set.
    """
    path = path_of(name, directory)
    info = next((s for s in list_segments(path.parent) if s["name"] == name), None)
    if info is None:
        raise SharedTableNotFound(f"no shared table {name!r} in {path.parent}")
    if not info["orphaned"] and not force:
        raise SharedTableExists(
            f"shared table {name!r} is open in pids {info.get('pids')}: close it there, or pass force=True"
        )
    return remove_dir(Path(info["path"]))


__all__ = [
    "LayoutMismatch",
    "LockUnsupported",
    "SharedTable",
    "SharedTableExists",
    "SharedTableNotFound",
    "list_segments",
    "remove",
    "set_spin",
]
