"""Per-agent n-step returns over the rows of one environment's episode.

Each agent's transition stops where *that agent* stops: its own termination (no bootstrap), its
own truncation (bootstrap), a step it did not act in, the end of the stored episode (the newest
step, a missing or evicted step). The rows after a start are found through the table's public
``episode_info`` / ``episode_keys`` / ``get`` calls, so this works on every object offering them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import MultiAgentError
from .layout import ALIVE


def check_nstep(n: Any, gamma: Any, table: Any = None) -> tuple[int, float]:
    """Validate ``n`` and ``gamma`` (and, for ``n > 1``, that ``table`` can find the rows after a step).

    Raises:
        MultiAgentError: ``n`` not an integer ``>= 1``, ``gamma`` outside ``(0, 1]``, or ``n > 1``
            on a table without ``episode_info``/``episode_keys``.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise MultiAgentError(f"n must be an integer >= 1, got {n!r}")
    try:
        g = float(gamma)
    except (TypeError, ValueError) as e:
        raise MultiAgentError(f"gamma must be a number in (0, 1], got {gamma!r}") from e
    if not 0.0 < g <= 1.0:
        raise MultiAgentError(f"gamma must be in (0, 1], got {gamma!r}")
    if n > 1 and table is not None and not (hasattr(table, "episode_info") and hasattr(table, "episode_keys")):
        raise MultiAgentError(
            f"n > 1 needs the table's episode_info/episode_keys calls; {type(table).__name__} has none"
        )
    return int(n), g


def later_rows(table: Any, keys: np.ndarray, n: int, fields: tuple[str, ...]) -> tuple[dict, np.ndarray]:
    """The ``n - 1`` rows after each start key in its episode: ``({field: (n-1, B, ...)}, present)``.

    ``present`` (bool ``(n-1, B)``) is False where the row is not stored (beyond the episode's
    newest step, evicted, deleted); those rows are zeros.

    Raises:
        MultiAgentError: the table offers no ``episode_info`` / ``episode_keys`` (n > 1 needs them).
    """
    b = len(keys)
    if not (hasattr(table, "episode_info") and hasattr(table, "episode_keys")):
        raise MultiAgentError(
            f"n > 1 needs the table's episode_info/episode_keys calls; {type(table).__name__} has none"
        )
    info = table.episode_info(keys)
    offsets = np.arange(1, n, dtype=np.int64)[:, None]
    positions = np.asarray(info.positions, np.int64)[None, :] + offsets
    nk = np.array(table.episode_keys(np.tile(keys, n - 1), positions.ravel()), np.int64).reshape(n - 1, b)
    nk[:, ~np.asarray(info.found, bool)] = -1
    want = nk >= 0
    rows, found = table.get(nk[want]) if want.any() else (None, np.zeros(0, bool))
    present = np.zeros((n - 1, b), bool)
    present[want] = np.asarray(found, bool)
    out = {}
    for f in fields:
        col = None if rows is None else np.asarray(rows[f])
        if col is None:
            raise MultiAgentError(f"field {f!r} is missing from the table's rows")
        arr = np.zeros((n - 1, b, *col.shape[1:]), col.dtype)
        arr[present] = col
        out[f] = arr
    return out, present


def nstep(
    first: dict[str, np.ndarray],
    later: dict[str, np.ndarray] | None,
    present: np.ndarray | None,
    gamma: float,
    names: tuple[str, str, str, str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """n-step transitions of columns ``(B, C)`` (C agents per row) from their start rows and the rows after.

    ``first[f]`` is ``(B, C, ...)``, ``later[f]`` ``(n-1, B, C, ...)``. ``names`` are the reward,
    next observation, terminated and truncated fields. Returns ``(returns, steps, done,
    next_obs)``: float64 ``(B, C)``, int64 ``(B, C)``, bool ``(B, C)``, ``(B, C, ...)``.
    """
    rew, nxt, term, trunc = names
    alive = first[ALIVE].astype(bool)
    returns = np.where(alive, first[rew].astype(np.float64).reshape(alive.shape), 0.0)
    done = alive & first[term].astype(bool).reshape(alive.shape)
    steps = alive.astype(np.int64)  # 0 for an agent absent from the start step (joint samples)
    next_obs = first[nxt].copy()
    active = alive & ~done & ~first[trunc].astype(bool).reshape(alive.shape)
    if later is not None:
        g = 1.0
        for j in range(present.shape[0]):
            g *= gamma
            ok = active & present[j][:, None] & later[ALIVE][j].astype(bool)
            returns += np.where(ok, g * later[rew][j].astype(np.float64).reshape(ok.shape), 0.0)
            steps += ok
            t = ok & later[term][j].astype(bool).reshape(ok.shape)
            done |= t
            sel = ok.reshape(ok.shape + (1,) * (next_obs.ndim - ok.ndim))
            next_obs = np.where(sel, later[nxt][j], next_obs)
            active = ok & ~t & ~later[trunc][j].astype(bool).reshape(ok.shape)
    return returns, steps, done, next_obs
