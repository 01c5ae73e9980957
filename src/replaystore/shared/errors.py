"""The errors of shared tables (all :class:`~replaystore.ReplayError`)."""

from __future__ import annotations

from ..errors import CheckpointError, InvalidArgument, ReplayError


class SharedTableNotFound(ReplayError, FileNotFoundError):
    """No shared table of that name in that directory (never created, or already removed)."""


class SharedTableExists(InvalidArgument, FileExistsError):
    """A shared table of that name exists already (created by another process, or left by a crash)."""


class LayoutMismatch(CheckpointError):
    """A segment that is not a shared table of this library's layout version (or is damaged)."""


class LockUnsupported(LayoutMismatch):
    """A table that locks with a mutex this process cannot use (the compiled module is not available)."""


__all__ = ["LayoutMismatch", "LockUnsupported", "SharedTableExists", "SharedTableNotFound"]
