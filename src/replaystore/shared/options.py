"""Which Table options a shared table supports, checked before a segment is made.

A shared table keeps every part's state in the segment, so only the parts whose state can live
there are allowed (``SAMPLERS``, ``REMOVERS``), episodes need a fixed ``max_streams``, and the
storage is columns or frame stacks. Each check raises :class:`~replaystore.InvalidArgument` naming
what is supported; none has side effects.
"""

from __future__ import annotations

from typing import Any

from ..episodes import Episodes
from ..errors import InvalidArgument
from ..limiters import RateLimiter
from ..samplers import Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Selector, Uniform, WithoutReplacement
from ..storage import FrameStackStorage
from ..table.args import check_part

#: the samplers and removers whose state a segment can hold
SAMPLERS = (Uniform, Prioritized, Fifo, Lifo, MinHeap, MaxHeap, WithoutReplacement)
REMOVERS = (Fifo, Lifo, Uniform, MinHeap, MaxHeap)


def check_supported(sampler: Selector, remover: Selector, limiter: RateLimiter) -> None:
    """Raise ``InvalidArgument`` unless the parts are instances a segment can hold (names the ones it can)."""
    check_part(sampler, Selector, "sampler", "rs.Prioritized()")  # (a class, a string: named as such)
    check_part(remover, Selector, "remover", "rs.Fifo()")
    check_part(limiter, RateLimiter, "rate_limiter", "rs.MinSize(1)")
    for part, kinds, what in ((sampler, SAMPLERS, "support the"), (remover, REMOVERS, "evict with the")):
        if type(part) not in kinds:
            names = ", ".join(c.__name__ for c in kinds)
            kind = "samplers" if kinds is SAMPLERS else "removers"
            raise InvalidArgument(f"shared tables {what} {names} {kind}, not {type(part).__name__}")


def check_episodes(episodes: Episodes | None) -> None:
    """Raise ``InvalidArgument`` unless ``episodes`` is None or an ``Episodes`` with ``max_streams`` set."""
    if episodes is None:
        return
    if not isinstance(episodes, Episodes):
        raise InvalidArgument(f"episodes must be an rs.Episodes, got {type(episodes).__name__}")
    if episodes.max_streams is None:
        raise InvalidArgument(
            "a shared table with episodes needs Episodes(max_streams=...): its per-stream state is "
            "sized when the table is created"
        )


def storage_config(storage: Any, episodes: Episodes | None) -> dict:
    """The ``storage`` entry of a shared table's configuration (what :func:`from_description` rebuilds)."""
    if not isinstance(storage, FrameStackStorage):
        raise InvalidArgument(
            f"shared tables store columns (storage=None) or frame stacks (storage=rs.FrameStackStorage(...)), "
            f"not {storage!r}"
        )
    if episodes is not None:
        raise InvalidArgument("a shared table with episodes stores columns only (frame stacks are not supported yet)")
    desc = storage.describe()
    desc.pop("spec", None)
    desc.pop("capacity", None)
    return desc
