"""The Table's snapshots and checkpoints: a plain :class:`~replaystore.TableSnapshot` out and in.

:meth:`Persistence.snapshot` copies the live items' rows and every part's state under the lock;
:meth:`Persistence.from_snapshot` builds a new table from one. :meth:`Persistence.save` and
:meth:`Persistence.load` pass snapshots to and from :mod:`replaystore.checkpoint`, which knows the
files and nothing of the Table.

A mixin of :class:`~replaystore.table.Table`.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Self

import numpy as np

from ..checkpoint import load_snapshot, save_snapshot
from ..episodes import Episodes
from ..errors import BlockingWarning, CheckpointError
from ..limiters import limiter_from_config
from ..rows import TIMES_SAMPLED_MAX, VERSION_MAX, VERSION_MIN
from ..samplers import selector_from_config
from ..snapshot import CONFIG, TableSnapshot
from ..storage import Storage
from ..storage.describe import from_description


class Persistence:
    """``snapshot``, ``from_snapshot``, ``save``, ``load`` (see the module doc)."""

    def snapshot(self) -> TableSnapshot:
        """A copy of the table's items and state, taken under its lock (staged adds flushed).

        Items in key order (oldest first). Thread-safe; the table is unchanged.
        """
        with self._flushed():
            st = self._state
            slots = self._index.live_slots()
            key_of_slot = self._index.key_of_slot
            meta = {
                "keys": key_of_slot[slots],
                "priorities": self._priority[slots].copy(),
                "times_sampled": self._times_sampled[slots].astype(np.int64),
                "versions": self._version[slots].astype(np.int64),
            }
            episodes = None
            if self._episodes is not None:
                episodes = {
                    "config": self._episodes.options.config(),
                    "streams": self._episodes.export_streams(),
                    "rows": self._episodes.export_rows(slots),
                }
            return TableSnapshot(
                config={name: getattr(self, name) for name in CONFIG},
                state={
                    "next_key": st.next_key,
                    "model_version": st.version,
                    "max_priority": st.max_priority,
                    "counters": st.counters(),
                    "blocked": st.blocked(),
                    "rng": self.rng.bit_generator.state,
                },
                sampler={"config": self.sampler.config(), "state": self.sampler.export_state(key_of_slot)},
                remover={"config": self.remover.config(), "state": self.remover.export_state(key_of_slot)},
                rate_limiter={"config": self.rate_limiter.config(), "state": self.rate_limiter.state()},
                storage=self.storage.describe(),
                meta=meta,
                payload=self.storage.export(slots),
                episodes=episodes,
            )

    @classmethod
    def from_snapshot(cls, snapshot: TableSnapshot, storage: Storage | None = None) -> Self:
        """A new table holding what ``snapshot`` holds (items, metadata, every part's state).

        ``storage``: an empty storage for it (default: one like ``snapshot.storage`` describes,
        in RAM).

        Raises:
            ReplayError, KeyError, TypeError, ValueError: the configuration is invalid (as the
                constructor raises them).
            CheckpointError: the items or states are inconsistent with each other.
        """
        cfg = {name: snapshot.config[name] for name in CONFIG}
        episodes = None if snapshot.episodes is None else Episodes(**snapshot.episodes["config"])
        table = cls(
            **cfg,
            sampler=selector_from_config(snapshot.sampler["config"]),
            remover=selector_from_config(snapshot.remover["config"]),
            rate_limiter=limiter_from_config(snapshot.rate_limiter["config"]),
            storage=storage if storage is not None else from_description(snapshot.storage, cfg["capacity"]),
            episodes=episodes,
        )
        try:
            table._restore(snapshot)
        except Exception as e:  # noqa: BLE001 - whatever a corrupt state trips over is a bad snapshot
            raise CheckpointError(f"the saved state is inconsistent ({type(e).__name__}: {e})") from None
        return table

    def _restore(self, snap: TableSnapshot) -> None:
        """Fill this new, empty table from ``snap`` (items in key order)."""
        meta, state = snap.meta, snap.state
        n = snap.size
        st = self._state
        v, ts = np.asarray(meta["versions"]), np.asarray(meta["times_sampled"])
        if not VERSION_MIN <= int(state["model_version"]) <= VERSION_MAX or (
            n and (v.min() < VERSION_MIN or v.max() > VERSION_MAX or ts.min() < 0 or ts.max() > TIMES_SAMPLED_MAX)
        ):
            raise CheckpointError("a snapshot's versions or times_sampled do not fit the metadata row (int32)")
        with self._cond:
            if self._await_head is not None:
                self._await_head()
            self.storage.import_(snap.payload)
            keys = meta["keys"].astype(np.int64)
            if self._ring is not None and n:  # the items go to slots 0 .. n-1: slot 0 holds keys[0]
                # ring mode needs one run of keys that the next key continues (not so after deletes of the newest)
                if int(state["next_key"]) == int(keys[-1]) + 1 and bool((np.diff(keys) == 1).all()):
                    st.ring_base = st.ring_lo = st.ring_hi = int(keys[0])
                else:
                    self._leave_ring()
            slots = self._take_free(n, int(keys[0]) if n else 0)
            self._index.assign(slots, keys)
            self._priority[slots] = meta["priorities"]
            self._times_sampled[slots] = meta["times_sampled"]
            self._version[slots] = meta["versions"]
            if self._episodes is not None:  # the steps' streams and positions, validated
                # (the place where restored episode arrays are checked against each other)
                self._episodes.begin_restore(snap.episodes["rows"], snap.episodes["streams"])
            try:
                for sel in self._selectors:
                    sel.insert(slots, keys, self._priority[slots])
            finally:
                if self._episodes is not None:
                    self._episodes.end()
            st.size = n
            slot_of_key = dict(zip(keys.tolist(), slots.tolist()))
            self.sampler.import_state(snap.sampler["state"], slot_of_key)
            self.remover.import_state(snap.remover["state"], slot_of_key)
            self.rate_limiter.load_state(snap.rate_limiter["state"])
            st.next_key = int(state["next_key"])
            st.version = int(state["model_version"])
            st.max_priority = float(state["max_priority"])
            st.load_counters(state["counters"], state["blocked"])
            self.rng.bit_generator.state = state["rng"]

    def save(self, path: str | os.PathLike) -> None:
        """Write a checkpoint directory atomically (see :mod:`replaystore.checkpoint`).

        Thread-safe: the lock is held only while the snapshot is copied.
        """
        save_snapshot(self.snapshot(), path)

    @classmethod
    def load(cls, path: str | os.PathLike, allow_pickle: bool = False, memmap_dir: str | None = None) -> Self:
        """Restore a table saved with :meth:`save` (see :mod:`replaystore.checkpoint`).

        Warns (:class:`~replaystore.BlockingWarning`) when the loaded table holds items but its
        rate limiter admits no sample: a ``sample`` would block until more items are inserted.
        """
        table = load_snapshot(path, cls.from_snapshot, allow_pickle=allow_pickle, memmap_dir=memmap_dir)
        size, limiter = table._state.size, table.rate_limiter
        if size and not limiter.can_sample(1):
            warnings.warn(_unsampleable(table.name, size, limiter), BlockingWarning, stacklevel=2)
        return table


def _unsampleable(name: str, size: int, limiter: Any) -> str:
    """Why a table of ``size`` items cannot be sampled now, and what to do."""
    if limiter.size < limiter.min_size_to_sample:
        need = limiter.min_size_to_sample - limiter.size
        return (
            f"table {name!r} holds {size} items, fewer than the {limiter.min_size_to_sample} its rate limiter "
            f"{limiter!r} needs before any sample: sample() blocks until {need} more are inserted. "
            "Insert them first, or pass timeout= to get a Timeout instead of waiting"
        )
    return (
        f"table {name!r} holds {size} items but its rate limiter {limiter!r} admits no sample until more "
        f"items are inserted (inserts {limiter.inserts}, samples {limiter.samples}): sample() blocks until "
        "then. Insert more, or pass timeout= to get a Timeout instead"
    )
