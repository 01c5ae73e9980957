"""The remote path of the torchgfn buffers: sending batches to a :class:`ReplayBufferManager`.

:class:`RemotePath` is a mixin of :class:`~replaystore.compat.gfn.buffer.ReplayBuffer`; what it
sends and when: docs/compat/gfn.md, "The remote buffer" (trainer side). Names are torchgfn's.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from .batch import UnsupportedContainer
from .codecs import codec_by_kind, codec_for
from .store import clear_stale_fields, concat_fields
from .timing import Timer


class RemotePath:
    """The remote half of a buffer: the state and the calls that talk to a manager.

    The buffer's ``__init__`` sets the configuration (``remote_manager``, ``remote_buffer_freq``,
    ``communication_backend``, ``async_score``, ``baseline_filtering``, ``scoring_only``,
    ``baseline_refresh_after``, ``remote_timeout``, ``ray_namespace``, ``env``, ``timing``,
    ``timing_data``) and calls :meth:`_init_remote`. Not thread-safe (neither is the buffer).
    """

    remote_manager: Any
    remote_buffer_freq: int
    communication_backend: str
    async_score: bool
    baseline_filtering: bool
    scoring_only: bool
    baseline_refresh_after: int
    remote_timeout: float
    ray_namespace: str | None
    env: Any
    timing: bool
    timing_data: dict[str, list[float]]

    def _init_remote(self) -> None:
        """The remote state (torchgfn's names where they exist)."""
        self.pending_container: Any = None
        self._add_counter = 0
        self._pending_score = False
        self._transport: Any = None
        self._baseline_log_reward = -math.inf
        self._baseline_total = 0
        self._baseline_kept = 0
        self._baseline_skipped_sends = 0
        self._consecutive_filtered_empty = 0

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
            fields = concat_fields([codec.encode(c) for c in containers], codec)
            return codec.decode(fields)
        merged = containers[0][torch.arange(len(containers[0]))]
        for c in containers[1:]:
            merged.extend(c)
        clear_stale_fields(merged)
        return merged

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
        self._baseline_total += n
        if self._baseline_log_reward == -math.inf or lr is None:
            self._baseline_kept += n
            return container
        mask = lr >= self._baseline_log_reward
        kept = int(mask.sum())
        if kept == 0:
            self._baseline_skipped_sends += 1
            self._consecutive_filtered_empty += 1
            if self._consecutive_filtered_empty < self.baseline_refresh_after:
                return None
            kept = n  # the refresh: this batch goes whole
        self._consecutive_filtered_empty = 0
        self._baseline_kept += kept
        return container if kept == n else container[torch.where(mask)[0]]

    def _prepare_for_remote(self, container: Any) -> Any:
        """With ``scoring_only``: a states container of terminating states and log-rewards."""
        if not self.scoring_only:
            return container
        if not self._per_item_rewards(container):
            raise UnsupportedContainer("scoring_only supports Trajectories or StatesContainer only")
        codec = codec_for(container, self.env)
        if codec is None:
            return container
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
            warnings.warn(
                f"no score from the replay buffer manager within {timeout_sec}s; dropped", RuntimeWarning, stacklevel=2
            )
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
