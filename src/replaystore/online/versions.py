"""VersionRange: the policy versions an item was produced with, and how stale it is.

A rollout generated while the weights were updated (a *partial rollout* continued across a version
change) was produced by several policy versions; it carries the oldest and the newest. Staleness is
``current_version - end``, where ``end`` is the range's ``"min"`` end (the default: an item is as
stale as its oldest part) or its ``"max"`` end (as fresh as its newest part).
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

from ..errors import InvalidRequest

STALENESS_ENDS = ("min", "max")


def check_int(value: Any, what: str, minimum: int | None = 0) -> int:
    """``value`` as an ``int`` if it is an integer (not a bool) ``>= minimum``; else :class:`InvalidRequest`."""
    if type(value) is not int:  # the common case skips the ABC check
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise InvalidRequest(f"{what} must be an integer, got {value!r} ({type(value).__name__})")
        value = int(value)
    if minimum is not None and value < minimum:
        raise InvalidRequest(f"{what} must be >= {minimum}, got {value}")
    return value


def check_end(end: str) -> str:
    """``end`` if it is ``"min"`` or ``"max"``; else :class:`InvalidRequest`."""
    if end not in STALENESS_ENDS:
        raise InvalidRequest(f"staleness end must be one of {STALENESS_ENDS}, got {end!r}")
    return end


class VersionRange(NamedTuple):
    """The oldest and newest policy version that produced an item (``min <= max``).

    Build one with :meth:`of` (validates) or :meth:`start`; extend it with :meth:`observe` as a
    partial rollout continues under newer weights.
    """

    min: int
    max: int

    @classmethod
    def of(cls, versions: Any) -> "VersionRange":
        """A range from an int (one version), a ``(min, max)`` pair or a ``VersionRange``.

        Raises:
            InvalidRequest: not integers, negative, or ``min > max`` (a ``VersionRange`` built
                directly is checked like a tuple). Nothing is changed anywhere.
        """
        if isinstance(versions, (tuple, list)):  # a VersionRange is a tuple: validated the same way
            if len(versions) != 2:
                raise InvalidRequest(f"a version range is (min, max), got {versions!r}")
            lo = check_int(versions[0], "min version")
            hi = check_int(versions[1], "max version")
        else:
            lo = hi = check_int(versions, "version")
        if lo > hi:
            raise InvalidRequest(f"version range min {lo} > max {hi}")
        return cls(lo, hi)

    @classmethod
    def start(cls, version: int) -> "VersionRange":
        """The range of a rollout begun under ``version``."""
        v = check_int(version, "version")
        return cls(v, v)

    def observe(self, version: int) -> "VersionRange":
        """The range widened to include ``version`` (a partial rollout continued under it)."""
        v = check_int(version, "version")
        return VersionRange(min(self.min, v), max(self.max, v))

    def merge(self, other: "VersionRange") -> "VersionRange":
        """The smallest range containing both (a group's range from its members')."""
        return VersionRange(min(self.min, other.min), max(self.max, other.max))

    def end(self, which: str) -> int:
        """The ``"min"`` or ``"max"`` end."""
        return self.min if which == "min" else self.max

    def staleness(self, current: int, which: str = "min") -> int:
        """``current - end(which)`` (may be negative for a version newer than ``current``)."""
        return int(current) - self.end(which)


__all__ = ["STALENESS_ENDS", "VersionRange", "check_end", "check_int"]
