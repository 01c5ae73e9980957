"""Step plans: the rows a writer is about to insert, and the stream positions they will take.

A writer (``add_step``, ``extend_steps``, ``add_episode``, a checkpoint restore) validates its rows
and registers a :class:`StepPlan` with the :class:`~replaystore.episodes.index.EpisodeIndex`; when
the table writes the rows, the index turns the plan into per-row stream positions, episode ids,
positions in the episode and end flags with :func:`compute_plan`.
"""

from __future__ import annotations

import numpy as np

TERMINATED = np.uint8(1)
TRUNCATED = np.uint8(2)
ENDS = TERMINATED | TRUNCATED


class StepPlan:
    """Rows a writer is about to insert: their streams and end flags (validated).

    ``new_episode`` forces the first row of each stream to start a new episode (``add_episode``).
    ``same_stream`` promises that every row has the same stream id.
    ``rows`` (a restore, or a replica's copy) gives explicit per-row ``(stream, t, episode, pos, flags)``.
    """

    __slots__ = (
        "streams",
        "terminated",
        "truncated",
        "new_episode",
        "accepted",
        "computed",
        "rows",
        "committed",
        "same_stream",
        "shape",
    )

    def __init__(
        self,
        streams: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        new_episode: bool = False,
        rows: tuple | None = None,
        same_stream: bool = False,
        shape: str = "general",
    ) -> None:
        self.streams = streams
        self.terminated = terminated
        self.truncated = truncated
        self.new_episode = new_episode
        self.accepted: np.ndarray | None = None
        self.computed: tuple | None = None
        self.rows = rows
        self.committed = False
        self.same_stream = same_stream  # every row has the same stream id
        # set by the plan's computation: "same", "distinct" or "general"; "restore": rows of a
        # checkpoint (steps of any age, detached steps with t = -1)
        self.shape = shape


def compute_plan(
    plan: StepPlan, next_t: np.ndarray, cur_ep: np.ndarray, cur_pos: np.ndarray, next_episode: int, mark: np.ndarray
) -> tuple:
    """Per-row ``(ts, episodes, pos, flags)`` and the streams' next state, for all rows of ``plan``.

    ``next_t``, ``cur_ep``, ``cur_pos`` (per stream) and ``next_episode`` are the index's stream
    state (read, not changed); ``mark`` is a per-stream scratch array (overwritten). Returns (and
    caches in ``plan.computed``) ``(ts, episodes, pos, flags, streams written, their next
    (next_t, cur_ep, cur_pos), next_episode)``.

    Three shapes of batch have a short path: one row, rows of one stream (a scalar stream id,
    ``add_episode``), rows of distinct streams (one row per environment of a vectorised env).
    """
    if plan.computed is not None:
        return plan.computed
    streams = plan.streams
    n = len(streams)
    flags = plan.terminated.astype(np.uint8) * TERMINATED | plan.truncated.astype(np.uint8) * TRUNCATED
    ends = flags != 0
    if n == 1:
        plan.shape = "same"
        s = int(streams[0])
        t = int(next_t[s])
        ep, pos, new = int(cur_ep[s]), int(cur_pos[s]), 0
        if ep < 0 or plan.new_episode:
            ep, pos, new = next_episode, 0, 1
        end = bool(ends[0])
        plan.computed = (
            np.array([t]),
            np.array([ep]),
            np.array([pos]),
            flags,
            streams,
            (t + 1, -1 if end else ep, 0 if end else pos + 1),
            next_episode + new,
        )
        return plan.computed
    if plan.same_stream:
        plan.shape = "same"
        s = int(streams[0])
        ar = np.arange(n)
        ts = next_t[s] + ar
        starts = np.empty(n, dtype=bool)
        starts[0] = cur_ep[s] < 0 or plan.new_episode
        starts[1:] = ends[:-1]
        c = np.cumsum(starts)
        eps = np.where(c > 0, next_episode + c - 1, cur_ep[s])
        last_start = np.maximum.accumulate(np.where(starts, ar, -1))
        pos = np.where(last_start >= 0, ar - last_start, cur_pos[s] + ar)
        end = bool(ends[-1])
        state = (next_t[s] + n, -1 if end else int(eps[-1]), 0 if end else int(pos[-1]) + 1)
        plan.computed = (ts, eps, pos, flags, streams[:1], state, next_episode + int(c[-1]))
        return plan.computed
    ar = np.arange(n)
    mark[streams] = ar
    if bool((mark[streams] == ar).all()):  # distinct streams
        plan.shape = "distinct"
        ts = next_t[streams]
        starts = (cur_ep[streams] < 0) | plan.new_episode
        c = np.cumsum(starts)
        eps = np.where(starts, next_episode + c - 1, cur_ep[streams])
        pos = np.where(starts, 0, cur_pos[streams])
        state = (ts + 1, np.where(ends, -1, eps), np.where(ends, 0, pos + 1))
        plan.computed = (ts, eps, pos, flags, streams, state, next_episode + int(c[-1]))
        return plan.computed
    plan.shape = "general"
    order = np.argsort(streams, kind="stable")
    ss = streams[order]
    first = np.ones(n, dtype=bool)
    first[1:] = ss[1:] != ss[:-1]
    gidx = np.flatnonzero(first)
    gid = np.cumsum(first) - 1
    rank = ar - gidx[gid]
    us = ss[gidx]
    counts = np.diff(np.append(gidx, n))
    ts = next_t[us][gid] + rank
    es = ends[order]
    starts = np.empty(n, dtype=bool)
    starts[0] = False
    starts[1:] = es[:-1]
    starts[gidx] = (cur_ep[us] < 0) | plan.new_episode
    c = np.cumsum(starts)
    c_before_group = (c[gidx] - starts[gidx])[gid]
    in_new = c - c_before_group > 0
    eps = np.where(in_new, next_episode + c - 1, cur_ep[us][gid])
    last_start = np.maximum.accumulate(np.where(starts, ar, -1))
    pos = np.where(last_start >= gidx[gid], ar - last_start, cur_pos[us][gid] + rank)
    last = gidx + counts - 1
    lend = es[last]
    state = (next_t[us] + counts, np.where(lend, -1, eps[last]), np.where(lend, 0, pos[last] + 1))
    out_t, out_e, out_p = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    out_t[order], out_e[order], out_p[order] = ts, eps, pos
    plan.computed = (out_t, out_e, out_p, flags, us, state, next_episode + int(c[-1]))
    return plan.computed


__all__ = ["ENDS", "TERMINATED", "TRUNCATED", "StepPlan", "compute_plan"]
