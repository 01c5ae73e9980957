"""Offline RL data into a Table: Minari datasets and D4RL-style arrays.

Both loaders produce **transitions** with the same fields (``obs``, ``action``, float32 ``reward``,
``next_obs``, bool ``terminated``: do not bootstrap, bool ``truncated``: a time limit, bootstrap
from ``next_obs``), so offline and online tables share a spec (and can be mixed, see
:mod:`replaystore.mixing`). The rules (D4RL rows without a successor, as D4RL's
``qlearning_dataset``; Minari episodes; episodes) are in docs/data.md, "Offline data".

Every loader validates everything before the table changes: on bad data it raises
:class:`OfflineDataError` (or :class:`~replaystore.SpecError` from the table) and the table is as
it was. The rows are inserted with **one** ``extend`` call, so they fit the table or nothing is
inserted: a dataset larger than the table's free space raises instead of evicting its own rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .errors import InvalidArgument, InvalidType
from .storage.spec import concat
from .table import Table

D4RL_REQUIRED = ("observations", "actions", "rewards", "terminals", "timeouts")
FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


class OfflineDataError(InvalidArgument):
    """Offline data is malformed (missing or misaligned arrays, bad flags) or does not fit the table."""


def _map(fn: Any, tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {k: _map(fn, v) for k, v in tree.items()}
    return fn(tree)


def _leaves(tree: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            yield from _leaves(v, f"{prefix}{k}/")
    else:
        yield prefix.rstrip("/") or "value", tree


def _flags(name: str, a: Any, n: int) -> np.ndarray:
    a = np.asarray(a)
    if a.shape != (n,):
        raise OfflineDataError(f"{name!r} must have shape ({n},), got {a.shape}")
    if a.dtype != bool:
        if not np.isin(a, (0, 1)).all():
            raise OfflineDataError(f"{name!r} must hold booleans or 0/1, got other values")
        a = a.astype(bool)
    return a


def read_d4rl_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read D4RL-style arrays from an ``.npz`` file or a D4RL ``.hdf5``/``.h5`` file.

    Only the arrays :func:`d4rl_transitions` uses are read (``observations``, ``actions``,
    ``rewards``, ``terminals``, ``timeouts``, ``next_observations`` when present); ``.npz`` files
    are read without pickle; HDF5 needs ``h5py`` (``pip install 'replaystore[offline]'``).

    Raises:
        OfflineDataError: the file is missing, unreadable, or of another format.
    """
    path = os.fspath(path)
    wanted = (*D4RL_REQUIRED, "next_observations")
    suffix = os.path.splitext(path)[1].lower()
    try:
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in wanted if k in z.files}
        if suffix in (".hdf5", ".h5"):
            import h5py

            with h5py.File(path, "r") as f:
                return {k: np.asarray(f[k]) for k in wanted if k in f and isinstance(f[k], h5py.Dataset)}
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to read an untrusted file is bad data
        raise OfflineDataError(f"cannot read D4RL arrays from {path}: {type(e).__name__}: {e}") from None
    raise OfflineDataError(f"{path}: expected a .npz or .hdf5/.h5 file")


def d4rl_transitions(arrays: Mapping[str, Any]) -> dict[str, Any]:
    """Convert D4RL-style arrays into transition columns (the rules: docs/data.md, "Offline data").

    Returns:
        ``{"obs", "action", "reward", "next_obs", "terminated", "truncated"}`` with one row per
        kept transition (new arrays; the input is not modified). ``obs``/``next_obs`` may be
        nested dicts of arrays.

    Raises:
        OfflineDataError: a required array is missing, lengths differ, flags are not boolean,
            rewards are not finite, or no transition is left.
    """
    return _d4rl(arrays)[0]


def _d4rl(arrays: Mapping[str, Any]) -> tuple[dict[str, Any], np.ndarray]:
    """:func:`d4rl_transitions` plus the episode number of each kept row."""
    missing = [k for k in D4RL_REQUIRED if k not in arrays]
    if missing:
        raise OfflineDataError(f"D4RL arrays are missing {missing}; got {sorted(arrays)}")
    rewards = np.asarray(arrays["rewards"])
    n = len(rewards)
    if rewards.shape != (n,):
        raise OfflineDataError(f"'rewards' must be one-dimensional, got shape {rewards.shape}")
    if not np.isfinite(rewards).all():
        raise OfflineDataError("'rewards' holds NaN or infinite values")
    for name in ("observations", "actions") + (("next_observations",) if "next_observations" in arrays else ()):
        for path, leaf in _leaves(arrays[name]):
            if len(leaf) != n:
                raise OfflineDataError(f"{name!r} ({path}) has {len(leaf)} rows, 'rewards' has {n}")
    terminals = _flags("terminals", arrays["terminals"], n)
    timeouts = _flags("timeouts", arrays["timeouts"], n)
    obs = _map(np.asarray, arrays["observations"])
    if "next_observations" in arrays:
        keep = np.arange(n)
        next_obs = _map(lambda a: np.asarray(a).copy(), arrays["next_observations"])
    else:
        has_next = np.zeros(n, dtype=bool)
        has_next[:-1] = True
        keep = np.flatnonzero((has_next & ~timeouts) | terminals)
        succ = np.minimum(keep + 1, n - 1)
        succ = np.where(terminals[keep], keep, succ)  # terminal: its own obs as a placeholder
        next_obs = _map(lambda a: a[succ], obs)
    if len(keep) == 0:
        raise OfflineDataError("no transition left after dropping timeout and final rows")
    ends = terminals | timeouts
    episode = np.concatenate([[0], np.cumsum(ends[:-1])])[keep]  # episode number of each kept row
    return {
        "obs": _map(lambda a: a[keep], obs),
        "action": np.asarray(arrays["actions"])[keep],
        "reward": rewards[keep].astype(np.float32),
        "next_obs": next_obs,
        "terminated": terminals[keep],
        "truncated": timeouts[keep] if "next_observations" in arrays else np.zeros(len(keep), dtype=bool),
    }, episode


def minari_transitions(
    dataset: Any, episode_indices: Iterable[int] | None = None, download: bool = False
) -> dict[str, Any]:
    """Transition columns of a Minari dataset (an id, or a ``minari.MinariDataset``).

    Episode ``e`` with ``T`` steps gives ``T`` transitions: ``obs = observations[:-1]``,
    ``next_obs = observations[1:]``, ``terminated = terminations``, ``truncated = truncations``
    (so every transition, truncated ones included, has its true next observation).

    Args:
        dataset: a dataset id (loaded with ``minari.load_dataset``) or a dataset.
        episode_indices: the episodes to take (default: all, in the dataset's order).
        download: passed to ``minari.load_dataset(dataset, download=...)``: ``True`` fetches a
            dataset id that is not in the local Minari directory from Minari's remote (the
            network); ``False`` (default) reads only local datasets.

    Raises:
        OfflineDataError: the dataset has no steps, or an episode is malformed.
        ImportError: ``minari`` is not installed (``pip install 'replaystore[offline]'``).
    """
    return _minari(dataset, episode_indices, download)[0]


def _minari(
    dataset: Any, episode_indices: Iterable[int] | None, download: bool = False
) -> tuple[dict[str, Any], np.ndarray]:
    """:func:`minari_transitions` plus the episode number of each row."""
    if isinstance(dataset, str):
        try:
            import minari
        except ImportError as e:  # pragma: no cover - exercised only without the extra
            raise ImportError("loading Minari datasets needs minari: pip install 'replaystore[offline]'") from e
        dataset = minari.load_dataset(dataset, download=bool(download))
    parts: dict[str, list] = {f: [] for f in FIELDS}
    episodes: list[np.ndarray] = []
    for ep in dataset.iterate_episodes(None if episode_indices is None else list(episode_indices)):
        t = len(ep.rewards)
        for path, leaf in _leaves(ep.observations):
            if len(leaf) != t + 1:
                raise OfflineDataError(f"episode {ep.id}: {len(leaf)} observations ({path}) for {t} steps")
        parts["obs"].append(_map(lambda a: np.asarray(a)[:-1], ep.observations))
        parts["next_obs"].append(_map(lambda a: np.asarray(a)[1:], ep.observations))
        parts["action"].append(np.asarray(ep.actions))
        parts["reward"].append(np.asarray(ep.rewards, dtype=np.float32))
        parts["terminated"].append(np.asarray(ep.terminations, dtype=bool))
        parts["truncated"].append(np.asarray(ep.truncations, dtype=bool))
        episodes.append(np.full(t, len(episodes), dtype=np.int64))
    if not parts["reward"] or sum(len(r) for r in parts["reward"]) == 0:
        raise OfflineDataError("the Minari dataset (selection) holds no steps")
    return {f: concat(v) for f, v in parts.items()}, np.concatenate(episodes)


def _target(n: int, table: Table | None, capacity: int | None, table_kwargs: dict) -> Table:
    if table is None:
        return Table(int(capacity) if capacity is not None else n, **table_kwargs)
    if capacity is not None or table_kwargs:
        raise InvalidType("pass either a table or capacity/table arguments, not both")
    return table


def _check_fits(n: int, table: Table) -> None:
    free = table.capacity - len(table)
    if n > free:
        raise OfflineDataError(
            f"{n} transitions do not fit the table's free space of {free} "
            f"(capacity {table.capacity}); they would evict each other"
        )


def fill_table(
    columns: Mapping[str, Any], table: Table | None = None, capacity: int | None = None, **table_kwargs: Any
) -> Table:
    """Insert transition columns into ``table`` (or a new ``Table(capacity or rows, **table_kwargs)``).

    One ``extend`` call: all rows or none.

    Raises:
        OfflineDataError: more rows than the table's free space (nothing inserted).
        SpecError: the columns do not match the table's spec (nothing inserted).
    """
    n = len(columns["reward"])
    table = _target(n, table, capacity, table_kwargs)
    _check_fits(n, table)
    table.extend(dict(columns))
    return table


def fill_episodes(
    columns: Mapping[str, Any],
    episode: Any,
    table: Table | None = None,
    capacity: int | None = None,
    stream: int | None = None,
    **table_kwargs: Any,
) -> Table:
    """Insert transition columns as **episodes** of an episodic table (``Table(episodes=...)``).

    ``episode`` numbers each row's episode (rows of one episode are consecutive). Each episode is
    written with
    ``table.add_episode``: its steps carry the same six fields as transitions, and its last step
    gets ``terminated=True`` if it is terminal, else ``truncated=True`` (a dataset episode that
    ends without a flag has no more steps in the data: it is stored truncated).

    Args:
        columns: transition columns (as :func:`d4rl_transitions` returns them).
        episode: the episode number of each row.
        table: an episodic table, or ``None`` for a new ``Table(capacity or rows,
            episodes=rs.Episodes(next_obs_field="next_obs"), **table_kwargs)``.
        capacity: the new table's capacity (default: the number of rows).
        stream: the stream id every episode is written to (it must have no open episode);
            ``None``: each episode gets a fresh stream id (``add_episode(stream=None)``).
        **table_kwargs: further arguments of the new table.

    Everything is validated before the first episode is written (fields against the table's
    spec, free space); after that, the only failure left is a rate limiter's ``Timeout``.

    Raises:
        OfflineDataError: more rows than the free space, or the table is not episodic.
        SpecError: the fields do not match the table's spec.
    """
    n = len(columns["reward"])
    if table is None:
        from .episodes import Episodes

        table_kwargs.setdefault("episodes", Episodes(next_obs_field="next_obs"))
    table = _target(n, table, capacity, table_kwargs)
    if not getattr(table, "episodic", False):
        raise OfflineDataError("as_episodes needs an episodic table: Table(..., episodes=rs.Episodes(...))")
    _check_fits(n, table)
    fields = dict(columns)
    table.storage.prepare(fields, batched=True)  # validation only: raises SpecError, changes nothing
    episode = np.asarray(episode)
    if episode.shape != (n,):
        raise OfflineDataError(f"episode numbers must have shape ({n},), got {episode.shape}")
    starts = np.flatnonzero(np.r_[True, episode[1:] != episode[:-1]])
    stops = np.r_[starts[1:], n]
    terminated = np.asarray(fields["terminated"])
    for a, b in zip(starts.tolist(), stops.tolist()):
        steps = _map(lambda x, a=a, b=b: x[a:b], fields)
        term = bool(terminated[b - 1])
        table.add_episode(steps, stream=stream, terminated=term, truncated=not term)
    return table


def load_d4rl(
    arrays: Mapping[str, Any] | str | os.PathLike,
    table: Table | None = None,
    capacity: int | None = None,
    as_episodes: bool = False,
    stream: int | None = None,
    **table_kwargs: Any,
) -> Table:
    """D4RL-style arrays or a D4RL file into a Table as transitions (episodes with ``as_episodes``).

    ``arrays`` is a dict of arrays or a path (see :func:`read_d4rl_file`).

    See :func:`d4rl_transitions`, :func:`fill_table` and :func:`fill_episodes` (``stream``).
    """
    if isinstance(arrays, (str, os.PathLike)):
        arrays = read_d4rl_file(arrays)
    columns, episode = _d4rl(arrays)
    if as_episodes:
        return fill_episodes(columns, episode, table, capacity, stream, **table_kwargs)
    return fill_table(columns, table, capacity, **table_kwargs)


def load_minari(
    dataset: Any,
    table: Table | None = None,
    capacity: int | None = None,
    episode_indices: Iterable[int] | None = None,
    as_episodes: bool = False,
    stream: int | None = None,
    download: bool = False,
    **table_kwargs: Any,
) -> Table:
    """A Minari dataset into a Table as transitions, or as episodes with ``as_episodes``.

    ``download=True`` goes to ``minari.load_dataset`` (fetch a dataset id missing locally; it is
    never a Table argument). See :func:`minari_transitions`, :func:`fill_table` and
    :func:`fill_episodes` (``stream``).
    """
    columns, episode = _minari(dataset, episode_indices, download)
    if as_episodes:
        return fill_episodes(columns, episode, table, capacity, stream, **table_kwargs)
    return fill_table(columns, table, capacity, **table_kwargs)
