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
The window of slots is found the cheapest way that is exact: :func:`plan_nstep`.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ..errors import EpisodeError, NoValidSequence
from ..samplers.base import Selector
from ..storage.base import Storage
from .index import _T_MASK, TERMINATED, UID_SHIFT, EpisodeIndex
from .samples import NStepSample
from .sampling import check_batch, read_field, start_fields

_REDRAWS = 16
#: an n-step plan of start slots: ``(win, k, done, boot)`` (see :func:`plan_nstep`)
NStepPlan = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def plan_nstep(index: EpisodeIndex, starts: np.ndarray, n: int, has_next_obs: bool) -> NStepPlan:
    """``(win, k, done, boot)`` of start slots.

    ``win`` is the ``(B, n)`` window of slots of positions ``t ... t + n - 1`` (a transposed
    view; only the first ``k`` of a row are meaningful, the others may be ``-1`` or any slot),
    ``k`` the number of steps (0 where the start cannot make a transition), ``done`` whether the
    episode terminated within them, and ``boot`` the slot whose next observation (or observation)
    is the bootstrap.

    Three ways to the same result, cheapest first: :func:`plan_runs`, :func:`plan_gapless` and
    :func:`plan_checked`. Not thread-safe: the table calls it under its lock.
    """
    return plan_runs(index, starts, n, has_next_obs)


def plan_ring(index: EpisodeIndex, starts: np.ndarray, n: int, has_next_obs: bool) -> NStepPlan:
    """:func:`plan_gapless` where it applies, else :func:`plan_checked`."""
    plan = plan_gapless(index, starts, n, has_next_obs)
    return plan if plan is not None else plan_checked(index, starts, n, has_next_obs)


def plan_runs(index: EpisodeIndex, starts: np.ndarray, n: int, has_next_obs: bool) -> NStepPlan:
    """:func:`plan_nstep` for starts whose next steps sit at a fixed slot stride; :func:`plan_ring` for the others.

    Steps of one stream written in order to a FIFO table sit ``d`` slots apart, where ``d`` is the
    number of streams written per call (1 for a single stream, ``E`` for one row per environment
    of a vectorised env; the last slot is followed by the first). Slot ``a + j * d`` holds step
    ``t + j`` of the start's stream exactly when its id is the start's id plus ``j`` (ids are
    ``stream << 40 | t``), which is the test :meth:`EpisodeIndex.lookup` makes of a ring entry,
    on memory near the start's own id: no ring access. Only starts of gapless streams
    (:meth:`EpisodeIndex.gapless`) take this path: a gapless stream's live steps are all
    reachable through its ring, so the result is exactly :func:`plan_checked`'s. Rows that fail
    the test (the write head within the window, irregular writes, holes) are planned by
    :func:`plan_ring`. The stride is learnt from the rows that fail (a hint: it only decides
    which rows take this path).
    """
    w = n if has_next_obs else n + 1
    b = len(starts)
    hint = index.__dict__.setdefault("_nstep_stride", [1, 0])  # [stride, calls to skip this path]
    if b == 0 or hint[1]:
        hint[1] = max(0, hint[1] - 1)
        return plan_ring(index, starts, n, has_next_obs)
    cap = len(index.uid)
    ar = _arange(w)[:, None]
    d = hint[0]
    win = starts + (ar if d == 1 else ar * d)  # (w, B)
    if int(starts.max()) + (w - 1) * d >= cap:  # the slot after the last is the first (FIFO wraps around)
        win %= cap
    u = index.uid[win]
    u0 = u[0]
    ok = (u == u0 + ar).all(axis=0)
    if not index.all_gapless():  # only a gapless stream's live steps are surely reachable (attached)
        st = u0 >> UID_SHIFT
        ok &= index.gapless(st) & ((u0 & _T_MASK) >= index.oldest_t[st])
    n_ok = int(np.count_nonzero(ok))
    if 2 * n_ok < b:
        _learn_stride(index, starts[~ok][:8], u0[~ok][:8], hint)
    if n_ok == 0:
        return plan_ring(index, starts, n, has_next_obs)
    k, done, boot = _ends(index, win, n, has_next_obs)
    if n_ok < b:
        bad = np.flatnonzero(~ok)
        w2, k2, d2, b2 = plan_ring(index, starts[bad], n, has_next_obs)
        win[:n, bad], k[bad], done[bad], boot[bad] = w2.T, k2, d2, b2
    return win[:n].T, k, done, boot


def _learn_stride(index: EpisodeIndex, starts: np.ndarray, uid: np.ndarray, hint: list) -> None:
    """Set ``hint[0]`` to the commonest slot distance from ``starts`` to their streams' next steps.

    When that is the stride already tried, the writes are not regular: skip :func:`plan_runs` for
    the next 64 calls.
    """
    nxt = index.lookup(uid >> UID_SHIFT, (uid & _T_MASK) + 1)
    dist = (nxt - starts)[nxt >= 0] % len(index.uid)
    if len(dist) == 0:
        return
    values, counts = np.unique(dist, return_counts=True)
    stride = int(values[counts.argmax()])
    if stride == hint[0] or stride == 0:
        hint[1] = 64
    else:
        hint[0] = stride


def plan_checked(index: EpisodeIndex, starts: np.ndarray, n: int, has_next_obs: bool) -> NStepPlan:
    """:func:`plan_nstep` for any stream: every position is verified through the ring."""
    w = n if has_next_obs else n + 1
    # (w, B): position-major, so the per-position work runs along the batch (NumPy's fast axis)
    st, t = index.stream_t(starts)
    win = index.lookup(st, t + _arange(w)[:, None])
    # consecutive live steps from t. No episode test is needed: inside a stream, the step before an
    # episode boundary carries an end flag (or is missing), and the transition stops there anyway.
    m = np.logical_and.accumulate(win >= 0, axis=0).sum(axis=0)  # 0 for a detached start
    return (win[:n].T, *_ends(index, win, n, has_next_obs, m))


def plan_gapless(index: EpisodeIndex, starts: np.ndarray, n: int, has_next_obs: bool) -> NStepPlan | None:
    """:func:`plan_nstep` when every start's stream is gapless (see :meth:`EpisodeIndex.gapless`), else ``None``.

    In a gapless stream the live, ring-reachable positions are exactly ``oldest_t ... next_t - 1``:
    a start at ``t >= oldest_t`` has the ``next_t - t`` live steps ``t, t + 1, ...`` ahead, read
    from its stream's ring without verifying any entry. The same result as :func:`plan_checked`.
    """
    if len(starts) == 0:
        return None
    st, t = index.stream_t(starts)
    nt = index.next_t[st]
    if not index.all_gapless():
        ot = index.oldest_t[st]
        if not ((index.n_live[st] == nt - ot).all() and (t >= ot).all()):  # a gap, or a detached start
            return None
    w = n if has_next_obs else n + 1
    ln = index.ring_len[st]
    ar = _arange(w)[:, None]
    win = index.ring[index.ring_off[st] + ((t + ar) & (ln - 1))]  # (w, B)
    ahead = nt - t  # live steps from t on (>= 1); None: every position of every window is one
    m = np.minimum(ahead, w) if int(ahead.min()) < w else None  # (entries past the write head are stale)
    return (win[:n].T, *_ends(index, win, n, has_next_obs, m))


def _ends(
    index: EpisodeIndex, win: np.ndarray, n: int, has_next_obs: bool, m: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(k, done, bootstrap slot)`` of ``(w, B)`` windows whose first ``m`` positions are live steps (default: all).

    The transition's last step ``x`` is the first of: an end flag (within the first ``n``), the
    last live step, step ``n - 1`` (with next observations) or ``n`` (without: step ``x`` is then
    only the bootstrap observation, so its own flags do not end the transition, unless the episode
    terminated at ``x``).
    """
    fl = index.flags[win]
    cut = fl != 0
    if has_next_obs:
        cut[n - 1] = True
    else:
        cut[n] = True
        fl[n] = 0
    if m is not None:
        cut |= _arange(len(win))[:, None] >= m - 1  # (row m - 1 is the last live step)
    x = cut.argmax(axis=0)
    cols = _arange(win.shape[1])
    done = (fl[x, cols] & TERMINATED) != 0
    k = x + 1 if has_next_obs else x + done
    if m is not None:  # a detached start (checked path only)
        k[m == 0], done[m == 0] = 0, False
    return k, done, win[x, cols]


@functools.lru_cache(maxsize=256)
def _arange(n: int) -> np.ndarray:
    """``np.arange(n)``, cached (read-only)."""
    return _frozen(np.arange(n))


@functools.lru_cache(maxsize=256)
def _powers(gamma: float, n: int) -> np.ndarray:
    """``gamma ** [0, 1, ..., n]`` (float64, cached, read-only)."""
    return _frozen(gamma ** np.arange(n + 1, dtype=np.float64))


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _returns(
    storage: Storage, field: str, win: np.ndarray, k: np.ndarray, slots: np.ndarray, powers: np.ndarray
) -> np.ndarray:
    """``sum_{j<k} gamma**j r_{t+j}`` (float64) from the ``(n, B)`` window ``win`` (``powers``: of gamma)."""
    n = len(win)
    used = _arange(n)[:, None] < k
    columns = getattr(storage, "columns", None)
    if columns and field in columns:  # rows past k may name -1 or any slot: masked by the sum
        r = columns[field].take(win)
    else:
        r = read_field(storage, np.where(used, win, slots).ravel(), field).reshape(win.shape)
    return (r * powers[:n, None]).sum(axis=0, where=used)


def check_request(index: EpisodeIndex, storage: Storage, batch_size: Any, n: Any, gamma: Any) -> tuple[int, int, float]:
    """``(batch_size, n, gamma)`` of a :meth:`Table.sample_nstep` call, checked (``EpisodeError``)."""
    b = check_batch(batch_size)
    n = check_batch(n, "n")
    try:
        gamma = float(gamma)
    except (TypeError, ValueError):
        raise EpisodeError(f"gamma must be a number in (0, 1], got {gamma!r}") from None
    if not 0.0 < gamma <= 1.0:
        raise EpisodeError(f"gamma must be in (0, 1], got {gamma}")
    cfg = index.options
    has_next = cfg.next_obs_field is not None
    spec = getattr(storage, "spec", None)
    if spec is not None:
        for f in (cfg.reward_field, cfg.next_obs_field if has_next else cfg.obs_field):
            if f not in spec:
                raise EpisodeError(f"n-step needs the field {f!r}; the table has {sorted(spec)}")
        if spec[cfg.reward_field].shape != ():
            raise EpisodeError(
                f"the reward field {cfg.reward_field!r} must be a scalar per step, "
                f"got shape {spec[cfg.reward_field].shape}"
            )
    return b, n, gamma


def draw_nstep(
    index: EpisodeIndex,
    sampler: Selector,
    storage: Storage,
    meta: np.ndarray,
    key_index: Any,
    b: int,
    n: int,
    gamma: float,
) -> tuple[NStepSample, np.ndarray]:
    """Draw ``b`` start steps with ``sampler`` and compute their transitions: ``(sample, start slots)``.

    Changes nothing but the sampler's own draw state (``meta``, ``key_index``, ``times_sampled``:
    see :func:`~replaystore.episodes.sampling.start_fields`). Raises as :meth:`Table.sample_nstep`
    (NoValidSequence, after redraws).
    """
    cfg = index.options
    has_next = cfg.next_obs_field is not None
    slots, probabilities, weights = sampler.sample(b)
    win, k, done, boot = plan_nstep(index, slots, n, has_next)
    for _ in range(_REDRAWS if not k.all() else 0):  # k = 0: no next observations, or a detached start
        bad = np.flatnonzero(k == 0)
        if len(bad) == 0:
            break
        s2, p2, w2 = sampler.sample(len(bad))
        slots[bad] = s2
        probabilities = np.asarray(probabilities, dtype=np.float64).copy()
        probabilities[bad] = p2
        if weights is not None:
            weights = np.asarray(weights).copy()
            weights[bad] = w2 if w2 is not None else 1.0
        win2, k2, d2, b2 = plan_nstep(index, s2, n, has_next)
        win[bad], k[bad], done[bad], boot[bad] = win2, k2, d2, b2
    if not k.all():
        raise NoValidSequence(
            "n-step: the sampled steps have no stored successor (the newest step of an open episode "
            "or a truncated episode's final observation); store next observations "
            "(Episodes(next_obs_field=...)) or add more steps"
        )
    powers = _powers(gamma, n)
    returns = _returns(storage, cfg.reward_field, win.T, k, slots, powers)
    discount = powers[k]
    discount[done] = 0.0
    next_obs = read_field(storage, boot, cfg.next_obs_field if has_next else cfg.obs_field)
    data = storage.read(slots)
    fields, slots = start_fields(index, meta, key_index, slots, probabilities, weights)
    steps = k.astype(np.int64, copy=False)
    return NStepSample(
        data=data, returns=returns, next_obs=next_obs, steps=steps, done=done, discount=discount, **fields
    ), slots
