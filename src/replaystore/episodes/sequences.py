"""Sequences: valid starts and the vectorised gather of ``B`` windows of ``W`` steps.

A window of a start step (the *key* step, at stream position ``t0``) covers positions
``t0 - burn_in ... t0 + length - 1`` of its stream. Its slots come from one vectorised ring lookup
(``B x W``), its payload from one ``storage.read`` of ``B * W`` slots reshaped to ``(B, W, ...)``.

- **strict**: every position of the window is a live step of the key step's episode. This never
  crosses an episode end (the next step has another episode id), the write head (positions not
  written yet are not live), a deleted or evicted step, or the ring's wrap-around (see
  :mod:`replaystore.episodes.rings`). Starts are uniform over the valid ones: candidates are drawn
  uniformly from the live steps and kept when valid (rejection sampling is exactly uniform over
  the accepted set); when few candidates pass, the exact set of valid starts is computed (one
  sort of the live steps, cached until the table changes).
- **padded**: every live step is a start (uniform); positions of the window outside the key step's
  run of consecutive live steps of its episode are padded: zeros in ``data``, False in ``mask``.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..errors import EpisodeError, NoValidSequence
from ..samplers.base import Selector
from ..samplers.prioritized import Prioritized
from ..storage.base import Storage
from ..storage.spec import reshape_leaves
from .index import EpisodeIndex
from .samples import SequenceSample
from .sampling import check_batch, start_fields, zero_where

_ROUNDS = 4  # rejection rounds before the exact valid set is computed
# per episode index: the exact valid starts (keyed by its generation and the window) and the last
# acceptance rate per window; weak, so a table's caches go with it
_VALID: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MIN_ACCEPT = 1 / 8  # below this acceptance rate, compute the exact set at once


def window(index: EpisodeIndex, key_slots: np.ndarray, width: int, burn_in: int) -> np.ndarray:
    """``(m, width)`` slots of the windows of ``key_slots`` (``-1`` where a position is not live)."""
    st, t = index.stream_t(key_slots)
    ts = (t - burn_in)[:, None] + np.arange(width)
    return index.lookup(st[:, None], ts)


def valid_window(index: EpisodeIndex, key_slots: np.ndarray, width: int, burn_in: int) -> np.ndarray:
    """:func:`window` of keys whose strict windows are known to be valid (all slots ``>= 0``).

    When every key's stream is gapless, the two live ends imply every position in between, so the
    slots are plain ring entries (no per-position verification).
    """
    st, t = index.stream_t(key_slots)
    if index.gapless(st).all():
        return index.ring_window(st, t - burn_in, width)
    return window(index, key_slots, width, burn_in)


def runs_of(win: np.ndarray, capacity: int) -> bool:
    """Whether every window's slots are consecutive (``first ... first + width - 1``, no wrap)."""
    if len(win) == 0 or win.shape[1] < 2:
        return False
    first = win[:, :1]
    return int(first.max()) + win.shape[1] <= capacity and np.array_equal(win, first + np.arange(win.shape[1]))


def present(index: EpisodeIndex, win: np.ndarray, key_slots: np.ndarray) -> np.ndarray:
    """Which window positions are live steps of the key step's episode."""
    return (win >= 0) & (index.episode_of[win] == index.episode_of[key_slots][:, None])


def strict_valid(index: EpisodeIndex, win: np.ndarray, key_slots: np.ndarray) -> np.ndarray:
    """Which windows are entirely live steps of their key step's episode.

    The episodes of a stream occupy consecutive positions, so a window whose positions are all live
    and whose two ends belong to the key step's episode lies inside that episode.
    """
    ep = index.episode_of[key_slots]
    return (win >= 0).all(axis=1) & (index.episode_of[win[:, 0]] == ep) & (index.episode_of[win[:, -1]] == ep)


def ends_valid(index: EpisodeIndex, key_slots: np.ndarray, width: int, burn_in: int) -> np.ndarray:
    """Which windows have both ends live in the key step's episode.

    A cheap first filter: only a deleted step in between can still make such a window invalid.
    """
    st, t = index.stream_t(key_slots)
    ends = index.lookup(st[:, None], (t - burn_in)[:, None] + np.array([0, width - 1]))
    return strict_valid(index, ends, key_slots)  # (a window of its two ends)


def gapless_ends_valid(
    index: EpisodeIndex, key_slots: np.ndarray, streams: np.ndarray, t_first: np.ndarray, width: int
) -> np.ndarray:
    """:func:`ends_valid` for keys of gapless ``streams`` (see :meth:`EpisodeIndex.gapless`).

    A position of such a stream is a live step exactly when it lies between ``oldest_t`` and the
    newest written one, and its ring entry is that step: no per-entry verification.
    """
    t_last = t_first + (width - 1)
    inside = (t_first >= index.oldest_t[streams]) & (t_last < index.next_t[streams])
    off, mask = index.ring_off[streams], index.ring_len[streams] - 1
    ep = index.episode_of[key_slots]
    ring, episode_of = index.ring, index.episode_of
    # outside entries may be -1 or stale: their episode test is masked by ``inside``
    return inside & (episode_of[ring[off + (t_first & mask)]] == ep) & (episode_of[ring[off + (t_last & mask)]] == ep)


def padded_mask(index: EpisodeIndex, win: np.ndarray, key_slots: np.ndarray, burn_in: int) -> np.ndarray:
    """The positions of each window inside its key step's run of consecutive live episode steps."""
    p = present(index, win, key_slots)
    fwd = np.logical_and.accumulate(p[:, burn_in:], axis=1)
    back = np.logical_and.accumulate(p[:, burn_in::-1], axis=1)[:, ::-1]
    return np.concatenate([back[:, :burn_in], fwd], axis=1)


def exact_valid_starts(index: EpisodeIndex, width: int, burn_in: int) -> np.ndarray:
    """All key slots whose strict window is valid (cached until the index changes)."""
    cache = _VALID.get(index)
    if cache is not None and cache[0] == (index.generation, width, burn_in):
        return cache[1]
    live = index.live.contents().copy()
    live = live[index.attached(live)]
    (st, t), ep = index.stream_t(live), index.episode_of[live]
    order = np.lexsort((t, st))
    st, t, ep, live = st[order], t[order], ep[order], live[order]
    n = len(live)
    breaks = np.ones(n, dtype=bool)
    breaks[1:] = (st[1:] != st[:-1]) | (t[1:] != t[:-1] + 1) | (ep[1:] != ep[:-1])
    run = np.cumsum(breaks) - 1
    run_last = np.append(np.flatnonzero(breaks)[1:], n) - 1
    remaining = run_last[run] - np.arange(n)  # steps after this one in its run
    valid = live[np.flatnonzero(remaining >= width - 1) + burn_in]
    _VALID[index] = ((index.generation, width, burn_in), valid)
    return valid


def uniform_strict_starts(
    index: EpisodeIndex, rng: np.random.Generator, n: int, width: int, burn_in: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """``n`` key slots uniform over the valid strict starts, their windows, and ``1 / #valid``.

    ``#valid`` is exact when the exact set was computed, else estimated from the acceptance rate.
    Raises :class:`NoValidSequence` when no start is valid.
    """
    tracker = index.validity
    if tracker is not None and tracker.width == width and tracker.burn_in == burn_in:
        if tracker.valid.size == 0:
            raise NoValidSequence(_no_valid(index, width))
        keys = tracker.valid.sample(n, rng)
        return keys, valid_window(index, keys, width, burn_in), 1.0 / tracker.valid.size
    live = index.live
    got_keys, got_win = [], []
    have = drawn = 0
    rates = _RATES.setdefault(index, {})  # last acceptance rate per window
    for r in range(_ROUNDS):
        rate = have / drawn if drawn else rates.get((width, burn_in), 0.5)
        m = min(64 * n, int((n - have) / max(rate, _MIN_ACCEPT) * 1.2) + 8)
        cand = live.sample(m, rng)
        st, t_cand = index.stream_t(cand)
        drawn += m
        if index.gapless(st).all():  # both ends live in the episode: every step between is too
            t_first = t_cand - burn_in
            ok = np.flatnonzero(gapless_ends_valid(index, cand, st, t_first, width))
            use = ok[: n - have]
            take = cand[use]
            win = index.ring_window(st[use], t_first[use], width)
            full = np.ones(len(take), dtype=bool)
        else:
            ok = np.flatnonzero(ends_valid(index, cand, width, burn_in))
            take = cand[ok[: n - have]]
            win = window(index, take, width, burn_in)
            full = (win >= 0).all(axis=1)  # a deleted step inside: rejected like any invalid candidate
            if not full.all():
                take, win = take[full], win[full]
        got_keys.append(take)
        got_win.append(win)
        have += len(take)
        if have >= n:
            rate = len(ok) * (full.mean() if len(full) else 1.0) / m if r == 0 else have / drawn
            rates[(width, burn_in)] = rate
            return (np.concatenate(got_keys), np.concatenate(got_win), 1.0 / max(live.size * rate, 1.0))
        if drawn >= 4 * n and have / drawn < _MIN_ACCEPT:
            break
    valid = exact_valid_starts(index, width, burn_in)
    rates[(width, burn_in)] = len(valid) / max(live.size, 1)
    if len(valid) == 0:
        raise NoValidSequence(_no_valid(index, width))
    extra = valid[(rng.random(n - have) * len(valid)).astype(np.int64)]
    got_keys.append(extra)
    got_win.append(valid_window(index, extra, width, burn_in))
    return np.concatenate(got_keys), np.concatenate(got_win), 1.0 / len(valid)


def _no_valid(index: EpisodeIndex, width: int) -> str:
    return (
        f"no stored run of {width} consecutive steps of one episode (strict mode): the window is "
        f"longer than every stored episode, or the steps between are gone; use mode='padded', a "
        f"shorter length, or wait for more data ({index.live.size} live steps)"
    )


def check_request(
    index: EpisodeIndex, sampler: Selector, batch_size: Any, length: Any, burn_in: Any, mode: str
) -> tuple[int, int, int, bool]:
    """``(n, width, burn_in, prioritized)`` of a :meth:`Table.sample_sequences` call (``EpisodeError``)."""
    n = check_batch(batch_size)
    length = check_batch(length, "length")
    burn_in = check_batch(burn_in, "burn_in", least=0)
    if mode not in ("strict", "padded"):
        raise EpisodeError(f"mode must be 'strict' or 'padded', got {mode!r}")
    width = burn_in + length
    prioritized = isinstance(sampler, Prioritized)
    if prioritized:
        cfg = index.options
        if cfg.sequence_length is None:
            raise EpisodeError("prioritized sequences need Episodes(sequence_length=burn_in + length) on the table")
        if (width, burn_in) != (cfg.sequence_length, cfg.burn_in) or mode != "strict":
            raise EpisodeError(
                f"this table samples prioritized strict sequences of sequence_length={cfg.sequence_length} with "
                f"burn_in={cfg.burn_in}; got length={length}, burn_in={burn_in}, mode={mode!r}"
            )
    return n, width, burn_in, prioritized


def draw_sequences(
    index: EpisodeIndex,
    sampler: Selector,
    rng: np.random.Generator,
    storage: Storage,
    meta: np.ndarray,
    key_index: Any,
    n: int,
    width: int,
    burn_in: int,
    mode: str,
    prioritized: bool,
) -> tuple[SequenceSample, np.ndarray]:
    """Draw ``n`` windows (see the module doc) and gather them: ``(sample, start slots)``.

    Changes nothing (``meta``, ``key_index``, ``times_sampled``: see
    :func:`~replaystore.episodes.sampling.start_fields`; ``key_index`` also gives ``keys_of(slots)``
    and ``run_keys(first, width)``, the keys of runs of consecutive slots). Raises as
    :meth:`Table.sample_sequences` (NoValidSequence).
    """
    weights = None
    if prioritized:
        keys, probabilities, weights = sampler.sample(n)
        win = window(index, keys, width, burn_in)
        if not strict_valid(index, win, keys).all():  # every priority of a valid start is 0
            keys, win, p = uniform_strict_starts(index, rng, n, width, burn_in)
            probabilities, weights = np.full(n, p), None
        mask, full = np.ones(win.shape, dtype=bool), True
    elif mode == "strict":
        keys, win, p = uniform_strict_starts(index, rng, n, width, burn_in)
        probabilities = np.full(n, p)
        mask, full = np.ones(win.shape, dtype=bool), True
    else:
        keys = index.live.sample(n, rng)
        att = index.attached(keys)
        for _ in range(8):  # detached steps (rare, see EpisodeIndex) cannot start a sequence
            if att.all():
                break
            redo = np.flatnonzero(~att)
            keys[redo] = index.live.sample(len(redo), rng)
            att = index.attached(keys)
        if not att.all():
            raise NoValidSequence("no live step is reachable through its stream (all detached)")
        probabilities = np.full(n, 1.0 / index.live.size)
        win = window(index, keys, width, burn_in)
        mask = padded_mask(index, win, keys, burn_in)
        full = bool(mask.all())
    slots = win if full else np.where(mask, win, keys[:, None])
    if full and hasattr(storage, "read_runs") and runs_of(slots, min(len(meta), storage.capacity)):
        # steps written in order to a FIFO table sit in consecutive slots: block copies
        data = storage.read_runs(slots[:, 0], slots.shape[1])
        step_keys = key_index.run_keys(slots[:, 0], slots.shape[1])
    else:
        data = reshape_leaves(storage.read(slots.ravel()), slots.shape)
        step_keys = key_index.keys_of(slots)
    if not full:
        zero_where(data, mask)
    fields, keys = start_fields(index, meta, key_index, keys, probabilities, weights)
    if not full:
        step_keys[~mask] = -1
    return SequenceSample(data=data, mask=mask, step_keys=step_keys, burn_in=burn_in, **fields), keys
