"""A PyTorch ``IterableDataset`` of replay samples, for ``torch.utils.data.DataLoader``.

Each element the dataset yields is **one whole batch** (the table samples batches; DataLoader must
not re-batch them): use ``DataLoader(dataset, batch_size=None)``, or :func:`replay_loader`, which
sets that and checks the worker configuration up front.

```python
ds = ReplayDataset(table, batch_size=256, max_batches=10_000)
loader = replay_loader(ds, pin_memory=True)                # num_workers=0: a prefetch thread
for batch in loader:
    loss = td_loss(batch["data"]["obs"], ...)              # tensors (views of the sampled arrays)
    table.update_priorities(batch["keys"], new_priorities) # or ds.update_priorities(...)
```

An element is a dict: ``"data"`` (the sample's data, arrays turned into tensors, nested dicts
kept) and the metadata of :class:`~replaystore.Sample` as tensors (:func:`sample_to_batch`).

Sources: an in-process Table or :class:`~replaystore.MixedSampler` with ``num_workers=0`` (a
prefetch thread, :class:`~replaystore.prefetch.SampleIterator`), or a Ray client with any
``num_workers`` (spawned workers connecting to the same service by name: the client is not
pickled, its connection details are). Which source works where and why, ``max_batches`` over
workers and ``pin_memory``: docs/data.md, "PyTorch DataLoader".
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import InvalidArgument, InvalidType
from ..items import Sample
from ..mixing import MixedSample, MixedSampler
from ..prefetch import SampleIterator
from ..table import Table
from ..table.args import as_count

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("replaystore.integrations.dataloader needs PyTorch: pip install torch==2.13.0") from e


class WorkerSourceError(InvalidArgument):
    """The dataset's source cannot be used in this DataLoader worker (docs/data.md, "PyTorch DataLoader")."""


def _tensors(value: Any, shared: bool = False) -> Any:
    if isinstance(value, dict):
        return {k: _tensors(v, shared) for k, v in value.items()}
    if isinstance(value, np.ndarray) and value.dtype != object:
        if shared:
            # in a worker process: one copy straight into shared memory, which DataLoader's queue
            # then passes by handle (else: a copy to make Ray's read-only array writable, and a
            # second one when the queue moves the tensor to shared memory)
            t = torch.from_numpy(np.empty(0, dtype=value.dtype)).new_empty(value.shape).share_memory_()
            t.numpy()[...] = value
            return t
        return torch.from_numpy(value if value.flags.writeable else value.copy())
    return value


def sample_to_batch(sample: Sample | MixedSample, shared: bool = False) -> dict[str, Any]:
    """A sample as the dict of tensors the dataset yields (no copy of writable arrays).

    ``shared``: allocate each tensor in shared memory and copy into it once (for worker processes).
    """
    return {f.name: _tensors(getattr(sample, f.name), shared) for f in dataclasses.fields(sample)}


def _share(total: int | None, worker: int, workers: int) -> int | None:
    if total is None:
        return None
    return total // workers + (1 if worker < total % workers else 0)


class ReplayDataset(IterableDataset):
    """Batches sampled from a Table or a Ray replay service, as an ``IterableDataset``.

    Args:
        source: a :class:`~replaystore.Table` or a :class:`~replaystore.MixedSampler`
            (``num_workers=0`` only), or a :class:`replaystore.ray.ReplayClient` (any
            ``num_workers``).
        batch_size: items per yielded batch.
        max_batches: total batches over all workers (``None``: endless).
        prefetch: batches drawn ahead per worker (a thread for a Table, sample calls in flight
            for a client); ``>= 1``.
        timeout: seconds one sample may wait for the rate limiter (``None``: the source's default);
            a sample that waits longer raises :class:`~replaystore.Timeout` out of the loader.

    Raises:
        InvalidType: ``source`` is neither a Table nor a ReplayClient.
        InvalidArgument: ``batch_size``, ``prefetch`` or ``max_batches`` out of range.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int,
        max_batches: int | None = None,
        prefetch: int = 2,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        self.batch_size = as_count(batch_size, "batch_size")
        self.prefetch = as_count(prefetch, "prefetch")
        if max_batches is not None and int(max_batches) < 0:
            raise InvalidArgument(f"max_batches must be >= 0 or None, got {max_batches}")
        self.max_batches = None if max_batches is None else int(max_batches)
        self.timeout = timeout
        self._owner_pid = os.getpid()
        if isinstance(source, MixedSampler):
            source = _MixedSource(source)
        if isinstance(source, (Table, _MixedSource)):
            self.table: Any = source
            self._client = None
            self._connect: dict | None = None
        elif _is_client(source):
            ray = _ray()
            ctx = ray.get_runtime_context()
            self.table = None
            self._client = source
            self._address = ctx.gcs_address
            self._connect = dict(  # connect()'s arguments
                name=source.name,
                table=source.table_name,
                namespace=ctx.namespace,
                default_timeout=source.default_timeout,
                rpc_grace=source.rpc_grace,
            )
        else:
            raise InvalidType(
                f"source must be a replaystore Table, MixedSampler or replaystore.ray ReplayClient, "
                f"got {type(source).__name__}"
            )

    @property
    def uses_ray(self) -> bool:
        """Whether the source is a Ray replay service (usable from worker processes)."""
        return self._connect is not None

    # -- pickling into workers: a client travels as its connection details ---------------------------
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if state.get("table") is not None:
            # a Table (its lock, its thread-bound state) cannot be shared with a worker process
            state["table"] = None
            state["_table_lost"] = True
        state["_client"] = None
        return state

    def _source_client(self) -> Any:
        if self._client is not None and os.getpid() == self._owner_pid:
            return self._client
        ray = _ray()
        c = self._connect
        if ray.is_initialized():
            if os.getpid() != self._owner_pid and getattr(self, "_initialized_pid", None) != os.getpid():
                raise WorkerSourceError(
                    "a forked DataLoader worker cannot use Ray: start workers with "
                    "multiprocessing_context='spawn' (replay_loader does)"
                )
        else:
            ray.init(
                address=self._address,
                namespace=c["namespace"],
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
            self._initialized_pid = os.getpid()
        from ..ray.client import connect

        self._client = connect(**c)
        return self._client

    # -- iteration -----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yield batches (dicts of tensors); workers and ``max_batches``: docs/data.md, "PyTorch DataLoader".

        Raises:
            WorkerSourceError: a Table source in a worker process, or Ray in a forked worker.
        """
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        count = _share(self.max_batches, worker, workers)
        if self._connect is None:
            if info is not None or getattr(self, "_table_lost", False):
                raise WorkerSourceError(
                    "an in-process Table cannot be sampled from DataLoader worker processes (each would "
                    "sample a stale copy); use num_workers=0 (a prefetch thread), or serve the table "
                    "with replaystore.ray and pass its client"
                )
            return self._iter_table(count)
        return self._iter_client(count)

    def _iter_table(self, count: int | None) -> Iterator[dict[str, Any]]:
        if count == 0:
            return
        with SampleIterator(
            self.table, self.batch_size, prefetch=self.prefetch, timeout=self.timeout, max_batches=count
        ) as it:
            for sample in it:
                yield sample_to_batch(sample)

    def _iter_client(self, count: int | None) -> Iterator[dict[str, Any]]:
        if count == 0:
            return
        client = self._source_client()
        shared = get_worker_info() is not None
        for sample in client.iterate(self.batch_size, prefetch=self.prefetch, timeout=self.timeout, max_batches=count):
            yield sample_to_batch(sample, shared)

    def update_priorities(self, keys: Any, priorities: Any) -> Any:
        """Forward a priority update to the source (``keys`` may be a tensor); return how many applied.

        For a :class:`~replaystore.MixedSampler` source pass the yielded batch instead of ``keys``
        (its ``source`` rows route each priority); the result is then ``{name: applied}``.
        """
        priorities = priorities.detach().cpu().numpy() if isinstance(priorities, torch.Tensor) else priorities
        if isinstance(self.table, _MixedSource):
            return self.table.update_priorities(keys, priorities)
        keys = keys.numpy() if isinstance(keys, torch.Tensor) else keys
        if self.table is not None:
            return self.table.update_priorities(keys, priorities)
        return self._source_client().update_priorities(keys, priorities)


def replay_loader(
    dataset: ReplayDataset, num_workers: int = 0, pin_memory: bool = False, **loader_kwargs: Any
) -> DataLoader:
    """A ``DataLoader`` over ``dataset`` with ``batch_size=None`` (elements are whole batches).

    With ``num_workers > 0`` the source must be a Ray client, and workers are spawned
    (``multiprocessing_context="spawn"``, ``persistent_workers`` left to the caller).
    Other keyword arguments go to ``DataLoader`` (``prefetch_factor``, ``timeout``, ...).

    Raises:
        WorkerSourceError: ``num_workers > 0`` with a Table source, or an explicit ``fork`` context.
    """
    if num_workers > 0:
        if not dataset.uses_ray:
            raise WorkerSourceError(
                f"num_workers={num_workers} needs a Ray client source: an in-process Table cannot be "
                "shared with worker processes (use num_workers=0, which prefetches in a thread)"
            )
        ctx = loader_kwargs.setdefault("multiprocessing_context", "spawn")
        if ctx == "fork" or getattr(ctx, "get_start_method", lambda: None)() == "fork":
            raise WorkerSourceError("Ray cannot be used from forked workers: use 'spawn' or 'forkserver'")
    return DataLoader(dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory, **loader_kwargs)


class _MixedSource:
    """A :class:`~replaystore.MixedSampler` with the ``sample``/``name`` a SampleIterator draws from."""

    def __init__(self, mix: MixedSampler) -> None:
        self.mix = mix
        self.name = "mixed:" + "+".join(mix.names)

    def sample(self, batch_size: int, timeout: float | None = None, **_tensor_options: Any) -> MixedSample:
        return self.mix.sample(batch_size, timeout=timeout)

    def update_priorities(self, batch: Mapping[str, Any], priorities: Any) -> dict[str, int]:
        if not isinstance(batch, Mapping) or "source" not in batch:
            raise InvalidArgument("with a MixedSampler source, pass the yielded batch (it holds each row's source)")
        return self.mix.update_priorities(batch, priorities)


def _ray() -> Any:
    from ..ray import import_ray

    return import_ray()


def _is_client(source: Any) -> bool:
    if type(source).__name__ != "ReplayClient":
        return False
    from ..ray.client import ReplayClient

    return isinstance(source, ReplayClient)
