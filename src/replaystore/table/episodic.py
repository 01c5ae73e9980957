"""The Table's episode methods: writers and readers of steps, sequences, n-step, whole episodes.

A mixin of :class:`~replaystore.table.Table` around the planners of :mod:`replaystore.episodes`
(the split of the work: :mod:`replaystore.episodes.writers`, :mod:`replaystore.episodes.sampling`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..episodes import EpisodeBatch, EpisodeIndex, EpisodeInfo, Episodes, NStepSample, SequenceSample
from ..episodes import info as _info
from ..episodes import nstep as _nstep
from ..episodes import sequences as _sequences
from ..episodes import whole as _whole
from ..episodes import writers as _writers
from ..episodes.index import StepPlan
from ..episodes.validity import StartValidity
from ..errors import EpisodeError
from ..placement import unplaced
from ..samplers import Prioritized, Selector, Uniform
from ..storage import ObjectStorage, Storage
from .args import as_keys


def make_episode_index(
    episodes: Episodes,
    storage: Storage,
    sampler: Selector,
    capacity: int,
    rng: np.random.Generator,
    priorities: Callable[[], np.ndarray],
) -> EpisodeIndex:
    """The episode index of a new table built with ``episodes=`` (bound to its capacity and rng).

    ``priorities``: returns the table's per-slot priority column (read when starts are scored).
    Never placed (:func:`~replaystore.placement.unplaced`): a shared table keeps one per process.
    """
    if not isinstance(episodes, Episodes):
        raise EpisodeError(f"episodes must be an rs.Episodes, got {type(episodes).__name__}")
    if isinstance(storage, ObjectStorage):
        raise EpisodeError(
            "episode structure needs a column storage (columns, memmap or frames): sequences "
            "are gathered as (B, T, ...) arrays, which Python objects cannot be"
        )
    shared = sampler.live_set if type(sampler) is Uniform else None
    with unplaced():
        index = EpisodeIndex(episodes, shared)
        index.bind(capacity, rng)
        if episodes.sequence_length is not None:
            prioritized = sampler if isinstance(sampler, Prioritized) else None
            index.validity = StartValidity(index, episodes.sequence_length, episodes.burn_in, prioritized, priorities)
    return index


class EpisodeMethods:
    """``add_step`` ... ``episode_keys`` (see the module doc)."""

    @property
    def episodic(self) -> bool:
        """Whether the table was built with ``episodes=`` (steps know their stream and episode)."""
        return self._episodes is not None

    @property
    def episodes(self) -> Episodes | None:
        """The table's :class:`~replaystore.Episodes` configuration (``None`` without ``episodes=``)."""
        return None if self._episodes is None else self._episodes.options

    def _require_episodes(self) -> EpisodeIndex:
        if self._episodes is None:
            raise EpisodeError(f"table {self.name!r} has no episode structure: build it with episodes=rs.Episodes()")
        return self._episodes

    def _insert_steps(
        self,
        index: EpisodeIndex,
        prepared: Any,
        n: int,
        plan: StepPlan,
        priorities: Any,
        version: Any,
        timeout: float | None,
        admitted: bool = False,
    ) -> np.ndarray:
        """Insert rows through the general path with ``plan`` begun in the index (lock held).

        ``admitted``: a replayed write (``replay_insert``), which the rate limiter does not hold.
        """
        index.begin(plan)
        try:
            keys = self._insert(prepared, n, priorities, version, timeout, admitted=admitted)
            index.finish(plan)  # only does something when every row was refused as stale
        finally:
            index.end()
        return keys

    def add_step(
        self,
        step: Any,
        stream: int = 0,
        terminated: bool = False,
        truncated: bool = False,
        priority: float | None = None,
        version: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Append one step to ``stream``'s current episode; return its key (-1 if refused as stale).

        A step after a terminated or truncated step of the same stream starts a new episode.
        Otherwise as :meth:`add` (priority, version, rate limiter, eviction).

        Raises:
            EpisodeError: a bad stream id or flag; the table has no ``episodes=``. SpecError,
            InvalidPriority, Timeout, Closed: as for :meth:`extend`. Nothing changes on error.
        """
        index = self._require_episodes()
        with self._cond:
            self._check_open()
            prepared, n = self.storage.prepare(step, batched=False)
            plan = _writers.step_plan(index, stream, terminated, truncated)
            return int(self._insert_steps(index, prepared, n, plan, priority, version, timeout)[0])

    def extend_steps(
        self,
        steps: Any,
        streams: Any = 0,
        terminated: Any = None,
        truncated: Any = None,
        priorities: Any = None,
        version: Any = None,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Append a batch of steps, one stream id per row (an int: all rows of one stream).

        One row per environment of a vectorised env; rows of the same stream in one call are
        consecutive steps in row order. ``terminated``/``truncated``: ``None``, a bool, or ``(n,)``
        bools, marking the last step of an episode. Returns int64 keys (-1: refused as stale).

        Raises:
            EpisodeError: stream ids of the wrong type or shape, or outside the allowed range;
                flags of the wrong shape. Otherwise as :meth:`extend`. Nothing changes on error.
        """
        index = self._require_episodes()
        with self._cond:
            self._check_open()
            prepared, n = self.storage.prepare(steps, batched=True)
            if n == 0:
                return np.empty(0, dtype=np.int64)
            plan = _writers.steps_plan(index, n, streams, terminated, truncated)
            return self._insert_steps(index, prepared, n, plan, priorities, version, timeout)

    def add_episode(
        self,
        steps: Any,
        stream: int | None = None,
        terminated: bool = True,
        truncated: bool = False,
        priorities: Any = None,
        version: Any = None,
        timeout: float | None = None,
    ) -> np.ndarray:
        """Insert a whole episode (a batch of ``T`` steps) as a new episode of ``stream``.

        ``stream=None`` uses a stream id larger than any used so far. The last step gets the
        ``terminated``/``truncated`` flags (both False: the episode stays open for more steps).

        Raises:
            EpisodeError: an empty episode; ``stream`` still has an open episode; as
                :meth:`extend_steps`. Nothing changes on error.
        """
        index = self._require_episodes()
        with self._cond:
            self._check_open()
            prepared, n = self.storage.prepare(steps, batched=True)
            plan = _writers.episode_plan(index, n, stream, terminated, truncated)
            return self._insert_steps(index, prepared, n, plan, priorities, version, timeout)

    def end_episode(self, streams: Any, truncated: bool = False) -> int:
        """Close the open episode of each of ``streams`` without a new step; return how many closed.

        The episode's last step (if still live) gets the ``terminated`` flag, or ``truncated``.
        Streams whose episode is already closed are skipped.

        Raises:
            UnknownStream: a stream that never wrote a step.
            EpisodeError: bad ids.
        """
        index = self._require_episodes()
        with self._flushed(check_open=True):
            return _writers.end_episodes(index, streams, truncated)

    def sample_sequences(
        self, batch_size: int, length: int, burn_in: int = 0, mode: str = "strict", timeout: float | None = None
    ) -> SequenceSample:
        """Draw ``batch_size`` windows of ``burn_in + length`` consecutive steps of one episode.

        ``mode="strict"``: windows never cross an episode end, the write head, a deleted or evicted
        step; starts are uniform over valid windows (or, with a ``Prioritized`` sampler and
        ``Episodes(sequence_length=burn_in + length, burn_in=burn_in)``, in proportion to the
        priorities of the valid starts). ``mode="padded"``: every live step is a start; positions
        outside its episode run are zero and ``mask`` is False there. The rate limiter counts one
        sample per sequence; ``times_sampled`` and ``max_times_sampled`` count per start step.

        Raises:
            NoValidSequence: strict mode and no stored run is long enough (the table is unchanged).
            EpisodeError: bad arguments.
            Timeout, Closed: as for :meth:`sample`.
        """
        index = self._require_episodes()
        n, width, burn_in, prioritized = _sequences.check_request(
            index, self.sampler, batch_size, length, burn_in, mode
        )
        with self._cond:
            self._wait_for_sample(n, timeout)
            sample, starts = _sequences.draw_sequences(
                index,
                self.sampler,
                self.rng,
                self.storage,
                self._meta,
                self._index,
                n,
                width,
                burn_in,
                mode,
                prioritized,
            )
            self._account_sample(starts, n, sample.times_sampled)
        return sample

    def sample_nstep(self, batch_size: int, n: int, gamma: float, timeout: float | None = None) -> NStepSample:
        """Draw ``batch_size`` start steps with the sampler and compute their n-step transitions.

        See :mod:`replaystore.episodes.nstep` for where a transition stops and what it bootstraps
        from. Counts one sample per transition (rate limiter, ``times_sampled`` of the start).

        Raises:
            EpisodeError: ``n < 1``, ``gamma`` outside (0, 1], a missing reward/observation field.
            NoValidSequence: no sampled step could start a transition. Timeout, Closed.
        """
        index = self._require_episodes()
        b, n, gamma = _nstep.check_request(index, self.storage, batch_size, n, gamma)
        with self._cond:
            self._wait_for_sample(b, timeout)
            sample, starts = _nstep.draw_nstep(index, self.sampler, self.storage, self._meta, self._index, b, n, gamma)
            self._account_sample(starts, b, sample.times_sampled)
        return sample

    def sample_episodes(self, k: int, timeout: float | None = None, replace: bool = True) -> EpisodeBatch:
        """Draw ``k`` complete episodes uniformly (closed, with every step live).

        Returns an :class:`~replaystore.episodes.EpisodeBatch`. Open episodes are never returned.
        Counts one sample per episode; ``times_sampled`` of every returned step is incremented.

        Raises:
            NoValidSequence: no complete episode (or fewer than ``k`` with ``replace=False``).
        """
        index = self._require_episodes()
        k = _whole.check_request(k, replace)
        with self._cond:
            self._wait_for_sample(k, timeout)
            steps, batch = _whole.draw_episodes(index, self.storage, self._index.keys_of, self.rng, k, replace)
            self._account_sample(steps, k)
        return batch

    def episode_info(self, keys: Any) -> EpisodeInfo:
        """Where each key's step sits: stream, episode, positions, episode length, closed/complete, end flags.

        Returns an :class:`~replaystore.episodes.info.EpisodeInfo` of arrays aligned with ``keys``
        (keys not live: see there). Changes nothing (no sample is counted). Thread-safe.

        Raises:
            EpisodeError: the table has no ``episodes=``.
            InvalidArgument: keys that are not integers.
        """
        index = self._require_episodes()
        keys = as_keys(keys)
        with self._flushed():
            return _info.info_of_slots(index, self._index.lookup(keys))

    def episode_keys(self, keys: Any, positions: Any) -> np.ndarray:
        """The key of the step at episode position ``positions[i]`` of the episode of ``keys[i]``.

        ``positions``: a scalar or one int per key (0 is the episode's first step). Returns int64
        keys, ``-1`` where that step is not live (evicted, deleted, not written yet, beyond the
        episode's end, a negative position) or the key itself is not live. Changes nothing.

        Raises:
            EpisodeError: no ``episodes=``; positions that are not integers or of the wrong shape.
            InvalidArgument: keys that are not integers.
        """
        index = self._require_episodes()
        keys = as_keys(keys)
        want = _info.check_positions(positions, len(keys))
        with self._flushed():
            return _info.keys_at(index, self._index.keys_of, self._index.lookup(keys), want)
