"""The machinery the SB3 buffers share: ring storage, the Table, lazy registration, pickling.

:class:`TableBackedBuffer` is the base of :class:`~replaystore.integrations.sb3.buffers.ReplaystoreReplayBuffer`
and :class:`~replaystore.integrations.sb3.buffers.ReplaystoreDictReplayBuffer` (see
:mod:`.buffers` for the contracts). ``add`` writes into the arrays; the rows are registered with
the table in one batch when the buffer is next sampled (or read through ``table``), or when a
whole ring of rows is waiting. Not thread-safe.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer
from stable_baselines3.common.vec_env import VecNormalize

from ...errors import InvalidArgument, InvalidType
from ...limiters import MinSize
from ...samplers import Fifo, Selector, Uniform
from ...storage.spec import Field
from ...table import Table
from ...table.journal import Journal
from .ring import RingRows, SB3RingStorage

try:  # SB3 warns when the buffer would not fit in memory; psutil is optional there too
    import psutil
except ImportError:  # pragma: no cover
    psutil = None

SCALAR = Field((), np.dtype(np.float32))


class SB3BufferError(InvalidArgument):
    """Bad arguments or input for an SB3 buffer (an ``InvalidArgument``, so also a ``ValueError``, as SB3 raises)."""


def array_property(name: str, doc: str) -> property:
    """A public SB3 array (``buffer.rewards``, ``buffer.observations`` ...): the view ``add`` writes.

    ``observations`` / ``next_observations`` of ``Dict`` spaces are ``{key: array}``; setting the
    property replaces the storage's column(s). Reading next observations that are not stored
    (``optimize_memory_usage``) raises ``AttributeError``.
    """

    def get(self: Any) -> Any:
        views = getattr(self, f"_v_{name}")
        if views is None:
            raise AttributeError("next_observations is not stored with optimize_memory_usage=True")
        return views

    def set(self: Any, value: Any) -> None:
        nested = self._dict_obs and name in ("obs", "next_obs")
        columns = {f"{name}/{k}": v for k, v in value.items()} if nested else {name: value}
        for column, v in columns.items():
            self._storage.set_array(column, v)
        self._bind_views()

    return property(get, set, doc=doc)


class TableBackedBuffer:
    """Shared machinery of the SB3 buffers: ring storage, Table, lazy registration, pickling.

    Subclasses define ``_fields()`` (the flat spec), ``_bind_views()`` (internal array references
    for ``add``) and ``_to_samples(data, env)``.
    """

    buffer_size: int
    observation_space: spaces.Space
    n_envs: int
    pos: int
    full: bool
    device: th.device
    optimize_memory_usage: bool
    handle_timeout_termination: bool

    #: whether the subclass takes ``Dict`` observation spaces (it refuses the others, and vice versa)
    _dict_obs = False

    # SB3's public arrays: the storage's arrays themselves (writes go to the buffer's items)
    actions = array_property(
        "action", "Actions, ``(buffer_size, n_envs, action_dim)`` (float64 spaces stored as float32, as SB3)."
    )
    rewards = array_property("reward", "Rewards, float32 ``(buffer_size, n_envs)``.")
    dones = array_property("done", "Episode ends (terminated or truncated), float32 ``(buffer_size, n_envs)``.")
    timeouts = array_property(
        "timeout", 'Time-limit ends (``info["TimeLimit.truncated"]``), float32 ``(buffer_size, n_envs)``.'
    )

    # -- construction -------------------------------------------------------------------------------
    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        seed: int | None = None,
    ) -> None:
        """See :class:`~replaystore.integrations.sb3.buffers.ReplaystoreReplayBuffer` (arguments, errors)."""
        if isinstance(observation_space, spaces.Dict) != self._dict_obs:
            raise InvalidType(
                "ReplaystoreDictReplayBuffer needs a Dict observation space"
                if self._dict_obs
                else "Dict observation spaces need ReplaystoreDictReplayBuffer"
            )
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        if optimize_memory_usage and handle_timeout_termination:
            kind = "DictReplayBuffer" if self._dict_obs else "ReplayBuffer"
            raise SB3BufferError(
                f"{kind} does not support optimize_memory_usage = True "
                "and handle_timeout_termination = True simultaneously."
            )
        if int(n_envs) < 1:
            raise SB3BufferError(f"n_envs must be >= 1, got {n_envs}")
        self.buffer_size = max(int(buffer_size) // int(n_envs), 1)
        self.optimize_memory_usage = bool(optimize_memory_usage)
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self.seed = int(np.random.randint(2**31 - 1)) if seed is None else int(seed)
        next_of = {}
        fields = self._fields()
        if self.optimize_memory_usage:  # next observations are read from the following row
            for name in [n for n in fields if n.startswith("next_obs")]:
                next_of[name] = "obs" + name[len("next_obs") :]
                del fields[name]
        self._storage = SB3RingStorage(self.buffer_size, self.n_envs, fields, next_of)
        self._warn_if_too_large()
        self._table = self._new_table()
        # rows written by add() since the table last saw the buffer, and the state it saw
        self._pending = 0
        self._synced_pos, self._synced_full = 0, False
        # registering a whole ring at once is the most a batch may hold (one row less when the next
        # observation lives in the following row)
        self._flush_rows = max(self.buffer_size - 1, 1) if self.optimize_memory_usage else self.buffer_size
        self._bind_views()

    def _sampler(self) -> Selector:
        """The table's sampler (uniform; the prioritized buffer overrides this)."""
        return Uniform()

    def _new_table(self) -> Table:
        return Table(
            self._storage.capacity,
            sampler=self._sampler(),
            remover=Fifo(),
            rate_limiter=MinSize(1),
            storage=self._storage,
            seed=self.seed,
            name="sb3-replay",
        )

    def _warn_if_too_large(self) -> None:
        if psutil is None:
            return
        nbytes = sum(a.nbytes for n, a in self._storage.arrays.items() if n != "timeout")
        available = psutil.virtual_memory().available
        if nbytes > available:
            warnings.warn(
                "This system does not have apparently enough memory to store the complete replay "
                f"buffer {nbytes / 1e9:.2f}GB > {available / 1e9:.2f}GB",
                stacklevel=3,
            )

    @property
    def table(self) -> Table:
        """The :class:`~replaystore.Table` holding the items, up to date with every ``add``.

        Read it (``stats()``, ``info``, ``keys``, ``sample``...); changing its items directly
        (``extend``, ``delete``) is not supported, since the buffer's arrays are its storage.
        """
        self._sync()
        return self._table

    # -- registration -----------------------------------------------------------------------------
    def _sync(self) -> None:
        """Register the rows written since the last call with the table (one batch)."""
        k = self._pending
        expected = self._synced_pos + k
        if self.pos != expected % self.buffer_size or bool(self.full) != (
            self._synced_full or expected >= self.buffer_size
        ):
            self._resync()  # pos/full were changed from outside add(): rebuild from SB3's rules
            return
        if k == 0 or self._storage.max_items == 0:  # (one row with optimize_memory_usage: nothing valid)
            self._pending = 0
            self._synced_pos, self._synced_full = self.pos, bool(self.full)
            return
        start = self._synced_pos * self.n_envs
        count = k * self.n_envs
        positions = np.arange(start, start + count, dtype=np.int64)
        if start + count > self._storage.capacity:  # the rows wrap around the end of the ring
            positions[positions >= self._storage.capacity] -= self._storage.capacity
        self._table.extend(RingRows(positions, in_range=True))
        self._pending = 0
        self._synced_pos, self._synced_full = self.pos, bool(self.full)

    def _valid_rows(self) -> np.ndarray:
        """The rows SB3 would sample, oldest first."""
        bs, pos = self.buffer_size, int(self.pos)
        if not self.full:
            return np.arange(pos, dtype=np.int64)
        rows = (np.arange(bs, dtype=np.int64) + pos) % bs
        return rows[1:] if self.optimize_memory_usage else rows

    def _resync(self) -> None:
        self._table.clear()
        rows = self._valid_rows()
        if len(rows):
            positions = (rows[:, None] * self.n_envs + np.arange(self.n_envs)).ravel()
            self._table.extend(RingRows(positions))
        self._pending = 0
        self._synced_pos, self._synced_full = int(self.pos), bool(self.full)

    def _after_add(self) -> None:
        pos = self.pos + 1
        if pos == self.buffer_size:
            self.full = True
            pos = 0
        self.pos = pos
        self._pending += 1
        if self._pending >= self._flush_rows:
            self._sync()

    # -- sampling ---------------------------------------------------------------------------------
    def _draw(self, batch_size: int):
        """Sync, then draw ``batch_size`` items from the table (its :class:`~replaystore.Sample`).

        Raises :class:`SB3BufferError` when the buffer is empty or ``batch_size < 1``.
        """
        if int(batch_size) < 1:
            raise SB3BufferError(f"batch_size must be >= 1, got {batch_size}")
        if self._pending or self.pos != self._synced_pos or self.full != self._synced_full:
            self._sync()
        if len(self._table) == 0:
            raise SB3BufferError("cannot sample from an empty replay buffer")
        return self._table.sample(batch_size, timeout=0)

    def sample(self, batch_size: int, env: VecNormalize | None = None):
        """``batch_size`` transitions, drawn uniformly with replacement over every live transition.

        Returns SB3's ``ReplayBufferSamples`` (``DictReplayBufferSamples`` for ``Dict`` spaces) of
        tensors on ``device``, normalised by ``env`` when given. Raises :class:`SB3BufferError`
        (a ``ValueError``) when the buffer is empty or ``batch_size < 1``.
        """
        return self._to_samples(self._draw(batch_size).data, env)

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None):
        """Transitions at rows ``batch_inds`` of random environments (SB3's hook, same contract)."""
        batch_inds = np.asarray(batch_inds, dtype=np.int64)
        env_indices = np.random.randint(0, high=self.n_envs, size=(len(batch_inds),))
        return self._to_samples(self._storage.gather(batch_inds * self.n_envs + env_indices), env)

    def _tensor(self, array: np.ndarray) -> th.Tensor:
        """A tensor on ``device`` from a fresh array this buffer owns (no copy on the CPU)."""
        if self.device.type == "cpu":
            return th.from_numpy(array)
        return th.as_tensor(array, device=self.device)

    def _dones(self, d: dict[str, np.ndarray]) -> np.ndarray:
        # SB3: dones that are due to a time limit are not terminal (timeouts stay 0 when not handled)
        return (d["done"] * (1.0 - d["timeout"])).reshape(-1, 1)

    def reset(self) -> None:
        """Empty the buffer: ``pos`` 0, not ``full``, no items (the arrays keep their contents, as in SB3)."""
        self.pos = 0
        self.full = False
        self._table.clear()
        self._pending = 0
        self._synced_pos, self._synced_full = 0, False

    # -- input checks -----------------------------------------------------------------------------
    @staticmethod
    def _check_fits(name: str, value: Any, row: np.ndarray) -> None:
        """Raise :class:`SB3BufferError` unless ``value`` broadcasts to ``row`` (nothing written yet)."""
        shape = getattr(value, "shape", None)
        if shape == row.shape:
            return
        try:
            shape = tuple(np.shape(value))
            while len(shape) > row.ndim and shape[0] == 1:  # NumPy assignment drops leading 1s
                shape = shape[1:]
            ok = np.broadcast_shapes(shape, row.shape) == row.shape
        except ValueError:
            ok = False
        if not ok:
            raise SB3BufferError(f"add(): {name} of shape {np.shape(value)} does not fit a row of shape {row.shape}")

    def _timeouts_of(self, infos: list[dict[str, Any]]) -> list[bool]:
        if len(infos) != self.n_envs:
            raise SB3BufferError(f"add(): expected {self.n_envs} infos, got {len(infos)}")
        return [info.get("TimeLimit.truncated", False) for info in infos]

    # -- pickling (save_replay_buffer): arrays and counters as SB3 pickles them, plus the table's items
    def __getstate__(self) -> dict[str, Any]:
        self._sync()
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_v_")}
        table = state.pop("_table")
        storage = state.pop("_storage")
        keys = table.keys()
        slots = Journal(table).slots_of(keys)  # (the storage's rows of the live keys)
        state["_saved"] = {
            "arrays": storage.arrays,
            "positions": storage.position[slots],
            "priorities": table.info(keys)["priorities"],
            "max_priority": table.max_priority,
            "rng": table.rng.bit_generator.state,
        }
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        saved = state.pop("_saved")
        self.__dict__.update(state)
        fields = {n: Field(a.shape[2:], a.dtype) for n, a in saved["arrays"].items()}
        next_of = {}
        if self.optimize_memory_usage:
            next_of = {"next_obs" + n[len("obs") :]: n for n in fields if n.startswith("obs")}
        self._storage = SB3RingStorage(self.buffer_size, self.n_envs, fields, next_of, arrays=saved["arrays"])
        self._table = self._new_table()
        if len(saved["positions"]):
            self._table.extend(RingRows(np.asarray(saved["positions"], dtype=np.int64)), priorities=saved["priorities"])
        self._table.max_priority = saved["max_priority"]
        self._table.rng.bit_generator.state = saved["rng"]
        self._bind_views()


def obs_field(space: spaces.Space, shape: tuple[int, ...]) -> Field:
    """The field of an observation of ``space`` stored with row shape ``shape``."""
    return Field(tuple(shape), np.dtype(space.dtype))
