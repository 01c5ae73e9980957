"""Writers of an episodic Table: the plans of steps with their stream, whole episodes, episode ends.

The Table's public methods (``add_step``, ``extend_steps``, ``add_episode``, ``end_episode``) hold
the table's lock, ask these for a validated :class:`StepPlan` (nothing changes on error), then
insert the rows through the table's ordinary insert path (rate limiter, staleness, eviction,
priorities, versions) with the plan begun in the index. ``end_episodes`` changes only the index.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import EpisodeError, UnknownStream
from .config import Episodes
from .index import TERMINATED, TRUNCATED, EpisodeIndex, StepPlan


def validate_streams(streams: Any, n: int, config: Episodes) -> np.ndarray:
    """``n`` int64 stream ids from an int or an ``(n,)`` integer array; :class:`EpisodeError` else."""
    a = np.asarray(streams)
    if a.dtype.kind not in "iu":
        raise EpisodeError(f"stream ids must be integers, got {type(streams).__name__} of dtype {a.dtype}")
    if a.ndim == 0:
        a = np.full(n, int(a), dtype=np.int64)
    elif a.shape != (n,):
        raise EpisodeError(f"expected one stream id or {n} stream ids (shape ({n},)), got shape {a.shape}")
    else:
        a = a.astype(np.int64)
    if n:
        lo, hi = int(a.min()), int(a.max())
        limit = config.stream_limit
        if lo < 0 or hi >= limit:
            bad = lo if lo < 0 else hi
            raise EpisodeError(
                f"stream id {bad} is outside [0, {limit})"
                + ("" if config.max_streams is not None else " (pass Episodes(max_streams=...) to change the bound)")
            )
    return a


def validate_flags(flags: Any, n: int, name: str) -> np.ndarray:
    """``n`` booleans from ``None`` (all False), a bool, or an ``(n,)`` array of bools / 0-1 ints."""
    if flags is None:
        return np.zeros(n, dtype=bool)
    a = np.asarray(flags)
    if a.dtype.kind not in "biu":
        raise EpisodeError(f"{name} must be booleans, got dtype {a.dtype}")
    if a.dtype.kind != "b" and a.size and not np.isin(a, (0, 1)).all():
        raise EpisodeError(f"{name} must be booleans (or 0/1), got values {np.unique(a)[:5].tolist()}")
    if a.ndim == 0:
        return np.full(n, bool(a))
    if a.shape != (n,):
        raise EpisodeError(f"{name}: expected a bool or shape ({n},), got shape {a.shape}")
    return a.astype(bool)


def steps_plan(index: EpisodeIndex, n: int, streams: Any, terminated: Any, truncated: Any) -> StepPlan:
    """The plan of ``n`` rows of :meth:`Table.extend_steps` (validated; nothing changes)."""
    return StepPlan(
        validate_streams(streams, n, index.options),
        validate_flags(terminated, n, "terminated"),
        validate_flags(truncated, n, "truncated"),
        same_stream=np.ndim(streams) == 0,
    )


def step_plan(index: EpisodeIndex, stream: Any, terminated: Any, truncated: Any) -> StepPlan:
    """The plan of the one step of :meth:`Table.add_step` (validated; nothing changes)."""
    if type(stream) is int and 0 <= stream < index.options.stream_limit:  # the common case, fast
        s = np.array([stream], dtype=np.int64)
    else:
        s = validate_streams(stream, 1, index.options)
        if np.ndim(stream) != 0:
            raise EpisodeError(f"add_step takes one stream id, got shape {np.shape(stream)}")
    if type(terminated) is bool and type(truncated) is bool:
        term, trunc = np.array([terminated]), np.array([truncated])
    else:
        if np.ndim(terminated) != 0 or np.ndim(truncated) != 0:
            raise EpisodeError("add_step takes scalar terminated/truncated flags")
        term = validate_flags(terminated, 1, "terminated")
        trunc = validate_flags(truncated, 1, "truncated")
    return StepPlan(s, term, trunc, same_stream=True)


def episode_plan(index: EpisodeIndex, n: int, stream: Any, terminated: bool, truncated: bool) -> StepPlan:
    """The plan of the ``n`` steps of :meth:`Table.add_episode` (validated; nothing changes)."""
    if n == 0:
        raise EpisodeError("add_episode needs at least one step")
    if stream is None:
        s = index.fresh_stream()
        if s >= index.options.stream_limit:
            raise EpisodeError(f"no free stream id below {index.options.stream_limit}")
        streams = np.full(n, s, dtype=np.int64)
    else:
        if np.ndim(stream) != 0:
            raise EpisodeError(f"add_episode takes one stream id, got shape {np.shape(stream)}")
        streams = validate_streams(stream, n, index.options)
        s = int(streams[0])
        if index.known(streams[:1])[0] and index.cur_ep[s] >= 0:
            raise EpisodeError(
                f"stream {s} has an open episode (its last step did not end it): call "
                "end_episode(stream) first or write its steps with add_step/extend_steps"
            )
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, (bool, np.bool_)):
            raise EpisodeError(f"add_episode: {name} must be a bool, got {flag!r}")
    term = np.zeros(n, dtype=bool)
    trunc = np.zeros(n, dtype=bool)
    term[-1], trunc[-1] = bool(terminated), bool(truncated)
    return StepPlan(streams, term, trunc, new_episode=True, same_stream=True)


def end_episodes(index: EpisodeIndex, streams: Any, truncated: bool) -> int:
    """Close the open episode of each of ``streams`` in ``index``; return how many closed.

    Validates everything before changing anything (see :meth:`Table.end_episode`).
    """
    if not isinstance(truncated, (bool, np.bool_)):
        raise EpisodeError(f"truncated must be a bool, got {truncated!r}")
    n = int(np.size(streams)) if np.ndim(streams) else 1
    if np.ndim(streams) > 1:
        raise EpisodeError(f"stream ids must be an int or a 1-D array, got shape {np.shape(streams)}")
    s = validate_streams(streams, n, index.options)
    s = np.unique(s)
    unknown = s[~index.known(s)]
    if len(unknown):
        raise UnknownStream(f"end_episode: stream(s) {unknown[:5].tolist()} never wrote a step")
    s = s[index.cur_ep[s] >= 0]
    if len(s) == 0:
        return 0
    slots = index.lookup(s, index.next_t[s] - 1)
    live = slots[slots >= 0]
    index.flags[live] |= TRUNCATED if truncated else TERMINATED
    index.cur_ep[s] = -1
    index.cur_pos[s] = 0
    index.generation += 1
    return len(s)


def recorded_plan(index: EpisodeIndex, n: int, steps: Mapping[str, Any]) -> StepPlan:
    """The plan of a recorded step write of ``n`` rows (validated).

    ``steps``: as :meth:`replaystore.table.journal.Journal.replay_insert` takes them.
    """
    if not isinstance(steps, Mapping):
        raise EpisodeError(f"steps must be a mapping of step arguments, got {type(steps).__name__}")
    stream = steps.get("streams")
    if stream is None:
        stream = index.fresh_stream()
    new_episode = steps.get("new_episode", False)
    if not isinstance(new_episode, (bool, np.bool_)):
        raise EpisodeError(f"new_episode must be a bool, got {new_episode!r}")
    plan = steps_plan(index, n, stream, steps.get("terminated"), steps.get("truncated"))
    plan.new_episode = bool(new_episode)
    return plan
