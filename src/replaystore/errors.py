"""One exception family for everything replaystore raises on purpose.

Every error derives from :class:`ReplayError`, and also from the built-in exception a Python
programmer would expect (``ValueError`` for bad input, ``KeyError`` for unknown keys,
``TimeoutError`` for timeouts), so both ``except rs.ReplayError`` and ``except ValueError`` work.

An operation that raises one of these has changed nothing: validation always runs before mutation.
"""

from __future__ import annotations


class ReplayError(Exception):
    """Base class of every error raised by replaystore."""


class SpecError(ReplayError, ValueError):
    """Data does not match the table's field spec (missing field, wrong shape or dtype)."""


class InvalidPriority(ReplayError, ValueError):
    """A priority is NaN, infinite, or negative where the sampler needs non-negative values."""


class KeyNotFound(ReplayError, KeyError):
    """A key is not (or no longer) in the table."""


class Timeout(ReplayError, TimeoutError):
    """A blocking call (rate limiter, fetch) did not proceed before its timeout passed."""


class Closed(ReplayError):
    """The table (or service) was closed; blocked and later calls raise this."""


class CheckpointError(ReplayError):
    """A checkpoint is missing, truncated, corrupted, or of an unknown format."""
