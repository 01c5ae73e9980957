"""Where steps sit in their episodes, by key: :meth:`Table.episode_info` and :meth:`Table.episode_keys`.

A reader for the layers built on top of an episodic table (hindsight relabelling, whole-episode
buffers): what it returns is :class:`EpisodeInfo`'s and the two calls' docstrings.

How the length of a closed episode is found: its end is the step flagged ``terminated`` or
``truncated``. From the queried step the stream's positions are scanned forward (vectorised over the
queried episodes, in blocks of 32, 128, ... positions) until a live step of the same episode carrying an end flag
(the length is known), a live step of another episode or the stream's write position (the end step
is gone, deleted or refused as stale: the length is unknown, ``-1``). Positions without a live step
are skipped. The open episode of a stream needs no scan: its length so far is the stream's next
position in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import EpisodeError
from .index import ENDS, TERMINATED, TRUNCATED, EpisodeIndex


@dataclass(frozen=True)
class EpisodeInfo:
    """Episode position of each queried key; every array has one entry per key, in query order.

    Entries of keys that are not live (never inserted, evicted, deleted) hold ``-1`` (integers) or
    ``False`` (flags), and ``found`` is False there.

    Attributes:
        found: bool, the key is a live step of the table.
        streams: int64 stream id.
        episodes: int64 table-wide episode id.
        stream_positions: int64 position ``t`` of the step in its stream (0, 1, 2, ... forever).
        positions: int64 position of the step in its episode (0 for the first step).
        lengths: int64 steps of the episode: written so far for an open episode, the full length
            for a closed one; ``-1`` when the episode is closed but its end step is no longer live
            (deleted, refused as stale), so its length cannot be known, and for *detached* steps
            (kept alive by a non-FIFO remover further behind their stream than its ring reaches).
        closed: bool, the episode has ended (its last step was flagged ``terminated`` or
            ``truncated``, or ``end_episode`` closed it); False for the open episode of a stream.
        complete: bool, closed and every step from its first to its last is live: the episodes
            :meth:`Table.sample_episodes` draws from.
        terminated, truncated: bool, how the episode ended (False while open or when its end step
            is gone; ``terminated`` wins if both flags were given).
        is_last: bool, this step carries the episode's end flag.
    """

    found: np.ndarray
    streams: np.ndarray
    episodes: np.ndarray
    stream_positions: np.ndarray
    positions: np.ndarray
    lengths: np.ndarray
    closed: np.ndarray
    complete: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    is_last: np.ndarray

    def __len__(self) -> int:
        return len(self.found)


def _end_steps(
    index: EpisodeIndex, streams: np.ndarray, ts: np.ndarray, episodes: np.ndarray, gapless: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Stream position and end flags of the end step of each (closed) episode, scanning forward from ``ts``.

    ``-1`` (flags 0) where the end step is not live. Vectorised over the episodes; blocks grow in
    width. ``gapless``: every stream is gapless (:meth:`EpisodeIndex.gapless`), so its ring entries
    are exact up to its newest position and are read without verification.
    """
    m = len(streams)
    end = np.full(m, -1, dtype=np.int64)
    end_flags = np.zeros(m, dtype=np.uint8)
    todo = np.arange(m)
    cursor = ts.copy()
    width = 32  # most episodes end within a block or two (per-call NumPy overhead dominates small blocks)
    while len(todo):
        s, c = streams[todo], cursor[todo]
        pos = c[:, None] + np.arange(width)
        inside = pos < index.next_t[s][:, None]
        slots = index.ring_window(s, c, width) if gapless else index.lookup(s[:, None], pos)
        live = inside & (slots >= 0)
        fl = index.flags[slots] & ENDS  # (a slot -1 reads the last one: masked by live)
        # the scan stops at the first flagged step, the write head, or a step of another episode
        flagged = live & (fl != 0)
        cut = ~inside | flagged
        if not gapless:  # (a gapless stream has no step of another episode before this one's end)
            other = live & (index.episode_of[slots] != episodes[todo][:, None])
            flagged &= ~other
            cut |= other
        x = cut.argmax(1)
        r = np.arange(len(todo))
        rows = np.flatnonzero(flagged[r, x])
        end[todo[rows]] = c[rows] + x[rows]
        end_flags[todo[rows]] = fl[rows, x[rows]]
        go_on = ~cut[r, x]
        cursor[todo[go_on]] = c[go_on] + width
        todo = todo[go_on]
        width = min(width * 4, 1 << 16)
    return end, end_flags


def _by_episode(rows: np.ndarray, ep: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``rows`` grouped by episode: ``(rows in group order, the latest step of each group, group of each)``."""
    order = rows[np.lexsort((-t[rows], ep[rows]))]
    first = np.ones(len(order), bool)
    first[1:] = ep[order][1:] != ep[order][:-1]
    return order, order[first], np.cumsum(first) - 1


def _all_live(
    index: EpisodeIndex, streams: np.ndarray, first: np.ndarray, lengths: np.ndarray, episodes: np.ndarray
) -> np.ndarray:
    """Whether every position ``first .. first + length - 1`` of each stream is a live step of the episode."""
    ok = np.ones(len(streams), dtype=bool)
    gapless = index.gapless(streams)
    # a gapless stream holds a live step at every position from its oldest to its newest
    g = np.flatnonzero(gapless)
    if len(g):
        sg = streams[g]
        ok[g] = (first[g] >= index.oldest_t[sg]) & (first[g] + lengths[g] <= index.next_t[sg])
    rest = np.flatnonzero(~gapless)
    if len(rest):
        ln = lengths[rest]
        owner = np.repeat(np.arange(len(rest)), ln)
        offs = np.arange(int(ln.sum())) - np.repeat(np.cumsum(ln) - ln, ln)
        slots = index.lookup(streams[rest][owner], first[rest][owner] + offs)
        good = slots >= 0
        good[good] = index.episode_of[slots[good]] == episodes[rest][owner[good]]
        bad = np.zeros(len(rest), dtype=bool)
        np.logical_or.at(bad, owner[~good], True)
        ok[rest] = ~bad
    return ok


def info_of_slots(index: EpisodeIndex, slots: np.ndarray) -> EpisodeInfo:
    """The :class:`EpisodeInfo` of the steps in ``slots`` (``-1``: not live). Changes nothing."""
    found = slots >= 0
    s = slots[found]
    st, t = index.stream_t(s)
    ep, p = index.episode_of[s].astype(np.int64), index.pos_of[s].astype(np.int64)
    attached = index.attached(s)
    is_open = index.cur_ep[st] == ep
    ln = np.full(len(s), -1, np.int64)
    ln[is_open & attached] = index.cur_pos[st[is_open & attached]]
    end_fl = np.zeros(len(s), np.uint8)
    complete = np.zeros(len(s), bool)
    # one forward scan per distinct closed episode, from its latest queried step
    scan = np.flatnonzero(~is_open & attached)
    if len(scan):
        order, heads, group = _by_episode(scan, ep, t)
        hs, ht, he = st[heads], t[heads], ep[heads]
        end_t = np.full(len(heads), -1, np.int64)
        end_flags = np.zeros(len(heads), np.uint8)
        gap_free = index.gapless(hs)
        for rows, gapless in ((np.flatnonzero(gap_free), True), (np.flatnonzero(~gap_free), False)):
            if len(rows):
                end_t[rows], end_flags[rows] = _end_steps(index, hs[rows], ht[rows], he[rows], gapless)
        start_t = ht - p[heads]
        known = end_t >= 0
        ep_len = np.where(known, end_t - start_t + 1, -1)
        ok = np.zeros(len(heads), bool)
        ok[known] = _all_live(index, hs[known], start_t[known], ep_len[known], he[known])
        ln[order], end_fl[order], complete[order] = ep_len[group], end_flags[group], ok[group]
    terminated = (end_fl & TERMINATED) != 0
    truncated = ((end_fl & TRUNCATED) != 0) & ~terminated

    def spread(values: np.ndarray) -> np.ndarray:  # one entry per key: -1 (False) where not found
        out = np.full(len(slots), False if values.dtype == bool else -1, dtype=values.dtype)
        out[found] = values
        return out

    rows = (st, ep, t, p, ln, ~is_open, complete, terminated, truncated, (index.flags[s] & ENDS) != 0)
    return EpisodeInfo(found, *map(spread, rows))


def check_positions(positions: Any, n: int) -> np.ndarray:
    """``positions`` of :meth:`Table.episode_keys` as ``n`` int64 values (``EpisodeError`` otherwise)."""
    try:
        want = np.asarray(positions)
    except (TypeError, ValueError) as e:
        raise EpisodeError(f"positions must be integers, got {type(positions).__name__} ({e})") from None
    if want.dtype.kind not in "iu" or want.ndim > 1:
        raise EpisodeError(
            f"positions must be integers (a scalar or one per key), got {want.dtype} of shape {want.shape}"
        )
    want = np.broadcast_to(want.astype(np.int64), (n,)) if want.ndim == 0 else want.astype(np.int64)
    if want.shape != (n,):
        raise EpisodeError(f"positions must be a scalar or one per key: {want.shape} for ({n},) keys")
    return want


def keys_at(index: EpisodeIndex, keys_of: Any, slots: np.ndarray, want: np.ndarray) -> np.ndarray:
    """The key of the step at episode position ``want[i]`` of the episode of the step in ``slots[i]``.

    ``slots``: ``-1`` for keys that are not live; ``keys_of(slots)``: the table's key of each slot.
    Returns ``-1`` where that step is not live. Changes nothing.
    """
    out = np.full(len(slots), -1, np.int64)
    found = slots >= 0
    found[found] = index.attached(slots[found])
    s = slots[found]
    if len(s) == 0:
        return out
    st, t = index.stream_t(s)
    target = t - index.pos_of[s] + want[found]
    inside = (want[found] >= 0) & (target < index.next_t[st])
    got = np.full(len(s), -1, np.int64)
    got[inside] = index.lookup(st[inside], target[inside])
    ok = got >= 0
    ok[ok] = index.episode_of[got[ok]] == index.episode_of[s][ok]
    out[np.flatnonzero(found)[ok]] = keys_of(got[ok])
    return out
