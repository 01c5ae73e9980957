"""What multi-agent samples return: one agent per row (independent) or all agents (joint)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class AgentBatch:
    """``B`` draws of one (step, agent) pair each: the *independent* mode (parameter sharing).

    Attributes:
        data: per-agent fields of the drawn agent, ``(B, ...)`` (``(B, T, ...)`` for sequences),
            and the global fields of the step(s), ``(B, ...)`` / ``(B, T, ...)``.
        agents: int64 ``(B,)`` the drawn agent's position on the agent axis;
            ``agent_ids[i]`` is its id.
        agent_ids: the table's agent ids (the agent axis).
        mask: bool, ``(B,)`` (all True) for transitions, ``(B, T)`` for sequences: False where the
            agent did not act (dead, not joined yet) or the position is padding.
        keys: int64 ``(B,)`` the key of the step the pair belongs to (a sequence's start after the
            burn-in); pass them with ``agents`` to ``update_priorities``.
        probabilities: float64 ``(B,)`` the exact probability of drawing this (step, agent) pair:
            the step's probability times the agent's share of it.
        weights: float64 ``(B,)`` importance weights ``(P / min P) ** -beta`` (1 for the least
            likely draw of the batch).
        step_probabilities: float64 ``(B,)`` the step's probability alone.
        returns, discount, done, steps, next_obs: n-step transitions only (``None`` otherwise): see
            :meth:`MultiAgentTable.sample_nstep`.
        step_keys: sequences only: int64 ``(B, T)`` every position's step key (``-1`` padded).
        burn_in: sequences only: leading burn-in positions.
    """

    data: dict[str, Any]
    agents: np.ndarray
    agent_ids: tuple
    mask: np.ndarray
    keys: np.ndarray
    probabilities: np.ndarray
    weights: np.ndarray
    step_probabilities: np.ndarray
    returns: np.ndarray | None = None
    discount: np.ndarray | None = None
    done: np.ndarray | None = None
    steps: np.ndarray | None = None
    next_obs: Any = None
    step_keys: np.ndarray | None = None
    burn_in: int = 0

    def __len__(self) -> int:
        return int(self.keys.shape[0])


@dataclass(frozen=True)
class JointBatch:
    """``B`` environment steps (or sequences of them) with every agent: the *synchronized* mode.

    Attributes:
        data: per-agent fields ``(B, A, ...)`` (``(B, T, A, ...)`` for sequences), zero where an
            agent was absent; global fields ``(B, ...)`` / ``(B, T, ...)``; ``alive`` included.
        mask: bool ``(B, A)`` / ``(B, T, A)``: the agent acted at that step (and, for sequences, the
            position is not padding). What VDN/QMIX multiply their per-agent terms by.
        agent_ids: the table's agent ids.
        keys: int64 ``(B,)`` step keys (a sequence's start after the burn-in): joint priorities.
        probabilities, weights, priorities: float64 ``(B,)`` as the table's sampler gives them.
        returns, discount, done, steps: n-step only, ``(B, A)``; ``next_obs`` ``(B, A, ...)``.
        step_keys: sequences only, ``(B, T)``. burn_in: sequences only.
    """

    data: dict[str, Any]
    mask: np.ndarray
    agent_ids: tuple
    keys: np.ndarray
    probabilities: np.ndarray
    weights: np.ndarray
    priorities: np.ndarray
    returns: np.ndarray | None = None
    discount: np.ndarray | None = None
    done: np.ndarray | None = None
    steps: np.ndarray | None = None
    next_obs: Any = None
    step_keys: np.ndarray | None = None
    burn_in: int = 0

    def __len__(self) -> int:
        return int(self.keys.shape[0])
