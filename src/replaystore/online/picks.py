"""Pick policies: which complete groups inside the staleness window a sample takes.

``"fifo"``: ready first (the oldest complete group, by admission (ticket) order with pacing, by
completion order without); ``"in_order"``: strictly in admission order; ``"uniform"``: distinct
groups uniformly at random (MineStudio's chunk selection); ``"freshest"``: the newest policy
version first (by the range's staleness end; ties: the group that completed last, not the highest
ticket). What a paced sample waits for with each, and the guarantee it then gives:
docs/online.md, "Semantics" (pick policies).

Each policy is a Table selector plus the priority a group gets in it, so the Table does the
choosing (``MinHeap``/``MaxHeap`` are ordered by priority, ties by insertion).
"""

from __future__ import annotations

from ..errors import InvalidRequest
from ..samplers import MaxHeap, MinHeap, Selector
from ..samplers.uniform_distinct import UniformDistinct

PICKS = ("fifo", "in_order", "uniform", "freshest")
_TIE = float(1 << 31)


def check_pick(pick: str) -> str:
    """``pick`` if it names a policy; else :class:`InvalidRequest`."""
    if pick not in PICKS:
        raise InvalidRequest(f"pick must be one of {PICKS}, got {pick!r}")
    return pick


def make_selector(pick: str) -> Selector:
    """The Table sampler implementing ``pick``."""
    if pick == "uniform":
        return UniformDistinct()
    if pick in ("fifo", "in_order"):
        return MinHeap()
    return MaxHeap()


def priority(pick: str, order: int, end_version: int, arrival: int = 0) -> float:
    """A group's priority in the selector of ``pick``.

    ``fifo``/``in_order``: its admission ``order``; ``freshest``: its version, ties broken by
    ``arrival`` (completion rank: the newest arrival first, whatever its ticket's number).
    """
    if pick in ("fifo", "in_order"):
        return float(order)
    if pick == "freshest":
        return float(end_version) + (arrival % (1 << 31)) / _TIE
    return 1.0


__all__ = ["PICKS", "check_pick", "make_selector", "priority"]
