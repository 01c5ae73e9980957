"""torchgfn's replay buffers on replaystore's core: ``ReplayBuffer``, the base of the other two.

An :class:`replaystore.Table` over slot indices does the bookkeeping (``Fifo``, or ``MinHeap`` over
the log-rewards with top-k admission decided before ``Table.extend``), a slot store
(:mod:`~replaystore.compat.gfn.store`) keeps the items, per-slot NumPy arrays what sampling needs
(live mask, log-reward, insertion order): the design is docs/compat/gfn.md, "How it is built".

Neighbours: :mod:`~replaystore.compat.gfn.batch` (container handling: errors, prepared batches),
:mod:`~replaystore.compat.gfn.remote` (sending to a manager), :mod:`~replaystore.compat.gfn.strategies`
(the diverse and terminating-state buffers).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from ...limiters import MinSize
from ...samplers import Fifo, MinHeap, Uniform
from ...table import Table
from .batch import Batch, ContainerTypeError, EmptyBufferError, UnsupportedContainer, container_repr, is_container
from .codecs import Codec, codec_for
from .files import load_container, save_container
from .remote import RemotePath
from .store import ContainerLog, SlotStorage, TensorStore
from .timing import Timer, format_timing

__all__ = ["ContainerTypeError", "EmptyBufferError", "ReplayBuffer", "UnsupportedContainer"]


class ReplayBuffer(RemotePath):
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
            raise ValueError(
                "a manager rank needs communication_backend='torch'; on Ray, pass the manager's actor name or handle"
            )
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
        self._container_type: type | None = None
        self._codec: Codec | None = None
        self._store: TensorStore | ContainerLog | None = None
        self._repr: torch.Tensor | None = None
        self._pending_batches: list[Batch] = []
        self._pending_len = 0

        self._init_remote()

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
        """The contents as one new container (``None`` before the first add, or a subclass's empty one).

        Order: ascending log-reward (ties oldest first) with ``prioritized_capacity``, else oldest
        first. Built on each access (O(N)); assigning a container replaces the contents.
        """
        if self._container_type is None:
            return self._empty()
        self._flush_pending()
        slots = self._ordered_slots()
        return self._gather(slots)

    @training_container.setter
    def training_container(self, container: Any) -> None:
        self.clear()
        if container is not None:
            self._local_add(container)
            self._flush_pending()

    def _empty(self) -> Any:
        """:attr:`training_container` before the first add."""
        return None

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
        if not is_container(training_container):
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

    def _check_type(self, container: Any) -> None:
        """Fix the container type on the first add; later, raise :class:`ContainerTypeError` for another."""
        if self._container_type is None:
            self._container_type = type(container)
            self._codec = codec_for(container, self.env)
            self._store = (
                ContainerLog(self.capacity) if self._codec is None else TensorStore(self.capacity, self._codec)
            )
            return
        ok = isinstance(container, self._container_type)
        if ok and self._codec is not None:
            ok = self._codec.matches(container)
        if not ok:
            raise ContainerTypeError(
                f"this buffer holds {self._container_type.__name__}, got {type(container).__name__}"
            )

    def _make_batch(self, container: Any, need_repr: bool = False) -> Batch:
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
            return Batch(n, fields, None, logr, repr_)
        repr_ = container_repr(container) if need_repr else None
        # index a copy: the log extends it, and must never extend the caller's object
        return Batch(n, None, container[torch.arange(n)], logr, repr_)

    def _local_add(self, training_container: Any) -> None:
        """Insert locally (the template hook subclasses override, as in torchgfn)."""
        self._check_type(training_container)
        with Timer(self.timing_data, "local_add/encode", self.timing):
            batch = self._make_batch(training_container, need_repr=self._needs_repr)
        self._queue_or_commit(batch)

    _needs_repr = False

    def _queue_or_commit(self, batch: Batch) -> None:
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

    def _commit(self, batch: Batch) -> None:
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

    def _write(self, batch: Batch) -> None:
        with Timer(self.timing_data, "local_add/extend", self.timing):
            if isinstance(self._store, TensorStore):
                self._store.check(batch.fields)
            self._table.extend(batch, priorities=batch.prio, timeout=0)

    def _on_write(self, slots: np.ndarray, batch: Batch) -> None:
        if isinstance(self._store, TensorStore):
            self._store.write(slots, batch.fields)
        else:
            self._store.write(slots, batch.container, self._live)
        self._live[slots] = True
        self._logr[slots] = np.nan if batch.logr is None else batch.logr
        self._prio[slots] = batch.prio
        self._seq[slots] = np.arange(self._next_seq, self._next_seq + len(slots))
        self._next_seq += len(slots)
        if batch.repr is not None:
            if self._repr is None or self._repr.shape[1:] != batch.repr.shape[1:]:
                self._repr = torch.zeros(
                    (self.capacity, *batch.repr.shape[1:]), dtype=batch.repr.dtype, device=batch.repr.device
                )
            self._repr[torch.from_numpy(slots).to(self._repr.device)] = batch.repr

    def _on_release(self, slots: np.ndarray) -> None:
        self._live[slots] = False

    def _fifo_slots(self, positions: np.ndarray | None = None) -> np.ndarray:
        """Slots of FIFO positions (0 = oldest; torchgfn's order: same seed, same samples); all when ``None``."""
        return self._table.remover.at(np.arange(len(self._table)) if positions is None else positions)

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
        return self._gather(self._live_slots()[idx] if self.prioritized_capacity else self._fifo_slots(idx))

    # -- persistence -----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the contents to one ``.pt`` file of tensors (torchgfn's container layout).

        The file also records the container kind, so :meth:`load` restores it on a fresh buffer;
        torchgfn's ``Container.load`` reads it too (it ignores the extra key). Nothing is
        written before the first add (as in torchgfn). The write is atomic (temporary + rename).

        Raises:
            TypeError: the stored container type has no tensor codec and no ``to_tensordict``.
        """
        if self._container_type is None:
            return
        save_container(path, self.training_container, self._codec, self._container_type)

    def load(self, path: str | os.PathLike) -> None:
        """Replace the contents with a file written by :meth:`save` (or by torchgfn's ``save``).

        Works on a fresh buffer too (torchgfn's silently does nothing there). Items beyond the
        capacity are dropped by the buffer's rule (lowest log-reward, or oldest).

        Raises:
            TypeError: the file holds a container type without a codec and this buffer does not
                hold that type.
            ValueError: a prioritized buffer and a file without log-rewards.
        """
        try:
            device = self.device
        except EmptyBufferError:
            device = getattr(self.env, "device", None)
        container = load_container(path, device, self.env, self._codec, self._container_type)
        self.clear()
        self._container_type = None
        self._check_type(container)
        self._queue_or_commit(self._make_batch(container, need_repr=self._needs_repr))
        self._flush_pending()  # (with lazy_sort: committed now all the same)

    # -- timing -------------------------------------------------------------------------------------
    def timing_log(self) -> str:
        """Timing totals, counts and means per key, plus the baseline-filtering counters."""
        extra = []
        if self.baseline_filtering:
            total = self._baseline_total
            kept = self._baseline_kept
            pct = 100.0 * (1 - kept / total) if total else 0.0
            extra.append(
                f"baseline filtering: kept {kept}/{total} ({pct:.1f}% filtered), "
                f"{self._baseline_skipped_sends} sends skipped entirely"
            )
        return format_timing(self.timing_data, extra)
