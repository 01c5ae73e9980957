"""What every Table-backed Tianshou buffer shares: sampling through the Table, fast reads, pickling.

:class:`TableBacked` is mixed in front of a Tianshou buffer class (``ReplayBuffer`` or
``ReplayBufferManager``). The buffer keeps Tianshou's storage (``self._meta``, a ``Batch`` of
preallocated arrays indexed by ring position) and counters; a
:class:`~replaystore.compat.tianshou.positions.PositionTable` holds the live positions and draws
samples. Subclasses say which positions are live (:meth:`live_positions`) and register what they
write (:meth:`written`). Not thread-safe.
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np
from tianshou.data import Batch
from tianshou.data.utils.converter import to_hdf5

from .position_tree import PositionSampler
from .positions import PositionTable

try:  # the compiled helper (built by setup.py); without it one ``take`` per stored array
    from . import _native
except ImportError:  # pragma: no cover - no C compiler at install time
    _native = None

_INPUT_KEYS = ("obs", "act", "rew", "terminated", "truncated", "obs_next", "info", "policy")
_OUT_KEYS = ("obs", "act", "rew", "terminated", "truncated", "done", "obs_next", "info", "policy")
_KNOWN = frozenset(_OUT_KEYS)


def is_batch(value: Any) -> bool:
    """``isinstance(value, Batch)``, fast for arrays (Tianshou's ``Batch`` check goes through ``typing``)."""
    t = type(value)
    return t is Batch or (t is not np.ndarray and value is not None and isinstance(value, Batch))


def take(array: np.ndarray, index: Any) -> Any:
    """``array[index]``; an integer array ``index`` goes through ``ndarray.take``.

    Same result (negative indices count from the end, out of range raises ``IndexError``), but
    NumPy's fancy indexing of a row-major array with rows of several values walks an iterator per
    element, while ``take`` copies whole rows: ~8x faster for 4-float observations at 1,000 rows
    (measured in bench/bench_tianshou.py's sample).
    """
    if type(index) is np.ndarray and index.dtype.kind == "i":
        return array.take(index, axis=0)
    return array[index]


def gather(value: Any, index: Any) -> Any:
    """``value[index]`` for an array or a ``Batch`` tree, building the result ``Batch`` directly.

    Same result as Tianshou's ``Batch.__getitem__`` (``None`` and empty ``Batch`` leaves are kept
    as they are); raises ``IndexError`` for an index out of range.
    """
    if type(value) is np.ndarray:
        return take(value, index)
    if not is_batch(value):
        return value[index]
    out = Batch()
    d = out.__dict__
    for k, v in value.__dict__.items():
        if type(v) is np.ndarray:
            d[k] = take(v, index)
        elif v is None:
            d[k] = None
        elif is_batch(v):
            d[k] = gather(v, index) if v.__dict__ else Batch()
        else:
            d[k] = v[index]
    return out


def write_same_keys(meta: Batch, batch: Batch | dict, index: Any) -> bool:
    """``meta[index] = batch`` leaf by leaf when both trees have the same keys and array leaves.

    Returns False when the trees differ (the caller then takes Tianshou's general path, which also
    allocates new keys); some leaves may have been written at ``index`` by then, and the general
    path rewrites every leaf at the same ``index``. A leaf that NumPy cannot assign raises
    ``ValueError`` (the caller handles it the same way).
    """
    return _write(meta.__dict__, batch if type(batch) is dict else batch.__dict__, index)


_PLAIN = frozenset((np.ndarray, bool, int, float, np.bool_, np.float32, np.float64, np.int64, np.int32))


def _write(md: dict, bd: dict, index: Any) -> bool:
    if md.keys() != bd.keys():
        return False
    for k, v in bd.items():
        m = md[k]
        if type(m) is np.ndarray:
            if type(v) not in _PLAIN or m.dtype == object:
                return False
            m[index] = v
        elif is_batch(m) and is_batch(v):
            if (m.__dict__ or v.__dict__) and not _write(m.__dict__, v.__dict__, index):  # (both empty: nothing)
                return False
        else:
            return False
    return True


def gather_plan(md: dict) -> tuple[tuple[np.ndarray, ...], list] | None:
    """The stored arrays of ``md`` (a ``Batch``'s ``__dict__``) for a compiled gather, and how to rebuild the tree.

    Keys in Tianshou's order (as the per-key path), one level of nested ``Batch`` (``info``);
    None when the storage holds anything else (the caller takes the per-key path). The second
    item goes to :func:`build_batch` with the gathered arrays.
    """
    if "obs" not in md or "obs_next" not in md:
        return None
    arrays: list[np.ndarray] = []
    layout: list[tuple[str, tuple[str, ...] | None]] = []
    keys = _OUT_KEYS
    if len(md) > len(_OUT_KEYS) or not md.keys() <= _KNOWN:
        keys += tuple(k for k in md if k not in _KNOWN)
    for k in keys:
        v = md.get(k)
        if type(v) is np.ndarray:
            arrays.append(v)
            layout.append((k, None))
        elif v is None:
            layout.append((k, ()))
        elif type(v) is Batch:
            sub = v.__dict__
            for x in sub.values():
                if type(x) is not np.ndarray:
                    return None
                arrays.append(x)
            layout.append((k, tuple(sub)))
        else:
            return None
    return tuple(arrays), layout


def build_batch(layout: list, got: tuple[np.ndarray, ...]) -> Batch:
    """The ``Batch`` of the gathered arrays ``got`` laid out as :func:`gather_plan` said."""
    out = Batch()
    d = out.__dict__
    i = 0
    for k, sub_keys in layout:
        if sub_keys is None:
            d[k] = got[i]
            i += 1
        else:
            b = Batch()
            bd = b.__dict__
            for sk in sub_keys:
                bd[sk] = got[i]
                i += 1
            d[k] = b
    return out


def _gather_all(md: dict, indices: np.ndarray) -> Batch | None:
    """``meta[indices]`` in one compiled pass over the rows when every stored leaf is an array, else None."""
    plan = gather_plan(md)
    if plan is None:
        return None
    got = _native.gather(plan[0], indices)
    return None if got is None else build_batch(plan[1], got)


class TableBacked:
    """Mixin: the live positions in a :class:`PositionTable`; Tianshou's reads on vectorised NumPy.

    The host class must be a Tianshou buffer; the mixin comes first in the bases.
    """

    _positions: PositionTable | None
    _prioritized = False

    # -- the position table ---------------------------------------------------------------------
    def _init_positions(self, seed: int | None) -> None:
        self.__dict__["_rs_seed"] = seed
        self.__dict__["_positions"] = None  # built on first use (and again after a reset or a load)

    def live_positions(self) -> np.ndarray:
        """The ring positions that hold sampleable transitions (int64)."""
        raise NotImplementedError

    def position_priorities(self, positions: np.ndarray) -> np.ndarray | None:
        """The priorities to register ``positions`` with (None: uniform buffers)."""
        return None

    def positions_table(self) -> PositionTable | PositionSampler:
        """The buffer's :class:`PositionTable` (uniform) or :class:`PositionSampler` (prioritized), built if needed."""
        pt = self.__dict__.get("_positions")
        if pt is None:
            seed = self.__dict__.get("_rs_seed")
            if self._prioritized:  # drawn and updated by position: no key to translate
                pt = PositionSampler(self.maxsize, alpha=self._alpha, seed=seed, priority_of=self.position_priorities)
            else:
                pt = PositionTable(self.maxsize, seed=seed)
            live = self.live_positions()
            pt.rebuild(live, self.position_priorities(live))
            self.__dict__["_positions"] = pt
        return pt

    def written(self, positions: np.ndarray | int) -> None:
        """Register ring positions just written (an array, or one int; new transitions replace what was there)."""
        pt = self.__dict__.get("_positions")
        if pt is not None:  # (else it is built from the counters on first use)
            pt.written(positions, self.position_priorities(positions))

    def _invalidate(self) -> None:
        self.__dict__["_positions"] = None

    @property
    def table(self) -> Any:
        """The :class:`~replaystore.Table` of live positions, up to date (read it; do not edit it)."""
        pt = self.positions_table()
        pt.sync()
        return pt.table

    # -- Tianshou's API -------------------------------------------------------------------------
    def sample_indices(self, batch_size: int | None) -> np.ndarray:
        """Indices of ``batch_size`` transitions drawn by the Table (as Tianshou: 0 = all, < 0 = none)."""
        if batch_size is None or batch_size <= 0 or (self._sample_avail and self.stack_num > 1):
            return super().sample_indices(batch_size)
        pt = self.positions_table()
        if len(pt) == 0:
            raise ValueError("cannot sample from an empty buffer")
        return pt.sample(int(batch_size))

    def get(self, index: Any, key: str, default_value: Any = None, stack_num: int | None = None) -> Batch | np.ndarray:
        """Tianshou's ``get``: ``key`` at ``index``, stacked over ``stack_num`` previous steps in one gather."""
        meta = self._meta
        if key not in meta.__dict__ and default_value is not None:
            return default_value
        val = meta[key]
        if stack_num is None:
            stack_num = self.stack_num
        if is_batch(val) and not val.__dict__:
            return Batch()
        if stack_num == 1:
            return gather(val, index)
        indices = np.array(index) if isinstance(index, list) else index
        chain = [indices]
        for _ in range(stack_num - 1):
            chain.append(self.prev(chain[-1]))
        stacked = np.stack(chain[::-1], axis=np.ndim(chain[-1]))
        return gather(val, stacked)

    def __getitem__(self, index: Any) -> Batch:
        """A ``Batch`` of the transitions at ``index`` (Tianshou's contract; stacked when ``stack_num > 1``)."""
        if isinstance(index, slice):
            indices = self.sample_indices(0) if index == slice(None) else self._indices[: len(self)][index]
        else:
            indices = index
        md = self._meta.__dict__
        if (
            _native is not None
            and type(indices) is np.ndarray
            and indices.dtype == np.int64
            and indices.ndim == 1
            and self.stack_num == 1
            and self._save_obs_next
        ):
            out = _gather_all(md, indices)
            if out is not None:
                return out
        out = Batch()
        d = out.__dict__
        if self.stack_num == 1 and self._save_obs_next and "obs" in md and "obs_next" in md:
            # the common case: one gather per stored key, in Tianshou's key order
            for k in _OUT_KEYS:
                v = md.get(k)
                d[k] = take(v, indices) if type(v) is np.ndarray else Batch() if v is None else gather(v, indices)
            for k in md.keys() - _KNOWN:
                d[k] = gather(md[k], indices)
            return out
        d["obs"] = self.get(indices, "obs")
        if self._save_obs_next:
            obs_next = self.get(indices, "obs_next", Batch())
        else:
            obs_next = self.get(self.next(indices), "obs", Batch())
        for k in ("act", "rew", "terminated", "truncated", "done"):
            d[k] = gather(md[k], indices)
        d["obs_next"] = obs_next
        d["info"] = self.get(indices, "info", Batch())
        d["policy"] = self.get(indices, "policy", Batch())
        for k in md.keys() - set(_INPUT_KEYS) - {"done"}:
            d[k] = gather(md[k], indices)
        return out

    # -- state ----------------------------------------------------------------------------------
    def reset(self, keep_statistics: bool = False) -> None:
        """Tianshou's ``reset``; the Table is emptied too."""
        super().reset(keep_statistics=keep_statistics)
        self._invalidate()

    def dropnull(self) -> None:
        """Tianshou's ``dropnull``; the Table is rebuilt."""
        super().dropnull()
        self._invalidate()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_positions"] = None  # rebuilt from the counters (priorities are in the state)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__["_positions"] = None
        self.__dict__.setdefault("_rs_seed", 42)

    def save_hdf5(self, path: str, compression: str | None = None) -> None:
        """Tianshou's ``save_hdf5`` (the Table is rebuilt on load from the saved counters)."""
        with h5py.File(path, "w") as f:
            to_hdf5(self.__getstate__(), f, compression=compression)
