"""The two torchgfn buffers with their own admission strategy, on :class:`ReplayBuffer`.

- :class:`NormBasedDiversePrioritizedReplayBuffer`: top-``capacity`` by log-reward, admitting only
  items far enough (p-norm) from what is stored and from each other.
- :class:`TerminatingStateBuffer`: keeps the terminating states of what is added.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .batch import Batch, UnsupportedContainer, container_repr
from .buffer import ReplayBuffer
from .codecs import TensorContainerCodec, codec_by_kind, codec_for
from .containers import TensorContainer
from .timing import Timer


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

    def __init__(
        self, env: Any, capacity: int = 1000, cutoff_distance: float = 0.0, p_norm_distance: float = 1.0, **kwargs: Any
    ) -> None:
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

    def _on_write(self, slots: np.ndarray, batch: Batch) -> None:
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
        return container_repr(container)

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
            super()._commit(batch)

    def _diverse_subset(self, batch: Batch) -> Batch | None:
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
        close = (
            (torch.cdist(xc.unsqueeze(0), xc.unsqueeze(0), p=self.p_norm_distance).squeeze(0) <= self.cutoff_distance)
            .cpu()
            .numpy()
        )
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
    Before the first add, ``training_container`` is an empty states container. Arguments: as
    :class:`~replaystore.compat.gfn.buffer.ReplayBuffer`'s.
    """

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
            kind, fields = codec.terminal_fields(codec.encode(container))
            return codec_by_kind(kind, self.env).decode(fields)
        states = container.terminating_states
        lr = container.log_rewards
        if lr is not None and len(lr) != len(states):
            raise UnsupportedContainer("TerminatingStateBuffer needs one log-reward per terminating state")
        return TensorContainer(states.tensor, lr, getattr(states, "conditions", None))

    def _local_add(self, training_container: Any) -> None:
        super()._local_add(self._to_states(training_container))
