"""Per-agent priorities on a table that keeps one priority per environment step.

With ``priorities="agents"`` each alive agent ``i`` of step ``s`` has a priority ``p_si``; the
table's sampler (``Prioritized(alpha=1)``) holds the step's mass ``m_s = sum_i p_si ** alpha``, and
the agent is then drawn within the step with probability ``p_si ** alpha / m_s``. The pair's
probability is ``m_s / sum_s m_s * p_si ** alpha / m_s = p_si ** alpha / sum_{s,i} p_si ** alpha``:
exactly proportional prioritized replay over (step, agent) pairs. The per-agent values live in the
row (``agent_priority``, NaN for absent agents): written with the step, rewritten by every update
(``Table.update_fields``, then the step's mass with ``update_priorities``), so a checkpoint, the
write-ahead log and a new :class:`~replaystore.multiagent.MultiAgentTable` keep them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidPriority


def check_priorities(values: Any, n: int) -> np.ndarray:
    """float64 ``(n,)`` priorities (a scalar broadcasts).

    Raises:
        InvalidPriority: NaN, infinite or negative values, or the wrong length.
    """
    try:
        p = np.broadcast_to(np.asarray(values, np.float64), (n,)).copy()
    except (TypeError, ValueError) as e:
        raise InvalidPriority(f"priorities must be {n} finite numbers >= 0, got {values!r}") from e
    if not np.isfinite(p).all() or (p < 0).any():
        raise InvalidPriority("priorities must be finite and >= 0")
    return p


def step_mass(p: np.ndarray, alpha: float) -> np.ndarray:
    """``sum_i p_i ** alpha`` over the alive agents (NaN: absent) of each row of ``p`` ``(B, A)``."""
    alive = ~np.isnan(p)
    return np.where(alive, np.power(np.where(alive, p, 1.0), alpha), 0.0).sum(axis=-1)


def agent_shares(p: np.ndarray, alpha: float) -> np.ndarray:
    """Each alive agent's share of its step's mass, ``(B, A)``; uniform over the alive agents of a massless step."""
    alive = ~np.isnan(p)
    w = np.where(alive, np.power(np.where(alive, p, 1.0), alpha), 0.0)
    total = w.sum(axis=-1, keepdims=True)
    uniform = alive / np.maximum(alive.sum(axis=-1, keepdims=True), 1)
    return np.where(total > 0, w / np.where(total > 0, total, 1.0), uniform)


class AgentPriorities:
    """The per-agent priorities of the steps this object last sampled (what an update starts from).

    The row's ``agent_priority`` column is the truth (rewritten by ``Table.update_fields`` on every
    update, so it survives checkpoints, the write-ahead log and a new ``MultiAgentTable``); this
    keeps the rows of the last sample, so a per-agent update of a step just sampled needs no read.
    Not thread-safe: the owner calls it under its lock.
    """

    def __init__(self) -> None:
        self._recent: dict[int, np.ndarray] = {}

    def current(self, keys: np.ndarray, written: np.ndarray) -> np.ndarray:
        """Note the per-agent priorities ``(B, A)`` of sampled steps (the rows' values); return them."""
        p = np.array(written, np.float64, copy=True)
        self._recent = dict(zip(keys.tolist(), p))
        return p

    def update(
        self,
        keys: np.ndarray,
        agents: np.ndarray | None,
        values: np.ndarray,
        fetch: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """New per-agent rows for the updated steps; nothing is kept until :meth:`commit`.

        ``agents`` None: every alive agent of the step gets the value (a joint update). Duplicate
        (key, agent) pairs: the last wins. ``fetch(keys) -> (rows (k, A), found)`` reads the
        rows of steps not in the last sample.

        Returns:
            ``(unique keys, rows (U, A), found (U,))``.
        """
        uk, inv = np.unique(keys, return_inverse=True)
        known = [self._recent.get(k) for k in uk.tolist()]
        missing = np.array([r is None for r in known], bool)
        fetched, found = (None, np.zeros(0, bool))
        if missing.any():
            fetched, found = fetch(uk[missing])
        width = next((len(r) for r in known if r is not None), None)
        if width is None:
            width = fetched.shape[1] if fetched is not None and len(fetched) else 0
        rows = np.full((len(uk), width), np.nan)
        have = ~missing
        for j, r in enumerate(known):
            if r is not None:
                rows[j] = r
        if missing.any():
            mi = np.flatnonzero(missing)[np.asarray(found, bool)]
            rows[mi] = fetched
            have[mi] = True
        if agents is None:
            last = np.zeros(len(uk), np.float64)
            last[inv] = values  # fancy assignment: the last occurrence wins
            rows = np.where(np.isnan(rows), np.nan, last[:, None])
        else:
            alive_before = ~np.isnan(rows)
            rows[inv, agents] = values
            rows = np.where(alive_before, rows, np.nan)  # an update of an agent absent from the step is ignored
        return uk, rows, have

    def commit(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Note ``rows`` as the steps' per-agent priorities (after the table stored them)."""
        for k, r in zip(keys.tolist(), rows):
            if k in self._recent:
                self._recent[k] = r
