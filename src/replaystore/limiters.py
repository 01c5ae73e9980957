"""Rate limiters with DeepMind Reverb's semantics.

A limiter watches three counters of its table: ``inserts``, ``samples`` (items returned, a batch of
``n`` counts ``n``) and ``deletes`` (evictions, explicit deletes, items retired after
``max_times_sampled``), so ``size = inserts - deletes``. With
``diff = inserts * samples_per_insert - samples``:

- a sample of ``n`` may proceed when ``size >= min_size_to_sample`` and
  ``diff - n >= min_diff``;
- an insert of ``n`` may proceed when ``size + n <= min_size_to_sample`` (filling up is free), or
  else ``(inserts + n) * samples_per_insert - samples <= max_diff``.

A call that may not proceed blocks (in the Table) until another call changes the counters, its
timeout passes (:class:`~replaystore.Timeout`) or the table is closed
(:class:`~replaystore.Closed`). Limiters hold no lock: the Table calls them under its own.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction

from .errors import InvalidArgument, RateLimitError

_MAX = sys.float_info.max


class RateLimiter:
    """The general limiter; the named subclasses below are the usual configurations.

    Args:
        samples_per_insert: target number of samples per inserted item.
        min_size_to_sample: samples block until the table holds at least this many items (>= 1).
        min_diff: the lower end of the allowed range of ``inserts * samples_per_insert - samples``.
        max_diff: its upper end.
    """

    #: the scalar hook (:mod:`replaystore.placement`): the counters a shared table publishes
    SCALARS = ("inserts", "samples", "deletes")
    #: the constructor arguments :meth:`config` records (attributes of the same names)
    CONFIG: tuple[str, ...] = ("samples_per_insert", "min_size_to_sample", "min_diff", "max_diff")
    # Slots (plus a __dict__ for subclasses' own attributes): the compiled add/extend
    # (replaystore._ring) reads and moves the counters in place, as it does the TableState's.
    __slots__ = (*CONFIG, *SCALARS, "__dict__", "__weakref__")

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, min_diff: float, max_diff: float) -> None:
        if min_size_to_sample < 1:
            raise InvalidArgument(f"min_size_to_sample must be >= 1, got {min_size_to_sample}")
        if samples_per_insert <= 0:
            raise InvalidArgument(f"samples_per_insert must be > 0, got {samples_per_insert}")
        if min_diff > max_diff:
            raise InvalidArgument(f"min_diff ({min_diff}) must be <= max_diff ({max_diff})")
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = int(min_size_to_sample)
        self.min_diff = float(min_diff)
        self.max_diff = float(max_diff)
        self.inserts = 0
        self.samples = 0
        self.deletes = 0

    # -- the two questions ------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Items in the table as the limiter counts them."""
        return self.inserts - self.deletes

    def can_sample(self, n: int) -> bool:
        """Whether a sample of ``n`` items may proceed now."""
        if self.size < self.min_size_to_sample:
            return False
        return self.inserts * self.samples_per_insert - self.samples - n >= self.min_diff

    def can_insert(self, n: int) -> bool:
        """Whether an insert of ``n`` items may proceed now."""
        if self.size + n <= self.min_size_to_sample:
            return True
        return (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff

    def _reachable_range(self) -> tuple[float, float]:
        """The range ``diff`` can reach.

        ``diff = inserts * samples_per_insert - samples`` with integer counters, so when
        ``samples_per_insert`` is a fraction ``p/q`` (an integer is ``p/1``), ``diff`` lives on
        multiples of ``1/q``: the bounds round inwards to that grid (an ``error_buffer`` off the
        grid cannot be reached exactly).
        """
        key = (self.samples_per_insert, self.min_diff, self.max_diff)
        cached = self.__dict__.get("_range_cache")
        if cached is not None and cached[0] == key:
            return cached[1]
        lo, hi = self.min_diff, self.max_diff
        frac = Fraction(self.samples_per_insert).limit_denominator(10_000)
        if abs(float(frac) - self.samples_per_insert) < 1e-12:
            q = frac.denominator
            if lo > -_MAX / 2:
                lo = math.ceil(lo * q - 1e-9) / q
            if hi < _MAX / 2:
                hi = math.floor(hi * q + 1e-9) / q
        self._range_cache = (key, (lo, hi))  # configuration only: computed once
        return lo, hi

    def check_insert_size(self, n: int) -> None:
        """Raise :class:`RateLimitError` (a ``ValueError``) if an insert of ``n`` could never proceed.

        Inserting ``n`` at the lowest ``diff`` reachable from now (the current one, or the lowest
        that samples can bring it to) must stay within the highest reachable one, unless the batch
        fits below ``min_size_to_sample``.
        """
        if n <= self.min_size_to_sample:
            return
        lo, hi = self._reachable_range()
        best = min(self.inserts * self.samples_per_insert - self.samples, lo)
        if n * self.samples_per_insert + max(best, -_MAX / 2) > hi:
            raise RateLimitError(
                f"an insert of {n} items can never satisfy {self!r} "
                f"(needs n * samples_per_insert <= max_diff - min_diff); insert smaller batches"
            )

    def check_sample_size(self, n: int) -> None:
        """Raise :class:`RateLimitError` (a ``ValueError``) if a sample of ``n`` could never proceed."""
        lo, hi = self._reachable_range()
        if n > hi - lo:
            raise RateLimitError(
                f"a sample of {n} items can never satisfy {self!r} "
                f"(needs n <= max_diff - min_diff); sample smaller batches"
            )

    # -- bookkeeping -------------------------------------------------------------------------
    def reset(self) -> None:
        """Zero the counters (the table was cleared)."""
        self.inserts = self.samples = self.deletes = 0

    def config(self) -> dict:
        """Constructor arguments as JSON, for checkpoints (``type``: the nearest class of :data:`LIMITERS`)."""
        kind = next(c.__name__ for c in type(self).__mro__ if LIMITERS.get(c.__name__) is c)
        return {"type": kind, **{name: getattr(self, name) for name in self.CONFIG}}

    def state(self) -> dict:
        """The counters, for checkpoints."""
        return {name: getattr(self, name) for name in RateLimiter.SCALARS}

    def load_state(self, state: dict) -> None:
        """Restore :meth:`state` output."""
        for name in RateLimiter.SCALARS:
            setattr(self, name, int(state[name]))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "type")
        return f"{type(self).__name__}({args})"


class MinSize(RateLimiter):
    """Block sampling until the table holds ``min_size_to_sample`` items; never block inserts."""

    CONFIG = ("min_size_to_sample",)

    def __init__(self, min_size_to_sample: int = 1) -> None:
        super().__init__(1.0, min_size_to_sample, -_MAX, _MAX)


class SampleToInsertRatio(RateLimiter):
    """Keep the ratio of samples to inserts near ``samples_per_insert``.

    Args:
        samples_per_insert: the target ratio.
        min_size_to_sample: no sampling below this size (inserts are free until then).
        error_buffer: a number ``e`` (the allowed range is ``min_size_to_sample *
            samples_per_insert +- e``) or an explicit ``(min_diff, max_diff)`` pair.

    Raises:
        ValueError: the allowed range is narrower than ``2 * max(1, samples_per_insert)``, which
            can deadlock (Reverb refuses the same configurations).
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        error_buffer: float | tuple[float, float],
    ) -> None:
        if isinstance(error_buffer, (tuple, list)):
            min_diff, max_diff = (float(x) for x in error_buffer)
        else:
            offset = samples_per_insert * min_size_to_sample
            min_diff, max_diff = offset - float(error_buffer), offset + float(error_buffer)
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert):
            raise InvalidArgument(
                f"error_buffer gives the range [{min_diff}, {max_diff}], narrower than "
                f"2 * max(1, samples_per_insert) = {2 * max(1.0, samples_per_insert)}: it could deadlock"
            )
        super().__init__(samples_per_insert, min_size_to_sample, min_diff, max_diff)
        self._error_buffer = error_buffer

    CONFIG = ("samples_per_insert", "min_size_to_sample")

    def config(self) -> dict:  # noqa: D102
        eb = self._error_buffer
        return {**super().config(), "error_buffer": list(eb) if isinstance(eb, (tuple, list)) else eb}


class Queue(RateLimiter):
    """A queue of at most ``size`` items: each item is sampled once, inserts block when full.

    Use with the ``Fifo`` sampler and ``max_times_sampled=1`` (``Table.queue`` does).
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise InvalidArgument(f"queue size must be >= 1, got {size}")
        super().__init__(1.0, 1, 0.0, float(size))
        self.queue_size = int(size)

    CONFIG = ()

    def config(self) -> dict:  # noqa: D102
        return {**super().config(), "size": self.queue_size}


class Stack(Queue):
    """As :class:`Queue`, for use with the ``Lifo`` sampler (``Table.stack`` does)."""


LIMITERS = {c.__name__: c for c in (RateLimiter, MinSize, SampleToInsertRatio, Queue, Stack)}


def limiter_from_config(config: dict) -> RateLimiter:
    """Rebuild a limiter from :meth:`RateLimiter.config` output."""
    kwargs = dict(config)
    name = kwargs.pop("type")
    try:
        cls = LIMITERS[name]
    except KeyError:
        raise InvalidArgument(f"unknown rate limiter type {name!r}; known: {sorted(LIMITERS)}") from None
    return cls(**kwargs)
