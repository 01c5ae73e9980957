"""Whole episodes: complete, closed episodes sampled as units.

An episode is *complete* when it is closed (its last step is flagged ``terminated`` or
``truncated``, by the writer or by ``end_episode``) and every one of its steps, from its first, is
still live and reachable. Open episodes (still being written) and episodes that lost a step
(eviction, delete, staleness, ``max_times_sampled``) are never returned.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..errors import EpisodeError, NoValidSequence
from ..storage.base import Storage
from .index import TERMINATED, TRUNCATED, EpisodeIndex
from .samples import EpisodeBatch
from .sampling import check_batch

# per episode index: its complete episodes, keyed by its generation (weak: they go with the table)
_COMPLETE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def complete_episodes(index: EpisodeIndex) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(episode_ids, bounds, slots)`` of the complete episodes.

    ``slots`` are their steps in order, concatenated: episode ``i`` is
    ``slots[bounds[i]:bounds[i + 1]]``. Cached until the index changes.
    """
    cache = _COMPLETE.get(index)
    if cache is not None and cache[0] == index.generation:
        return cache[1]
    live = index.live.contents().copy()
    live = live[index.attached(live)]
    ep, pos = index.episode_of[live], index.pos_of[live]
    order = np.lexsort((pos, ep))
    live, ep, pos = live[order], ep[order], pos[order]
    n = len(live)
    if n == 0:
        out = (np.empty(0, np.int64), np.zeros(1, np.int64), np.empty(0, np.int64))
        _COMPLETE[index] = (index.generation, out)
        return out
    first = np.ones(n, dtype=bool)
    first[1:] = ep[1:] != ep[:-1]
    starts = np.flatnonzero(first)
    stops = np.append(starts[1:], n)
    last = stops - 1
    ok = (
        (pos[starts] == 0)
        & (pos[last] == stops - starts - 1)
        & ((index.flags[live[last]] & (TERMINATED | TRUNCATED)) != 0)
    )
    keep = np.flatnonzero(ok)
    lengths = (stops - starts)[keep]
    take = np.repeat(starts[keep], lengths) + (
        np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    )
    out = (ep[starts[keep]], np.append(0, np.cumsum(lengths)), live[take])
    _COMPLETE[index] = (index.generation, out)
    return out


def check_request(k: Any, replace: Any) -> int:
    """``k`` of :meth:`Table.sample_episodes` as an int (``EpisodeError`` for bad arguments)."""
    k = check_batch(k, "k")
    if not isinstance(replace, (bool, np.bool_)):
        raise EpisodeError(f"replace must be a bool, got {replace!r}")
    return k


def draw_episodes(
    index: EpisodeIndex, storage: Storage, keys_of: Any, rng: np.random.Generator, k: int, replace: bool
) -> tuple[np.ndarray, EpisodeBatch]:
    """Draw ``k`` complete episodes uniformly: ``(slots of every returned step, the batch)``.

    ``keys_of(slots)``: the table's keys in those slots. Changes nothing (the caller counts the
    sample over the returned slots). Raises as :meth:`Table.sample_episodes`.
    """
    ids, bounds, slots = complete_episodes(index)
    if len(ids) == 0:
        raise NoValidSequence(
            "no complete episode is stored (open episodes and episodes that lost a step are never returned)"
        )
    if not replace and k > len(ids):
        raise NoValidSequence(f"asked for {k} distinct episodes, {len(ids)} complete ones are stored")
    pick = rng.choice(len(ids), size=k, replace=False) if not replace else (rng.random(k) * len(ids)).astype(np.int64)
    lengths = (bounds[1:] - bounds[:-1])[pick]
    flat = np.concatenate([slots[bounds[i] : bounds[i + 1]] for i in pick.tolist()])
    data = storage.read(flat)
    ends = np.cumsum(lengths)
    fl = index.flags[flat[ends - 1]]
    out = EpisodeBatch(_take(data, part) for part in np.split(np.arange(len(flat)), ends[:-1]))
    out.keys = np.split(keys_of(flat), ends[:-1])
    out.episodes = ids[pick].astype(np.int64)
    out.streams = index.streams(flat[ends - 1])
    out.terminated = (fl & TERMINATED) != 0
    out.truncated = ((fl & TRUNCATED) != 0) & ~out.terminated
    out.lengths = lengths.astype(np.int64)
    return flat, out


def _take(data: Any, rows: np.ndarray) -> Any:
    if isinstance(data, dict):
        return {k: _take(v, rows) for k, v in data.items()}
    return data[rows[0] : rows[-1] + 1]
