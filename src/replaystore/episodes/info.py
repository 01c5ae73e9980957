"""Where steps sit in their episodes, by key: :meth:`Table.episode_info` and :meth:`Table.episode_keys`.

A reader for the layers built on top of an episodic table (hindsight relabelling, whole-episode
buffers) that need, for a step they hold the key of, its stream, its episode, its position in
that episode, the episode's length and whether the episode is closed and complete, and the keys of
other steps of the same episode. Nothing here changes the table; both calls take its lock.

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


def _end_positions(index: EpisodeIndex, streams: np.ndarray, ts: np.ndarray, episodes: np.ndarray) -> np.ndarray:
    """Stream position of the end step of each (closed) episode, scanning forward from ``ts``.

    ``-1`` where the end step is not live. Vectorised over the episodes; blocks double in width.
    """
    m = len(streams)
    end = np.full(m, -1, dtype=np.int64)
    todo = np.arange(m)
    cursor = ts.copy()
    width = 32  # most episodes end within a block or two (per-call NumPy overhead dominates small blocks)
    while len(todo):
        s, e, c = streams[todo], episodes[todo], cursor[todo]
        pos = c[:, None] + np.arange(width)
        inside = pos < index.next_t[s][:, None]
        slots = index.lookup(s[:, None], np.where(inside, pos, 0))
        slots = np.where(inside, slots, -1)
        live = slots >= 0
        safe = np.where(live, slots, 0)
        mine = live & (index.episode_of[safe] == e[:, None])
        other = live & ~mine
        flagged = mine & ((index.flags[safe] & ENDS) != 0)
        first_flag = np.where(flagged.any(1), flagged.argmax(1), width)
        first_stop = np.minimum(
            np.where(other.any(1), other.argmax(1), width), np.where((~inside).any(1), (~inside).argmax(1), width)
        )
        found = first_flag < first_stop
        end[todo[found]] = c[found] + first_flag[found]
        go_on = ~found & (first_stop == width)
        cursor[todo[go_on]] = c[go_on] + width
        todo = todo[go_on]
        width = min(width * 4, 1 << 16)
    return end


def _by_episode(rows: np.ndarray, ep: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``rows`` grouped by episode: ``(rows in group order, the latest step of each group, group of each)``."""
    order = rows[np.lexsort((-t[rows], ep[rows]))]
    first = np.ones(len(order), bool)
    first[1:] = ep[order][1:] != ep[order][:-1]
    return order, order[first], np.cumsum(first) - 1


def _gapless_ends(index: EpisodeIndex, streams: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Position and flags of the first flagged step at or after ``ts`` (gapless streams only); ``-1``: none."""
    m = len(streams)
    end = np.full(m, -1, dtype=np.int64)
    end_flags = np.zeros(m, dtype=np.uint8)
    todo = np.arange(m)
    cursor = ts.copy()
    limit = index.next_t[streams]
    width = 32
    while len(todo):
        c = cursor[todo]
        # a gapless stream's ring entries are exact for every position up to its newest
        slots = index.ring_window(streams[todo], c, width)
        fl = np.where(c[:, None] + np.arange(width) < limit[todo][:, None], index.flags[slots] & ENDS, 0)
        flagged = fl != 0
        hit = flagged.any(1)
        at = flagged.argmax(1)  # the first flagged position (argmax of fl would prefer TRUNCATED = 2)
        rows = np.flatnonzero(hit)
        end[todo[rows]] = c[rows] + at[rows]
        end_flags[todo[rows]] = fl[rows, at[rows]]
        go_on = ~hit & (c + width < limit[todo])
        cursor[todo[go_on]] = c[go_on] + width
        todo = todo[go_on]
        width = min(width * 4, 1 << 16)
    return end, end_flags


def _all_live(
    index: EpisodeIndex, streams: np.ndarray, first: np.ndarray, lengths: np.ndarray, episodes: np.ndarray
) -> np.ndarray:
    """Whether every position ``first .. first + length - 1`` of each stream is a live step of the episode."""
    ok = np.ones(len(streams), dtype=bool)
    if len(streams) == 0:
        return ok
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
    n = len(slots)
    found = slots >= 0
    s = slots[found]
    streams = np.full(n, -1, np.int64)
    episodes = np.full(n, -1, np.int64)
    ts = np.full(n, -1, np.int64)
    pos = np.full(n, -1, np.int64)
    lengths = np.full(n, -1, np.int64)
    closed = np.zeros(n, bool)
    complete = np.zeros(n, bool)
    terminated = np.zeros(n, bool)
    truncated = np.zeros(n, bool)
    is_last = np.zeros(n, bool)
    if len(s) == 0:
        return EpisodeInfo(found, streams, episodes, ts, pos, lengths, closed, complete, terminated, truncated, is_last)
    st, t = index.stream_t(s)
    ep, p = index.episode_of[s].astype(np.int64), index.pos_of[s].astype(np.int64)
    fl = index.flags[s]
    streams[found], episodes[found], ts[found], pos[found] = st, ep, t, p
    is_last[found] = (fl & ENDS) != 0
    attached = index.attached(s)
    is_open = index.cur_ep[st] == ep
    closed[found] = ~is_open
    ln = np.full(len(s), -1, np.int64)
    ln[is_open & attached] = index.cur_pos[st[is_open & attached]]
    end_fl = np.zeros(len(s), np.uint8)
    closed_rows = np.flatnonzero(~is_open & attached)
    gap_free = index.gapless(st[closed_rows])
    complete_rows = np.zeros(len(s), bool)
    # gapless streams: every position up to the stream's newest is live, so the first flagged
    # step at or after the queried one is its episode's end, and the start's liveness is one test
    g = closed_rows[gap_free]
    if len(g):
        g, heads, group = _by_episode(g, ep, t)
        end_t, end_flags = _gapless_ends(index, st[heads], t[heads])
        start_t = t[heads] - p[heads]
        ln[g] = np.where(end_t >= 0, end_t - start_t + 1, -1)[group]
        end_fl[g] = end_flags[group]
        complete_rows[g] = ((end_t >= 0) & (start_t >= index.oldest_t[st[heads]]))[group]
    # other streams: one forward scan per distinct episode, from its latest queried step
    scan = closed_rows[~gap_free]
    if len(scan):
        order, heads, group = _by_episode(scan, ep, t)
        end_t = _end_positions(index, st[heads], t[heads], ep[heads])
        start_t = t[heads] - p[heads]
        ep_len = np.where(end_t >= 0, end_t - start_t + 1, -1)
        ln[order] = ep_len[group]
        known = end_t >= 0
        ok = np.zeros(len(heads), bool)
        if known.any():
            kk = np.flatnonzero(known)
            end_slots = index.lookup(st[heads][kk], end_t[kk])
            end_fl_heads = np.zeros(len(heads), np.uint8)
            end_fl_heads[kk] = index.flags[end_slots] & ENDS
            end_fl[order] = end_fl_heads[group]
            ok[kk] = _all_live(index, st[heads][kk], start_t[kk], ep_len[kk], ep[heads][kk])
        complete_rows[order] = ok[group]
    complete[found] = complete_rows
    lengths[found] = ln
    terminated[found] = (end_fl & TERMINATED) != 0
    truncated[found] = ((end_fl & TRUNCATED) != 0) & ~terminated[found]
    return EpisodeInfo(found, streams, episodes, ts, pos, lengths, closed, complete, terminated, truncated, is_last)


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


def keys_at(index: EpisodeIndex, key_of_slot: np.ndarray, slots: np.ndarray, want: np.ndarray) -> np.ndarray:
    """The key of the step at episode position ``want[i]`` of the episode of the step in ``slots[i]``.

    ``slots``: ``-1`` for keys that are not live; ``key_of_slot``: the table's key of each slot.
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
    res = np.full(len(s), -1, np.int64)
    res[ok] = key_of_slot[got[ok]]
    out[found] = res
    return out
