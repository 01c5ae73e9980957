"""torchgfn's replay buffers on replaystore's core: ``ReplayBuffer`` and its two subclasses.

Layout of a buffer:

- an :class:`replaystore.Table` over slot indices does the bookkeeping: its remover is ``Fifo``
  (keep the newest) or ``MinHeap`` over the log-rewards (keep the top ``capacity``), so an insert
  of ``B`` items into a full buffer of ``N`` costs O(B log N), never a sort of the buffer;
- a slot store keeps the items: a preallocated tensor per field for the container types with a
  codec (torchgfn's three containers, :class:`TensorContainer`), or the containers themselves
  (:class:`~replaystore.compat.gfn.store.ContainerLog`) for any other type;
- per-slot NumPy arrays hold what sampling needs (live mask, log-reward, insertion order).

The table evicts *before* it inserts, so top-k admission is decided first: with ``m`` items too
many, the ``m`` lowest of (batch ∪ the ``m`` lowest stored items) are dropped, ties dropping the
older item, and only the admitted batch items reach ``Table.extend``, whose ``MinHeap`` remover then
evicts exactly the stored items that lost.

Reads (``sample``, ``training_container``, ``save``) build a new container of the stored type.
``training_container`` lists the items as torchgfn does: ascending log-reward with
``prioritized_capacity``, oldest first otherwise.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import numpy as np
import torch

from ...limiters import MinSize
from ...samplers import Fifo, MinHeap, Uniform
from ...table import Table
from .codecs import Codec, TensorContainerCodec, codec_by_kind, codec_for, infer_file_kind
from .containers import Container, TensorContainer
from .store import ContainerLog, SlotStorage, TensorStore, _clear_stale_fields, concat_fields
from .timing import Timer, format_timing

_KIND_KEY = "replaystore_kind"
_FINITE_MAX = np.finfo(np.float64).max


class ContainerTypeError(TypeError, AssertionError):
    """The object is not a container, or not of the buffer's container type.

    It is both a ``TypeError`` and an ``AssertionError``: torchgfn raises either, by version.
    """


class UnsupportedContainer(ValueError, AssertionError):
    """The operation does not support this container type (e.g. baseline filtering of Transitions).

    It is both a ``ValueError`` and an ``AssertionError`` (torchgfn asserts).
    """


class EmptyBufferError(ValueError, AssertionError):
    """The buffer holds nothing yet (torchgfn raises ``ValueError`` or asserts, by method)."""


class _Batch:
    """A prepared batch: encoded fields (codec path) or a container, plus per-item metadata."""

    __slots__ = ("n", "fields", "container", "logr", "prio", "repr")

    def __init__(self, n: int, fields: dict[str, torch.Tensor] | None, container: Any,
                 logr: np.ndarray | None, repr_: torch.Tensor | None) -> None:
        self.n = n
        self.fields = fields
        self.container = container
        self.logr = logr
        self.prio = np.zeros(n) if logr is None else np.clip(logr, -_FINITE_MAX, _FINITE_MAX)  # NaN rejected earlier
        self.repr = repr_

    def subset(self, idx: np.ndarray) -> _Batch:
        t = torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64))
        if self.fields is not None:
            dev = next(iter(self.fields.values())).device
            fields = {k: v.index_select(0, t.to(dev)) for k, v in self.fields.items()}
            container = None
        else:
            fields = None
            container = self.container[t]
        return _Batch(len(idx), fields, container, None if self.logr is None else self.logr[idx],
                      None if self.repr is None else self.repr[t.to(self.repr.device)])


class ReplayBuffer:
    """A replay buffer of GFlowNet containers, with torchgfn's API (``gfn.containers.ReplayBuffer``).

    Args:
        env: the environment (builds containers of torchgfn types; may be ``None`` for
            :class:`TensorContainer` or contract-only containers).
        capacity: maximum number of items.
        prioritized_capacity: keep the ``capacity`` items of highest log-reward (else the newest).
        prioritized_sampling: sample in proportion to reward (softmax of the log-rewards), with
            replacement only when ``n_samples`` exceeds the size; else uniformly without replacement.
        remote_manager: a :class:`~replaystore.compat.gfn.manager.ReplayBufferManager` to send
            batches to: its Ray actor name or handle (``communication_backend="ray"``) or its rank
            (``"torch"``). ``None``: purely local.
        remote_buffer_freq: contact the manager on every k-th :meth:`add`.
        communication_backend: ``"ray"`` (default) or ``"torch"`` (torch.distributed point-to-point).
        timing: record durations in :attr:`timing_data` (see :meth:`timing_log`).
        async_score: send without waiting for the score; :meth:`add` returns the previous send's
            score (``None`` the first time).
        async_comm: also do not wait for the send itself (torch: ``isend``); implies ``async_score``.
        lazy_sort: queue batches and commit them only when ``2 * capacity`` items are pending, or
            before a read. Commits cost O(B log N) here anyway; kept for API compatibility.
        baseline_filtering: send only items with ``log_reward >= baseline`` (the manager's
            ``baseline_log_reward``); every ``baseline_refresh_after`` fully filtered batches, one
            batch is sent unfiltered so the baseline can be refreshed.
        scoring_only: send terminating states and log-rewards only (a states container).
        baseline_refresh_after: see ``baseline_filtering``.
        remote_manager_rank: torchgfn's name for ``remote_manager`` with the torch backend.
        remote_timeout: seconds any wait on the manager may last before ``TimeoutError``.
        sender: this trainer's identity for the manager (default: the Ray actor id, or the rank).
        ray_namespace: namespace of a manager given by name.
    """

    def __init__(
        self,
        env: Any,
        capacity: int = 1000,
        prioritized_capacity: bool = False,
        prioritized_sampling: bool = False,
        remote_manager: Any = None,
        remote_buffer_freq: int = 1,
        communication_backend: str = "ray",
        timing: bool = False,
        async_score: bool = False,
        async_comm: bool = False,
        lazy_sort: bool = False,
        baseline_filtering: bool = False,
        scoring_only: bool = False,
        baseline_refresh_after: int = 10,
        *,
        remote_manager_rank: int | None = None,
        remote_timeout: float = 60.0,
        sender: Any = None,
        ray_namespace: str | None = None,
    ) -> None:
        capacity = int(capacity)
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        if remote_manager is None:
            remote_manager = remote_manager_rank
        if communication_backend not in ("ray", "torch", "mpi"):
            raise ValueError(f"communication_backend must be 'ray' or 'torch', got {communication_backend!r}")
        if isinstance(remote_manager, int) and communication_backend == "ray":
            raise ValueError("a manager rank needs communication_backend='torch'; on Ray, pass the manager's "
                             "actor name or handle")
        if baseline_filtering and remote_manager is None:
            raise ValueError("baseline_filtering needs a remote manager (remote_manager=...)")
        if int(remote_buffer_freq) < 1:
            raise ValueError(f"remote_buffer_freq must be >= 1, got {remote_buffer_freq}")
        self.env = env
        self.capacity = capacity
        self.prioritized_capacity = bool(prioritized_capacity)
        self.prioritized_sampling = bool(prioritized_sampling)
        self.remote_manager = remote_manager
        self.remote_manager_rank = remote_manager if isinstance(remote_manager, int) else None
        self.remote_buffer_freq = int(remote_buffer_freq)
        self.communication_backend = communication_backend
        self.timing = bool(timing)
        self.async_comm = bool(async_comm)
        self.async_score = bool(async_score) or self.async_comm
        self.lazy_sort = bool(lazy_sort)
        self.baseline_filtering = bool(baseline_filtering)
        self.scoring_only = bool(scoring_only)
        self.baseline_refresh_after = int(baseline_refresh_after)
        self.remote_timeout = float(remote_timeout)
        self.sender = sender
        self.ray_namespace = ray_namespace
        self.timing_data: dict[str, list[float]] = {}

        self._table = Table(
            capacity,
            sampler=Uniform(),
            remover=MinHeap() if self.prioritized_capacity else Fifo(),
            rate_limiter=MinSize(1),
            storage=SlotStorage(capacity, self._on_write, self._on_release),
            name="gfn-replay-buffer",
        )
        self._live = np.zeros(capacity, dtype=bool)
        self._logr = np.full(capacity, np.nan)
        self._prio = np.zeros(capacity)
        self._seq = np.zeros(capacity, dtype=np.int64)
        self._next_seq = 0
        # FIFO capacity: the live slots oldest first, as a ring (the Fifo remover evicts its head), so
        # reads see torchgfn's order at O(n) cost: same seed, same samples as torchgfn
        self._ring = np.zeros(capacity, dtype=np.int64)
        self._head = 0
        self._count = 0
        self._container_type: type | None = None
        self._codec: Codec | None = None
        self._store: TensorStore | ContainerLog | None = None
        self._repr: torch.Tensor | None = None
        self._pending_batches: list[_Batch] = []
        self._pending_len = 0

        # remote state (torchgfn's names where they exist)
        self.pending_container: Any = None
        self._add_counter = 0
        self._pending_score = False
        self._transport: Any = None
        self._baseline_log_reward = -math.inf
        self._baseline_total = 0
        self._baseline_kept = 0
        self._baseline_skipped_sends = 0
        self._consecutive_filtered_empty = 0

    # -- queries ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._table) + self._pending_len

    def __repr__(self) -> str:
        kind = "empty" if self._container_type is None else self._container_type.__name__
        return f"{type(self).__name__}(capacity={self.capacity}, containing {len(self)} {kind})"

    @property
    def device(self) -> torch.device:
        """The device of the stored data (raises if nothing was ever added)."""
        if self._store is None:
            raise EmptyBufferError("Buffer is empty, it has no device!")
        if isinstance(self._store, TensorStore):
            dev = self._store.device
            if dev is not None:
                return dev
        elif self._store.log is not None:
            return self._store.log.device
        raise EmptyBufferError("Buffer is empty, it has no device!")

    @property
    def training_container(self) -> Any:
        """The contents as one new container (``None`` before the first add).

        Order: ascending log-reward (ties oldest first) with ``prioritized_capacity``, else oldest
        first. Built on each access (O(N)); assigning a container replaces the contents.
        """
        if self._container_type is None:
            return None
        self._flush_pending()
        slots = self._ordered_slots()
        return self._gather(slots)

    @training_container.setter
    def training_container(self, container: Any) -> None:
        self.clear()
        if container is not None:
            self._local_add(container)
            self._flush_pending()

    def clear(self) -> None:
        """Remove every item (the container type stays set)."""
        self._pending_batches = []
        self._pending_len = 0
        self._table.clear()

    # -- adding -----------------------------------------------------------------------------------
    def add(self, training_container: Any) -> dict[str, float] | None:
        """Add a container of items; with a remote manager, maybe send and return a score dict.

        The first add fixes the container type; later adds must be of the same type
        (:class:`ContainerTypeError`, an ``AssertionError``, otherwise). ``log_probs`` and
        ``estimator_outputs`` are never stored.

        Returns:
            ``None`` without a remote manager or on the adds that do not send; otherwise the
            manager's score dict (with ``async_score``: the previous send's, ``None`` the first time).
        """
        if not _is_container(training_container):
            raise ContainerTypeError("Must be a container type")
        self._local_add(training_container)
        if self.remote_manager is None:
            return None
        return self._remote_add(training_container)

    def initialize(self, training_container: Any) -> Any:
        """An empty container of ``training_container``'s type (torchgfn's helper)."""
        codec = codec_for(training_container, self.env)
        if codec is not None:
            return codec.empty()
        return training_container[torch.zeros(0, dtype=torch.long)]

    def _set_type(self, container: Any) -> None:
        self._container_type = type(container)
        self._codec = codec_for(container, self.env)
        if self._codec is not None:
            self._store = TensorStore(self.capacity, self._codec)
        else:
            self._store = ContainerLog(self.capacity)

    def _check_type(self, container: Any) -> None:
        if self._container_type is None:
            self._set_type(container)
            return
        ok = isinstance(container, self._container_type)
        if ok and self._codec is not None:
            ok = self._codec.matches(container)
        if not ok:
            raise ContainerTypeError(
                f"this buffer holds {self._container_type.__name__}, got {type(container).__name__}"
            )

    def _make_batch(self, container: Any, need_repr: bool = False) -> _Batch:
        """Encode a container (type already checked) into a batch; validates, changes nothing."""
        n = len(container)
        lr = container.log_rewards
        logr = None
        if lr is not None:
            logr = lr.detach().to("cpu", torch.float64).numpy().reshape(-1)
            if logr.shape != (n,):
                raise ValueError(f"log_rewards has shape {tuple(lr.shape)}, expected ({n},)")
            if np.isnan(logr).any():
                raise ValueError("log_rewards contain NaN")
        if self._codec is not None:
            fields = self._codec.encode(container)
            repr_ = self._codec.diversity_repr(fields) if need_repr else None
            return _Batch(n, fields, None, logr, repr_)
        repr_ = _container_repr(container) if need_repr else None
        # index a copy: the log extends it, and must never extend the caller's object
        return _Batch(n, None, container[torch.arange(n)], logr, repr_)

    def _local_add(self, training_container: Any) -> None:
        """Insert locally (the template hook subclasses override, as in torchgfn)."""
        self._check_type(training_container)
        with Timer(self.timing_data, "local_add/encode", self.timing):
            batch = self._make_batch(training_container, need_repr=self._needs_repr)
        self._queue_or_commit(batch)

    _needs_repr = False

    def _queue_or_commit(self, batch: _Batch) -> None:
        if batch.n == 0:
            return
        if self.prioritized_capacity and batch.logr is None:
            raise ValueError("log_rewards must be defined for prioritized replay.")
        if self.lazy_sort:
            self._pending_batches.append(batch)
            self._pending_len += batch.n
            if len(self) >= 2 * self.capacity:
                self._flush_pending()
            return
        self._commit(batch)

    def _flush_pending(self) -> None:
        """Commit the batches queued by ``lazy_sort`` (in order)."""
        if not self._pending_batches:
            return
        batches, self._pending_batches, self._pending_len = self._pending_batches, [], 0
        for b in batches:
            ReplayBuffer._commit(self, b)

    def _commit(self, batch: _Batch) -> None:
        """Admit a batch: top-k by log-reward or newest, then write it."""
        with Timer(self.timing_data, "local_add/sort", self.timing):
            if self.prioritized_capacity:
                admitted = self._select_top(batch.prio)
                if len(admitted) < batch.n:
                    batch = batch.subset(admitted)
            elif batch.n > self.capacity:
                batch = batch.subset(np.arange(batch.n - self.capacity, batch.n))
        if batch.n:
            self._write(batch)

    def _select_top(self, prio: np.ndarray) -> np.ndarray:
        """Indices of batch items that belong to the top ``capacity`` of (buffer ∪ batch)."""
        n = len(prio)
        size = len(self._table)
        m = size + n - self.capacity
        if m <= 0:
            return np.arange(n)
        kb = min(m, size)
        victims = self._table.remover.victims(kb) if kb else np.empty(0, dtype=np.int64)
        values = np.concatenate([self._prio[victims], prio])
        age = np.arange(kb + n)  # stored victims are older than the batch; later batch items newer
        dropped = np.lexsort((age, values))[:m]
        keep = np.ones(n, dtype=bool)
        keep[dropped[dropped >= kb] - kb] = False
        return np.flatnonzero(keep)

    def _write(self, batch: _Batch) -> None:
        with Timer(self.timing_data, "local_add/extend", self.timing):
            if isinstance(self._store, TensorStore):
                self._store.check(batch.fields)
            self._table.extend(batch, priorities=batch.prio, timeout=0)

    def _on_write(self, slots: np.ndarray, batch: _Batch) -> None:
        if isinstance(self._store, TensorStore):
            self._store.write(slots, batch.fields)
        else:
            self._store.write(slots, batch.container, self._live)
        if not self.prioritized_capacity:
            n = len(slots)
            self._ring[(self._head + self._count + np.arange(n)) % self.capacity] = slots
            self._count += n
        self._live[slots] = True
        self._logr[slots] = np.nan if batch.logr is None else batch.logr
        self._prio[slots] = batch.prio
        self._seq[slots] = np.arange(self._next_seq, self._next_seq + len(slots))
        self._next_seq += len(slots)
        if batch.repr is not None:
            if self._repr is None or self._repr.shape[1:] != batch.repr.shape[1:]:
                self._repr = torch.zeros((self.capacity, *batch.repr.shape[1:]), dtype=batch.repr.dtype,
                                         device=batch.repr.device)
            self._repr[torch.from_numpy(slots).to(self._repr.device)] = batch.repr

    def _on_release(self, slots: np.ndarray) -> None:
        self._live[slots] = False
        if not self.prioritized_capacity:
            k = len(slots)
            oldest = self._ring[(self._head + np.arange(k)) % self.capacity]
            if not np.array_equal(np.sort(oldest), np.sort(slots)):  # not the oldest: rebuild the ring
                live = self._live_slots()
                order = live[np.argsort(self._seq[live], kind="stable")]
                self._ring[: len(order)] = order
                self._head, self._count = 0, len(order)
                return
            self._head = (self._head + k) % self.capacity
            self._count -= k

    def _fifo_slots(self, positions: np.ndarray | None = None) -> np.ndarray:
        """Slots of FIFO positions (0 = oldest); all live slots oldest first when ``None``."""
        if positions is None:
            positions = np.arange(self._count)
        return self._ring[(self._head + positions) % self.capacity]

    # -- reading ----------------------------------------------------------------------------------
    def _live_slots(self) -> np.ndarray:
        return np.flatnonzero(self._live)

    def _ordered_slots(self) -> np.ndarray:
        if not self.prioritized_capacity:
            return self._fifo_slots()
        live = self._live_slots()
        return live[np.lexsort((self._seq[live], self._prio[live]))]

    def _gather(self, slots: np.ndarray) -> Any:
        if self._codec is not None:
            if not self._store.columns:
                return self._codec.empty()
            return self._codec.decode(self._store.gather(slots))
        if self._store.log is None:
            return None
        return self._store.gather(slots)

    def live_log_rewards(self) -> np.ndarray:
        """The log-rewards of the stored items (float64, slot order; NaN where unknown)."""
        self._flush_pending()
        return self._logr[self._live_slots()]

    def sample(self, n_samples: int) -> Any:
        """A new container of ``n_samples`` items (see the class docstring for the distribution).

        Uniform sampling returns ``min(n_samples, len(self))`` distinct items, as torchgfn does.

        Raises:
            ValueError: the buffer is empty ("Buffer is empty"), or prioritized sampling without
                log-rewards.
        """
        self._flush_pending()
        size = len(self._table)
        if self._container_type is None or size == 0:
            raise EmptyBufferError("Buffer is empty")
        if self.prioritized_sampling:
            live = self._live_slots() if self.prioritized_capacity else self._fifo_slots()
            lr = self._logr[live]
            if np.isnan(lr).any():
                raise ValueError("log_rewards must be defined for prioritized sampling.")
            probs = torch.softmax(torch.from_numpy(lr), dim=0)
            idx = torch.multinomial(probs, int(n_samples), replacement=int(n_samples) > size).numpy()
            return self._gather(live[idx])
        idx = torch.randperm(size)[: int(n_samples)].numpy()
        slots = self._live_slots()[idx] if self.prioritized_capacity else self._fifo_slots(idx)
        return self._gather(slots)

    # -- persistence -----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the contents to one ``.pt`` file of tensors (torchgfn's container layout).

        The file also records the container kind, so :meth:`load` restores it on a fresh buffer;
        torchgfn's ``Container.load`` reads it too (it ignores the extra key). Nothing is
        written before the first add (as in torchgfn). The write is atomic (temporary + rename).
        """
        if self._container_type is None:
            return
        container = self.training_container
        if self._codec is not None:
            raw = self._codec.to_file(container)
            kind = self._codec.kind
        elif hasattr(container, "to_tensordict"):
            raw = dict(container.to_tensordict().to_dict())
            kind = "object"
        else:
            raise TypeError(f"cannot save {self._container_type.__name__}: it has no tensor codec "
                            "(TensorContainer, torchgfn containers, or a to_tensordict method)")
        raw = {k: v for k, v in raw.items() if k not in ("log_probs", "estimator_outputs")}
        raw[_KIND_KEY] = torch.tensor(list(kind.encode()), dtype=torch.uint8)
        path = os.fspath(path)
        tmp = f"{path}.tmp{os.getpid()}"
        torch.save(raw, tmp)
        os.replace(tmp, path)

    def load(self, path: str | os.PathLike) -> None:
        """Replace the contents with a file written by :meth:`save` (or by torchgfn's ``save``).

        Works on a fresh buffer too (torchgfn's silently does nothing there). Items beyond the
        capacity are dropped by the buffer's rule (lowest log-reward, or oldest).
        """
        device = None
        try:
            device = self.device
        except EmptyBufferError:
            device = getattr(self.env, "device", None)
        raw = torch.load(os.fspath(path), weights_only=True, map_location=device)
        kind_t = raw.pop(_KIND_KEY, None)
        if kind_t is not None:
            kind = bytes(kind_t.tolist()).decode()
        elif self._codec is not None:
            kind = self._codec.kind
        elif self._container_type is not None:
            kind = "object"
        else:
            kind = infer_file_kind(raw)
        if kind == "object":
            cls = self._container_type
            if cls is None or not hasattr(cls, "from_tensordict"):
                raise TypeError("this file holds a container type without a codec: load it into a buffer "
                                "that already holds that type")
            from tensordict import TensorDict

            container = cls.from_tensordict(self.env, TensorDict(raw, batch_size=[]))
        else:
            is_backward = bool(raw["is_backward"].item()) if "is_backward" in raw else False
            codec = self._codec if (self._codec is not None and self._codec.kind == kind) else \
                codec_by_kind(kind, self.env, is_backward)
            container = codec.from_file(raw)
        self.clear()
        self._container_type = None
        self._check_type(container)
        batch = self._make_batch(container, need_repr=self._needs_repr)
        if batch.n:
            if self.prioritized_capacity and batch.logr is None:
                raise ValueError("log_rewards must be defined for prioritized replay.")
            ReplayBuffer._commit(self, batch)

    # -- timing -------------------------------------------------------------------------------------
    def timing_log(self) -> str:
        """Timing totals, counts and means per key, plus the baseline-filtering counters."""
        extra = []
        if self.baseline_filtering:
            total = self._baseline_total
            kept = self._baseline_kept
            pct = 100.0 * (1 - kept / total) if total else 0.0
            extra.append(f"baseline filtering: kept {kept}/{total} ({pct:.1f}% filtered), "
                         f"{self._baseline_skipped_sends} sends skipped entirely")
        return format_timing(self.timing_data, extra)

    # -- remote ---------------------------------------------------------------------------------------
    def _remote_add(self, container: Any) -> dict[str, float] | None:
        self._add_counter += 1
        if self.pending_container is None:
            self.pending_container = []
        self.pending_container.append(container)
        if self._add_counter % self.remote_buffer_freq != 0:
            return None
        pending = self._merge_pending(self.pending_container)
        self.pending_container = None
        if self.async_score:
            stale = self._collect_pending_score()
            self._update_baseline(stale)
            self._filter_and_send(pending, wait=False)
            return stale
        score = self._filter_and_send(pending, wait=True)
        self._update_baseline(score)
        return score

    def _merge_pending(self, containers: list[Any]) -> Any:
        """One new container of the pending batches, without stale per-sample fields."""
        codec = codec_for(containers[0], self.env)
        if codec is not None:
            fields = concat_fields([codec.encode(c) for c in containers], codec.ragged)
            return codec.decode(fields)
        merged = containers[0][torch.arange(len(containers[0]))]
        for c in containers[1:]:
            merged.extend(c)
        _clear_stale_fields(merged)
        return merged

    def _kind_of(self, container: Any) -> str:
        codec = codec_for(container, self.env)
        return "object" if codec is None else codec.kind

    def _per_item_rewards(self, container: Any) -> bool:
        codec = codec_for(container, self.env)
        if codec is not None:
            return codec.per_item_rewards
        return type(container).__name__ != "Transitions"

    def _update_baseline(self, score: dict | None) -> None:
        if self.baseline_filtering and score and "baseline_log_reward" in score:
            self._baseline_log_reward = float(score["baseline_log_reward"])

    def _filter_by_baseline(self, container: Any) -> Any:
        """The items with ``log_reward >= baseline`` (``None``: send nothing this time).

        Unfiltered while no baseline is known or without log-rewards; every
        ``baseline_refresh_after`` consecutive fully filtered batches, the next passes whole.
        """
        if not self._per_item_rewards(container):
            raise UnsupportedContainer("baseline filtering supports Trajectories or StatesContainer only")
        lr = container.log_rewards
        n = len(container)
        if self._baseline_log_reward == -math.inf or lr is None:
            self._baseline_total += n
            self._baseline_kept += n
            return container
        mask = lr >= self._baseline_log_reward
        kept = int(mask.sum())
        self._baseline_total += n
        if kept == n:
            self._consecutive_filtered_empty = 0
            self._baseline_kept += n
            return container
        if kept == 0:
            self._baseline_skipped_sends += 1
            self._consecutive_filtered_empty += 1
            if self._consecutive_filtered_empty >= self.baseline_refresh_after:
                self._consecutive_filtered_empty = 0
                self._baseline_kept += n
                return container
            return None
        self._consecutive_filtered_empty = 0
        self._baseline_kept += kept
        return container[torch.where(mask)[0]]

    def _prepare_for_remote(self, container: Any) -> Any:
        """With ``scoring_only``: a states container of terminating states and log-rewards."""
        if not self.scoring_only:
            return container
        codec = codec_for(container, self.env)
        if codec is None:
            if type(container).__name__ == "Transitions":
                raise UnsupportedContainer("scoring_only supports Trajectories or StatesContainer only")
            return container
        if not codec.per_item_rewards:
            raise UnsupportedContainer("scoring_only supports Trajectories or StatesContainer only")
        kind, fields = codec.terminal_fields(codec.encode(container))
        if kind == codec.kind:
            return container
        return codec_by_kind(kind, self.env).decode(fields)

    def _filter_and_send(self, container: Any, wait: bool) -> dict[str, float] | None:
        if self.baseline_filtering:
            container = self._filter_by_baseline(container)
            if container is None:
                return None
        with Timer(self.timing_data, "prepare_for_remote", self.timing):
            container = self._prepare_for_remote(container)
        transport = self._get_transport()
        with Timer(self.timing_data, "send_objs", self.timing):
            if wait:
                return transport.send(container, wait=True)
            transport.send(container, wait=False)
            self._pending_score = True
            return None

    def _collect_pending_score(self, timeout: float | None = None) -> dict[str, float] | None:
        """The score of the previous async send (``None`` if none is pending)."""
        if not self._pending_score:
            return None
        with Timer(self.timing_data, "wait_pending_score", self.timing):
            score = self._get_transport().collect(self.remote_timeout if timeout is None else timeout)
        self._pending_score = False
        return score

    def drain_pending_score(self, timeout_sec: float = 30.0) -> dict[str, float] | None:
        """Wait for the last async score before shutting down; ``None`` on timeout (with a warning)."""
        if not self._pending_score or self._transport is None:
            return None
        try:
            return self._collect_pending_score(timeout_sec)
        except TimeoutError:
            warnings.warn(f"no score from the replay buffer manager within {timeout_sec}s; dropped",
                          RuntimeWarning, stacklevel=2)
            self._pending_score = False
            self._transport.abandon()
            return None

    def _get_transport(self) -> Any:
        if self._transport is None:
            if self.communication_backend == "ray":
                from .ray_backend import RayTrainerTransport

                self._transport = RayTrainerTransport(self.remote_manager, self, namespace=self.ray_namespace)
            elif self.communication_backend == "torch":
                from .torch_backend import TorchTrainerTransport

                self._transport = TorchTrainerTransport(int(self.remote_manager), self)
            else:
                raise NotImplementedError("the MPI backend is not available; use 'ray' or 'torch'")
        return self._transport

    def close(self, timeout: float | None = None) -> None:
        """Drain a pending score and say goodbye to the manager (no-op without one). Idempotent."""
        if self.remote_manager is None:
            return
        transport = self._get_transport()
        self.drain_pending_score(self.remote_timeout if timeout is None else timeout)
        transport.goodbye(self.remote_timeout if timeout is None else timeout)


_CONTAINER_TYPES: set[type] = set()


def _is_container(obj: Any) -> bool:
    """Whether ``obj`` has the :class:`Container` members (checked once per type, on the type).

    ``isinstance(obj, Container)`` would evaluate the properties (``terminating_states``) on
    every call; the check on the type is the same structural test without that cost.
    """
    cls = type(obj)
    if cls in _CONTAINER_TYPES:
        return True
    if all(hasattr(cls, name) for name in ("__len__", "__getitem__", "extend", "log_rewards", "terminating_states")):
        _CONTAINER_TYPES.add(cls)
        return True
    return isinstance(obj, Container)


def _container_repr(container: Any) -> torch.Tensor:
    """Flattened terminating states (and conditions) of a contract-only container."""
    states = container.terminating_states
    tensor = states.tensor
    if not isinstance(tensor, torch.Tensor):
        raise ValueError("the diverse buffer needs terminating states held in a tensor")
    if tensor.shape[0] != len(container):
        raise ValueError("the diverse buffer needs one terminating state per item")
    n = tensor.shape[0]
    out = tensor.reshape(n, -1).to(torch.get_default_dtype())
    cond = getattr(states, "conditions", None)
    if cond is not None:
        out = torch.cat([out, cond.reshape(n, -1).to(out.dtype)], dim=-1)
    return out


class NormBasedDiversePrioritizedReplayBuffer(ReplayBuffer):
    """Top-``capacity`` by log-reward, admitting only items far enough from what is stored.

    Until the buffer is full, batches are added whole. Once full, a batch is ranked by
    log-reward (descending); items below the buffer's minimum are dropped; with
    ``cutoff_distance >= 0`` an item is kept only if its p-norm distance (``p_norm_distance``)
    to every stored terminating state is ``> cutoff_distance`` and, going down the ranking, to
    every *kept* higher-reward batch item (a greedy filter). Conditions are part of the compared
    vector when present. A negative cutoff turns the diversity check off. Sampling is uniform.
    """

    _needs_repr = True

    def __init__(self, env: Any, capacity: int = 1000, cutoff_distance: float = 0.0, p_norm_distance: float = 1.0,
                 **kwargs: Any) -> None:
        kwargs.pop("prioritized_capacity", None)
        kwargs.pop("prioritized_sampling", None)
        super().__init__(env, capacity, prioritized_capacity=True, prioritized_sampling=False, **kwargs)
        self.cutoff_distance = float(cutoff_distance)
        self.p_norm_distance = float(p_norm_distance)
        # cutoff 0 (torchgfn's default) only rejects exact duplicates: a hash of the stored vectors
        # answers that in O(B) instead of B x N distances
        self._exact = self.cutoff_distance == 0.0 and self.p_norm_distance > 0
        self._row_count: dict[bytes, int] = {}
        self._row_of_slot: list[bytes | None] = [None] * self.capacity

    @staticmethod
    def _row_keys(x: torch.Tensor) -> list[bytes]:
        a = np.ascontiguousarray((x.detach().cpu() + 0.0).numpy())  # + 0.0: -0.0 and 0.0 are one vector
        return [r.tobytes() for r in a]

    def _on_write(self, slots: np.ndarray, batch: _Batch) -> None:
        super()._on_write(slots, batch)
        if self._exact and batch.repr is not None:
            counts = self._row_count
            for slot, key in zip(slots.tolist(), self._row_keys(batch.repr)):
                self._row_of_slot[slot] = key
                counts[key] = counts.get(key, 0) + 1

    def _on_release(self, slots: np.ndarray) -> None:
        super()._on_release(slots)
        if self._exact:
            counts = self._row_count
            for slot in slots.tolist():
                key = self._row_of_slot[slot]
                if key is None:
                    continue
                self._row_of_slot[slot] = None
                if counts[key] <= 1:
                    del counts[key]
                else:
                    counts[key] -= 1

    @staticmethod
    def _diversity_repr(container: Any) -> torch.Tensor:
        """The ``(n, d)`` vectors compared: terminating states, conditions concatenated."""
        codec = codec_for(container, getattr(container, "env", None))
        if codec is not None:
            return codec.diversity_repr(codec.encode(container))
        return _container_repr(container)

    def _local_add(self, training_container: Any) -> None:
        self._check_type(training_container)
        batch = self._make_batch(training_container, need_repr=True)
        if batch.n == 0:
            return
        if batch.logr is None:
            raise ValueError("log_rewards must be defined for prioritized replay.")
        if len(self) < self.capacity:
            self._queue_or_commit(batch)
            return
        self._flush_pending()
        with Timer(self.timing_data, "local_add/diversity", self.timing):
            batch = self._diverse_subset(batch)
        if batch is not None:
            ReplayBuffer._commit(self, batch)

    def _diverse_subset(self, batch: _Batch) -> _Batch | None:
        order = np.argsort(-batch.prio, kind="stable")
        minimum = self._prio[self._table.remover.peek()]
        order = order[batch.prio[order] >= minimum]
        if len(order) == 0:
            return None
        batch = batch.subset(order)
        if self.cutoff_distance < 0:
            return batch
        if self._exact:
            seen: set[bytes] = set()
            keep = []
            for i, key in enumerate(self._row_keys(batch.repr)):
                if key not in self._row_count and key not in seen:
                    keep.append(i)
                    seen.add(key)
            return batch.subset(np.asarray(keep, dtype=np.int64)) if keep else None
        x = batch.repr
        stored = self._repr[torch.from_numpy(self._live_slots()).to(self._repr.device)]
        far = torch.cdist(x.unsqueeze(0), stored.unsqueeze(0), p=self.p_norm_distance).squeeze(0).min(-1)[0]
        candidates = np.flatnonzero((far > self.cutoff_distance).cpu().numpy())
        if len(candidates) == 0:
            return None
        xc = x[torch.from_numpy(candidates).to(x.device)]
        close = (torch.cdist(xc.unsqueeze(0), xc.unsqueeze(0), p=self.p_norm_distance).squeeze(0)
                 <= self.cutoff_distance).cpu().numpy()
        removed = np.zeros(len(candidates), dtype=bool)
        kept = []
        for i in range(len(candidates)):
            if removed[i]:
                continue
            kept.append(i)
            removed |= close[i]
        return batch.subset(candidates[np.asarray(kept, dtype=np.int64)])


class TerminatingStateBuffer(ReplayBuffer):
    """Stores the terminating states of what is added, with their log-rewards.

    torchgfn containers become a ``StatesContainer`` (all rows terminating); other containers a
    :class:`TensorContainer` of ``terminating_states.tensor``, conditions and log-rewards. The
    remote path (if any) still sends the original container unless ``scoring_only`` is set.
    """

    def __init__(self, env: Any, capacity: int = 1000, communication_backend: str = "ray", timing: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(env, capacity, communication_backend=communication_backend, timing=timing, **kwargs)

    @property
    def training_container(self) -> Any:
        """The stored states (an empty states container before the first add)."""
        if self._container_type is None:
            return self._empty()
        return ReplayBuffer.training_container.fget(self)

    @training_container.setter
    def training_container(self, container: Any) -> None:
        ReplayBuffer.training_container.fset(self, container)

    def _empty(self) -> Any:
        if self.env is not None and hasattr(self.env, "states_from_batch_shape"):
            try:
                from gfn.containers import StatesContainer

                return StatesContainer(self.env)
            except ImportError:  # pragma: no cover - torchgfn absent but a gfn-like env
                pass
        return TensorContainerCodec().empty()

    def _to_states(self, container: Any) -> Any:
        codec = codec_for(container, self.env)
        if codec is not None and codec.kind.startswith("gfn."):
            if not codec.per_item_rewards:
                raise UnsupportedContainer("TerminatingStateBuffer supports Trajectories or StatesContainer")
            fields = codec.encode(container)
            if codec.kind == "gfn.StatesContainer":
                mask = fields["is_terminating"]
                fields = {k: v[mask] for k, v in fields.items()}
                return codec.decode(fields)
            kind, fields = codec.terminal_fields(fields)
            return codec_by_kind(kind, self.env).decode(fields)
        states = container.terminating_states
        lr = container.log_rewards
        if lr is not None and len(lr) != len(states):
            raise UnsupportedContainer("TerminatingStateBuffer needs one log-reward per terminating state")
        return TensorContainer(states.tensor, lr, getattr(states, "conditions", None))

    def _local_add(self, training_container: Any) -> None:
        super()._local_add(self._to_states(training_container))
