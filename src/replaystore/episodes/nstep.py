"""n-step transitions computed at sample time.

Start steps come from the table's sampler (uniform, prioritized, ...). For a start at stream
position ``t`` the next ``n`` positions are looked up in one vectorised expression; the transition
uses ``k <= n`` steps and stops

- at **termination** (a step flagged ``terminated``): ``done``, ``discount = 0``, no bootstrap;
- at **truncation** (a step flagged ``truncated``): bootstrap from the last observation;
- at the **newest step** of an unfinished episode, or before a deleted/evicted step.

The bootstrap observation depends on ``Episodes.next_obs_field``:

- configured: step ``j``'s next observation is its ``next_obs_field``. Every live step is a start
  (``k >= 1``); the transition ends at the first of: ``n`` steps, an end flag, the last stored
  step of the run; it bootstraps from that last step's ``next_obs_field``.
- ``None``: step ``j``'s next observation is the ``obs_field`` of step ``j + 1`` of the same
  episode. A truncated episode therefore needs its final observation stored as a last step (flagged
  ``truncated``; its reward and action are not used); a terminated one does not. A step with no
  stored successor and no termination (the newest step of an open episode, the final-observation
  step of a truncated one) cannot start a transition; such draws are redrawn from the sampler.

``returns = sum_{i<k} gamma**i r_{t+i}`` (float64), ``discount = gamma**k`` (0 where ``done``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import EpisodeError, NoValidSequence
from .index import TERMINATED, TRUNCATED, EpisodeIndex
from .samples import NStepSample
from .sampling import account, check_batch, read_field, wait_for_sample

if TYPE_CHECKING:
    from ..table import Table

_REDRAWS = 16


def plan_nstep(index: EpisodeIndex, starts: np.ndarray, n: int, has_next_obs: bool
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(win, k, done, boot)`` of start slots.

    ``win`` is the ``(B, n + 1)`` window of slots, ``k`` the number of steps (0 where the start
    cannot make a transition), and ``boot`` the slot whose observation (or next observation) is
    the bootstrap.
    """
    b = len(starts)
    win = index.lookup(index.stream_of[starts][:, None], index.t_of[starts][:, None] + np.arange(n + 1))
    # consecutive live steps from t. No episode test is needed: inside a stream, the step before an
    # episode boundary carries an end flag (or is missing), and the transition stops there anyway.
    run = np.logical_and.accumulate(win >= 0, axis=1)
    m = run.sum(axis=1)  # >= 1: the start itself
    fl = index.flags[win] * run
    term = (fl & TERMINATED) != 0
    ends = (fl & (TERMINATED | TRUNCATED)) != 0
    ends_n = ends[:, :n]
    has_end = ends_n.any(axis=1)
    e = np.where(has_end, ends_n.argmax(axis=1), n)  # first end within the first n steps
    rows = np.arange(b)
    term_at_e = has_end & term[rows, np.minimum(e, n - 1)]
    if has_next_obs:
        k = np.minimum(np.minimum(m, n), e + 1)
        done = term[rows, k - 1]
        boot = win[rows, k - 1]
    else:
        k = np.where(term_at_e, e + 1, np.minimum(np.minimum(m - 1, n), e))
        done = term_at_e & (k == e + 1)
        boot = win[rows, np.where(done, k - 1, k)]
    return win, k, done, boot


def sample_nstep(table: "Table", batch_size: Any, n: Any, gamma: Any, timeout: float | None) -> NStepSample:
    """See :meth:`Table.sample_nstep`."""
    index = table._require_episodes()
    b = check_batch(batch_size)
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise EpisodeError(f"n must be an int >= 1, got {n!r}")
    n = int(n)
    try:
        gamma = float(gamma)
    except (TypeError, ValueError):
        raise EpisodeError(f"gamma must be a number in (0, 1], got {gamma!r}") from None
    if not 0.0 < gamma <= 1.0:
        raise EpisodeError(f"gamma must be in (0, 1], got {gamma}")
    cfg = index.options
    has_next = cfg.next_obs_field is not None
    spec = getattr(table.storage, "spec", None)
    if spec is not None:
        for f in (cfg.reward_field, cfg.next_obs_field if has_next else cfg.obs_field):
            if f not in spec:
                raise EpisodeError(f"n-step needs the field {f!r}; the table has {sorted(spec)}")
        if spec[cfg.reward_field].shape != ():
            raise EpisodeError(f"the reward field {cfg.reward_field!r} must be a scalar per step, "
                               f"got shape {spec[cfg.reward_field].shape}")
    with table._cond:
        if table._stager is not None and table._stager.n:
            table._flush_pending()
        wait_for_sample(table, b, timeout)
        slots, probabilities, weights = table.sampler.sample(b)
        win, k, done, boot = plan_nstep(index, slots, n, has_next)
        for _ in range(_REDRAWS):
            bad = np.flatnonzero(k == 0)
            if len(bad) == 0:
                break
            s2, p2, w2 = table.sampler.sample(len(bad))
            slots[bad] = s2
            probabilities = np.asarray(probabilities, dtype=np.float64).copy()
            probabilities[bad] = p2
            if weights is not None:
                weights = np.asarray(weights).copy()
                weights[bad] = w2 if w2 is not None else 1.0
            win2, k2, d2, b2 = plan_nstep(index, s2, n, has_next)
            win[bad], k[bad], done[bad], boot[bad] = win2, k2, d2, b2
        if (k == 0).any():
            raise NoValidSequence(
                "n-step: the sampled steps have no stored successor (the newest step of an open episode "
                "or a truncated episode's final observation); store next observations "
                "(Episodes(next_obs_field=...)) or add more steps"
            )
        j = np.arange(n)
        used = j[None, :] < k[:, None]
        reward_slots = np.where(used, win[:, :n], slots[:, None])
        r = read_field(table, reward_slots.ravel(), cfg.reward_field).reshape(b, n).astype(np.float64)
        returns = (np.where(used, r, 0.0) * gamma ** j).sum(axis=1)
        discount = np.where(done, 0.0, gamma ** k.astype(np.float64))
        next_obs = read_field(table, boot, cfg.next_obs_field if has_next else cfg.obs_field)
        data = table.storage.read(slots)
        rows = table._meta.take(slots, axis=0)
        streams = index.stream_of[slots].copy()
        episodes = index.episode_of[slots].copy()
        times = account(table, slots, b)
    return NStepSample(
        data=data,
        returns=returns,
        next_obs=next_obs,
        steps=k.astype(np.int64),
        done=done,
        discount=discount,
        keys=rows[:, 0],
        probabilities=np.asarray(probabilities, dtype=np.float64),
        weights=np.ones(b) if weights is None else np.asarray(weights, dtype=np.float64),
        priorities=rows.view(np.float64)[:, 3],
        times_sampled=times,
        versions=rows[:, 2],
        streams=streams,
        episodes=episodes,
    )
