"""What the episode readers return: sequences, n-step transitions, whole episodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class _StartFields:
    """The fields of the start steps every episode sample has (their order: the subclasses' first)."""

    keys: np.ndarray
    probabilities: np.ndarray
    weights: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray
    versions: np.ndarray
    streams: np.ndarray
    episodes: np.ndarray

    def __len__(self) -> int:
        return int(self.keys.shape[0])


@dataclass(frozen=True, kw_only=True)
class SequenceSample(_StartFields):
    """``B`` sequences of ``burn_in + length`` consecutive steps of one episode each.

    Attributes:
        data: (nested) dict of arrays shaped ``(B, burn_in + length, ...)``; padded positions hold
            zeros.
        mask: bool ``(B, burn_in + length)``, False on padded positions (all True in strict mode).
        keys: int64 ``(B,)`` key of each sequence's start step (its first step after the burn-in):
            pass them to ``update_priorities`` (prioritized sequences) or ``delete``.
        step_keys: int64 ``(B, burn_in + length)`` the key of every step, ``-1`` where padded.
        streams, episodes: int64 ``(B,)`` stream and episode id of each sequence.
        probabilities, weights, priorities, times_sampled, versions: of the start steps, as in
            :class:`~replaystore.Sample` (``weights``: ones unless the sampler is prioritized).
        burn_in: the number of leading burn-in positions.
    """

    data: Any
    mask: np.ndarray
    step_keys: np.ndarray
    burn_in: int = 0


@dataclass(frozen=True, kw_only=True)
class NStepSample(_StartFields):
    """``B`` n-step transitions computed at sample time.

    Attributes:
        data: the start steps' fields, ``(B, ...)`` (as ``Table.sample`` returns them).
        returns: float64 ``(B,)`` ``sum_{i<k} gamma**i * r_{t+i}``.
        next_obs: ``(B, ...)`` the bootstrap observation ``k`` steps ahead (undefined content
            where ``done``: the last step's next observation, or its observation).
        steps: int64 ``(B,)`` ``k``, ``1 <= k <= n``.
        done: bool ``(B,)`` True iff the episode terminated within the ``k`` steps.
        discount: float64 ``(B,)`` ``gamma**k``, ``0.0`` where ``done``: the target is
            ``returns + discount * V(next_obs)``.
        keys, probabilities, weights, priorities, times_sampled, versions: of the start steps, as
            in :class:`~replaystore.Sample`.
        streams, episodes: int64 ``(B,)``.
    """

    data: Any
    returns: np.ndarray
    next_obs: Any
    steps: np.ndarray
    done: np.ndarray
    discount: np.ndarray


class EpisodeBatch(list):
    """A list of complete episodes (each a dict of ``(T_i, ...)`` arrays) with per-episode metadata.

    Attributes:
        keys: list of int64 ``(T_i,)`` arrays, the keys of each episode's steps.
        episodes, streams: int64 ``(k,)`` ids.
        terminated, truncated: bool ``(k,)``: how each episode ended.
        lengths: int64 ``(k,)``.
    """

    keys: list
    episodes: np.ndarray
    streams: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    lengths: np.ndarray
