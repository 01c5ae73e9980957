"""Checks that a saved episode index is one consistent history (checkpoints are untrusted input).

A checkpoint stores the arrays of :meth:`~replaystore.episodes.EpisodeIndex.export_rows` (per step,
key order; ``t = -1``: a step detached by a version before issue 24) and
:meth:`~replaystore.episodes.EpisodeIndex.export_streams`. Checksums prove the files are those that
were written, not that they describe a history a table could have had: :func:`check_index_arrays`
checks that, so that a loaded table never samples a sequence across an episode end, an n-step
return past a termination or a window of positions out of order.

What every history satisfies (each checked, each a :class:`~replaystore.errors.CheckpointError`
naming it):

- ranges: known streams below the stream limit, ``0 <= t < next_t`` of the step's stream,
  ``0 <= episode < next_episode``, ``pos >= 0``, flags in ``0..3``;
- key order is write order: along the keys, each stream's positions strictly increase (no two
  steps share a position, none are swapped);
- an episode is one run of its stream's positions: all its steps are in one stream and share the
  start position ``t - pos >= 0``;
- episodes tile their stream in id order: along a stream, episode ids do not decrease, a later
  episode starts after the last step of the one before, and an end flag sits exactly on the step
  before the next episode's start (a stored step there must carry one; episodes in between may
  have left entirely);
- the open episode of a stream (``cur_ep``) is its newest, holds no end flag, starts at
  ``next_t - cur_pos`` and is the open episode of no other stream; a stream whose newest written
  step is stored with no open episode has that step flagged; ``cur_pos`` is ``0`` exactly when
  no episode is open.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CheckpointError
from .config import MAX_STREAMS_LIMIT

_T_LIMIT = (1 << 40) - 1  # a stream's positions stay below this (the per-slot id's bits)
_ROWS = ("stream", "t", "episode", "pos", "flags")


def _first(bad: np.ndarray) -> int:
    """The index of the first True of ``bad`` (-1: none)."""
    return int(bad.argmax()) if bad.any() else -1


def _ints(streams: dict, name: str) -> np.ndarray:
    value = streams.get(name) if isinstance(streams, dict) else None
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise CheckpointError(f"manifest field episodes.streams.{name} must be a list of integers")
    if any(abs(v) >= 1 << 62 for v in value):
        raise CheckpointError(f"manifest field episodes.streams.{name} holds an integer out of range")
    return np.asarray(value, dtype=np.int64).reshape(-1)


def check_index_arrays(
    rows: dict[str, np.ndarray], streams: dict[str, Any], stream_limit: int = MAX_STREAMS_LIMIT, where: str = ""
) -> None:
    """Raise :class:`CheckpointError` unless ``rows`` and ``streams`` are one consistent history.

    ``rows``: the per-step arrays of :meth:`EpisodeIndex.export_rows` in key order (1-D, equal
    lengths, of the checkpoint's dtypes); ``streams``: :meth:`EpisodeIndex.export_streams` (from
    JSON). ``where`` prefixes the message (the checkpoint's path). Returns ``None``; changes
    nothing; O(n log n) for ``n`` steps. The invariants are listed in the module doc.
    """
    try:
        _check(rows, streams, stream_limit)
    except CheckpointError as e:
        raise CheckpointError(f"{where}: {e}" if where else str(e)) from None


def _check(rows: dict[str, np.ndarray], streams: dict[str, Any], stream_limit: int) -> None:
    if not isinstance(streams, dict):
        raise CheckpointError("manifest field episodes.streams must be an object")
    ids = _ints(streams, "ids")
    nxt, cur_ep, cur_pos = (_ints(streams, k) for k in ("next_t", "cur_ep", "cur_pos"))
    next_episode = streams.get("next_episode")
    if type(next_episode) is not int or not 0 <= next_episode < 1 << 62:
        raise CheckpointError("manifest field episodes.streams.next_episode must be an integer >= 0")
    if not (len(nxt) == len(cur_ep) == len(cur_pos) == len(ids)):
        raise CheckpointError("manifest fields episodes.streams.* have different lengths")
    st, t, ep, pos, fl = (np.asarray(rows[k]) for k in _ROWS)
    n = len(st)
    if not all(a.ndim == 1 and len(a) == n for a in (st, t, ep, pos, fl)):
        raise CheckpointError("episodes_*.npy have different lengths")
    st, t, ep, pos = (a.astype(np.int64, copy=False) for a in (st, t, ep, pos))
    # -- ranges ------------------------------------------------------------------------------------
    if len(ids):
        if ids.min() < 0 or ids.max() >= stream_limit or len(np.unique(ids)) != len(ids):
            raise CheckpointError(f"episodes.streams.ids must be distinct stream ids in [0, {stream_limit})")
        if (nxt < 1).any() or (nxt > _T_LIMIT).any():
            raise CheckpointError("episodes.streams.next_t must lie in [1, 2**40 - 1]")
        if (cur_ep < -1).any() or (cur_ep >= next_episode).any():
            raise CheckpointError("episodes.streams.cur_ep must be -1 or an episode id below next_episode")
        if ((cur_ep < 0) != (cur_pos == 0)).any() or (cur_pos < 0).any() or (cur_pos > nxt).any():
            raise CheckpointError("episodes.streams.cur_pos must be 0 with no open episode, else in [1, next_t]")
        open_eps = cur_ep[cur_ep >= 0]
        if len(np.unique(open_eps)) != len(open_eps):
            raise CheckpointError("two streams have the same open episode (episodes.streams.cur_ep)")
    if n == 0:
        return
    if st.min() < 0 or not np.isin(st, ids).all():
        raise CheckpointError("episodes_stream.npy names a stream the stream state does not know")
    if t.min() < -1 or ep.min() < 0 or ep.max() >= next_episode or pos.min() < 0 or int(fl.max()) > 3:
        raise CheckpointError("episodes_*.npy: a position, episode id or flag is out of range")
    slot = np.searchsorted(np.sort(ids), st)  # each step's stream's row in the sorted stream state
    order_ids = np.argsort(ids)
    s_next, s_ep, s_pos = nxt[order_ids][slot], cur_ep[order_ids][slot], cur_pos[order_ids][slot]
    if (i := _first(t >= s_next)) >= 0:
        raise CheckpointError(
            f"episodes_t.npy: step {i} is at position {int(t[i])} of stream {int(st[i])}, "
            f"whose next position is {int(s_next[i])}",
        )
    on = t >= 0  # steps detached by an old version have no position to check
    st, t, ep, pos, fl, s_next, s_ep, s_pos = (a[on] for a in (st, t, ep, pos, fl, s_next, s_ep, s_pos))
    start = t - pos
    if (i := _first(start < 0)) >= 0:
        raise CheckpointError(
            f"episodes_pos.npy: a step at position {int(t[i])} of stream {int(st[i])} claims "
            f"position {int(pos[i])} in episode {int(ep[i])} (more steps than its stream had)",
        )
    # -- along each stream, in key order -------------------------------------------------------------
    o = np.argsort(st, kind="stable")  # key order within each stream
    st, t, ep, pos, fl, start, s_next, s_ep, s_pos = (a[o] for a in (st, t, ep, pos, fl, start, s_next, s_ep, s_pos))
    same = st[1:] == st[:-1]
    if (i := _first(same & (t[1:] <= t[:-1]))) >= 0:
        raise CheckpointError(
            f"episodes_t.npy: stream {int(st[i])} has positions {int(t[i])} then {int(t[i + 1])} in key "
            "order (positions must strictly increase: duplicated or swapped)",
        )
    if (i := _first(same & (ep[1:] < ep[:-1]))) >= 0:
        raise CheckpointError(
            f"episodes_episode.npy: stream {int(st[i])} has episode {int(ep[i + 1])} after episode "
            f"{int(ep[i])} (ids grow along a stream)",
        )
    inner = same & (ep[1:] == ep[:-1])  # two steps of one episode, one after the other
    if (i := _first(inner & (start[1:] != start[:-1]))) >= 0:
        raise CheckpointError(
            f"episodes_pos.npy: episode {int(ep[i])} of stream {int(st[i])} has position {int(pos[i])} "
            f"at stream position {int(t[i])} and {int(pos[i + 1])} at {int(t[i + 1])}: "
            "not one run of positions",
        )
    if (i := _first(inner & (fl[:-1] != 0))) >= 0:
        raise CheckpointError(
            f"episodes_flags.npy: step {int(pos[i])} of episode {int(ep[i])} (stream {int(st[i])}) "
            "carries an end flag but is not the episode's last step",
        )
    nxt_ep = same & (ep[1:] != ep[:-1])  # the last stored step of an episode, and the next episode's first
    if (i := _first(nxt_ep & (start[1:] <= t[:-1]))) >= 0:
        raise CheckpointError(
            f"episodes_pos.npy: episode {int(ep[i + 1])} of stream {int(st[i])} starts at position "
            f"{int(start[i + 1])}, not after episode {int(ep[i])}'s step at {int(t[i])}",
        )
    if (i := _first(nxt_ep & (t[:-1] == start[1:] - 1) & (fl[:-1] == 0))) >= 0:
        raise CheckpointError(
            f"episodes_flags.npy: the step at position {int(t[i])} of stream {int(st[i])} carries no end "
            f"flag, but the next position starts episode {int(ep[i + 1])}",
        )
    # -- each stream's newest stored step, against the stream state ---------------------------------
    last = np.ones(len(st), dtype=bool)
    last[:-1] = ~same
    z = np.flatnonzero(last)
    zs, zt, ze, zf, zstart = st[z], t[z], ep[z], fl[z], start[z]
    c, c_start = s_ep[z], s_next[z] - s_pos[z]
    is_open = c == ze
    if (i := _first(is_open & ((zf != 0) | (zstart != c_start)))) >= 0:
        raise CheckpointError(
            f"stream {int(zs[i])}'s open episode {int(ze[i])} (episodes.streams.cur_ep) "
            + (
                "has an end flag"
                if zf[i]
                else f"starts at position {int(zstart[i])}, the stream state says {int(c_start[i])}"
            ),
        )
    other = (c >= 0) & ~is_open
    if (i := _first(other & ((c < ze) | (c_start <= zt) | ((zt == c_start - 1) & (zf == 0))))) >= 0:
        raise CheckpointError(
            f"stream {int(zs[i])}'s open episode {int(c[i])} (episodes.streams.cur_ep, starting at "
            f"position {int(c_start[i])}) does not follow its stored episode {int(ze[i])} (last step at "
            f"{int(zt[i])}, {'flagged' if zf[i] else 'not flagged'}): it points at a closed episode, or "
            "the stream has two open episodes",
        )
    if (i := _first((c < 0) & (zt == s_next[z] - 1) & (zf == 0))) >= 0:
        raise CheckpointError(
            f"stream {int(zs[i])} has no open episode but its newest step (position {int(zt[i])}, "
            f"episode {int(ze[i])}) carries no end flag: two open episodes, or a cleared end flag",
        )
    # -- an episode is in one stream --------------------------------------------------------------------
    e_o = np.argsort(ep, kind="stable")
    es, ee = st[e_o], ep[e_o]
    if (i := _first((ee[1:] == ee[:-1]) & (es[1:] != es[:-1]))) >= 0:
        raise CheckpointError(
            f"episodes_stream.npy: episode {int(ee[i])} has steps in streams {int(es[i])} and {int(es[i + 1])}"
        )
    open_ids, open_streams = cur_ep[cur_ep >= 0], ids[cur_ep >= 0]
    if len(open_ids):
        k = np.searchsorted(ee, open_ids)
        has = k < len(ee)
        k = np.minimum(k, len(ee) - 1)
        if (i := _first(has & (ee[k] == open_ids) & (es[k] != open_streams))) >= 0:
            raise CheckpointError(
                f"stream {int(open_streams[i])}'s open episode {int(open_ids[i])} has its steps in "
                f"stream {int(es[k[i]])}",
            )


__all__ = ["check_index_arrays"]
