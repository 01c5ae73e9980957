"""The container contract (:class:`Container`), and a minimal built-in container that satisfies it.

The buffers accept torchgfn's ``Trajectories``, ``Transitions`` and ``StatesContainer`` (when
torchgfn is installed) and any object with :class:`Container`'s members; :class:`TensorContainer`
lets the module work, and be tested, without torchgfn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Container(Protocol):
    """What a replay buffer needs from the objects it stores (structural type, as in torchgfn)."""

    def __getitem__(self, idx: Any) -> Any:
        """A new container holding the items ``idx``."""

    def extend(self, other: Any) -> None:
        """Append ``other``'s items in place."""

    def __len__(self) -> int:
        """Number of items."""

    @property
    def log_rewards(self) -> torch.Tensor | None:
        """Per-item log-rewards, shape ``(len(self),)``, or ``None``."""

    @property
    def terminating_states(self) -> Any:
        """The items' terminating states (``.tensor`` and optional ``.conditions``)."""


class TensorStates:
    """A batch of states as a plain tensor: ``tensor`` of shape ``(n, *state_shape)``.

    ``conditions`` (``(n, condition_dim)`` or ``None``) are the conditioning vectors of a
    conditional GFlowNet, as on torchgfn's ``States``.
    """

    def __init__(self, tensor: torch.Tensor, conditions: torch.Tensor | None = None) -> None:
        self.tensor = tensor
        self.conditions = conditions

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """``(n,)``."""
        return (int(self.tensor.shape[0]),)

    @property
    def device(self) -> torch.device:
        """The device of the tensor."""
        return self.tensor.device

    def __len__(self) -> int:
        return int(self.tensor.shape[0])

    def __getitem__(self, idx: Any) -> TensorStates:
        idx = _normalize_index(idx)
        cond = None if self.conditions is None else self.conditions[idx]
        return TensorStates(self.tensor[idx], cond)

    def __repr__(self) -> str:
        return f"TensorStates(n={len(self)}, shape={tuple(self.tensor.shape[1:])})"


_OPTIONAL = ("log_rewards", "conditions", "log_probs", "estimator_outputs")


class TensorContainer:
    """A minimal container: one terminating state per item, plus optional per-item tensors.

    Args:
        states: ``(n, *state_shape)`` tensor of terminating states.
        log_rewards: optional ``(n,)`` floating tensor.
        conditions: optional ``(n, condition_dim)`` tensor (conditional GFlowNets).
        log_probs: optional ``(n, ...)`` tensor; a replay buffer drops it (it goes stale).
        estimator_outputs: optional ``(n, ...)`` tensor; dropped by a replay buffer too.
        **extra: any other per-item tensors (leading axis ``n``), e.g. ``actions``.

    Indexing returns a new container; :meth:`extend` appends in place and, like torchgfn's
    containers, keeps an optional field only when both sides have it.
    """

    def __init__(
        self,
        states: torch.Tensor,
        log_rewards: torch.Tensor | None = None,
        conditions: torch.Tensor | None = None,
        log_probs: torch.Tensor | None = None,
        estimator_outputs: torch.Tensor | None = None,
        **extra: torch.Tensor,
    ) -> None:
        if not isinstance(states, torch.Tensor) or states.ndim < 1:
            raise TypeError("states must be a tensor with a leading batch axis")
        n = int(states.shape[0])
        self.states = states
        self.log_rewards_ = log_rewards
        self.conditions = conditions
        self.log_probs = log_probs
        self.estimator_outputs = estimator_outputs
        self.extra: dict[str, torch.Tensor] = dict(extra)
        for name, t in self._fields().items():
            if t.shape[:1] != (n,):
                raise ValueError(f"field {name!r} has leading size {tuple(t.shape[:1])}, expected ({n},)")
        if log_rewards is not None and (log_rewards.shape != (n,) or not log_rewards.is_floating_point()):
            raise ValueError(f"log_rewards must be a floating tensor of shape ({n},), got {tuple(log_rewards.shape)}")

    # -- the contract -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.states.shape[0])

    @property
    def log_rewards(self) -> torch.Tensor | None:
        """Per-item log-rewards ``(n,)`` or ``None``."""
        return self.log_rewards_

    @log_rewards.setter
    def log_rewards(self, value: torch.Tensor | None) -> None:
        self.log_rewards_ = value

    @property
    def terminating_states(self) -> TensorStates:
        """The states (every item is terminating), with their conditions."""
        return TensorStates(self.states, self.conditions)

    @property
    def device(self) -> torch.device:
        """The device of the states."""
        return self.states.device

    def __getitem__(self, idx: Any) -> TensorContainer:
        idx = _normalize_index(idx)
        fields = {name: t[idx] for name, t in self._fields().items()}
        return TensorContainer(**fields)

    def extend(self, other: TensorContainer) -> None:
        """Append ``other``'s items; optional fields survive only if both sides have them."""
        if len(other) == 0:
            return
        if len(self) == 0:
            self._assign(other._fields())
            return
        theirs = other._fields()  # (both have states: the constructor requires them)
        self._assign({k: torch.cat((t, theirs[k]), dim=0) for k, t in self._fields().items() if k in theirs})

    def sample(self, n_samples: int) -> TensorContainer:
        """Up to ``n_samples`` items drawn uniformly without replacement."""
        return self[torch.randperm(len(self))[:n_samples]]

    # -- tensors in and out ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, torch.Tensor]:
        """The container as a flat dict of tensors (``extra`` fields under their own names)."""
        return self._fields()

    @classmethod
    def from_dict(cls, fields: Mapping[str, torch.Tensor]) -> TensorContainer:
        """Rebuild a container from :meth:`to_dict` output."""
        return cls(**dict(fields))

    def __repr__(self) -> str:
        names = sorted(k for k in self._fields() if k != "states")
        return f"TensorContainer(n={len(self)}, state_shape={tuple(self.states.shape[1:])}, fields={names})"

    # -- helpers ----------------------------------------------------------------------------------
    def _fields(self) -> dict[str, torch.Tensor]:
        out = {"states": self.states}
        for name in _OPTIONAL:
            value = self.log_rewards_ if name == "log_rewards" else getattr(self, name)
            if value is not None:
                out[name] = value
        out.update(self.extra)
        return out

    def _assign(self, fields: dict[str, torch.Tensor]) -> None:
        fields = dict(fields)
        self.states = fields.pop("states")
        for name in _OPTIONAL:
            setattr(self, "log_rewards_" if name == "log_rewards" else name, fields.pop(name, None))
        self.extra = fields


def _normalize_index(idx: Any) -> Any:
    """Turn an int into a one-element list (so indexing keeps the batch axis), lists into tensors."""
    if isinstance(idx, int):
        return [idx]
    if isinstance(idx, (list, tuple)) and not isinstance(idx, torch.Tensor):
        return torch.as_tensor(list(idx))
    return idx


def make_tensor_container(
    states: Iterable | torch.Tensor, log_rewards: Iterable | torch.Tensor | None = None, **fields: Any
) -> TensorContainer:
    """Convenience constructor from tensors or nested lists (floats become the default dtype)."""
    s = states if isinstance(states, torch.Tensor) else torch.as_tensor(states)
    lr = None
    if log_rewards is not None:
        lr = log_rewards if isinstance(log_rewards, torch.Tensor) else torch.as_tensor(log_rewards)
        lr = lr.to(torch.get_default_dtype()) if not lr.is_floating_point() else lr
    tensors = {k: (v if isinstance(v, torch.Tensor) else torch.as_tensor(v)) for k, v in fields.items()}
    return TensorContainer(s, lr, **tensors)
