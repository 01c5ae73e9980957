"""Container handling of the torchgfn buffers: the errors for bad containers, and prepared batches.

A :class:`Batch` is what an ``add`` turns a container into before the buffer decides what to admit:
the encoded fields (container types with a codec) or a copy of the container, the log-rewards and
the priorities derived from them, and (for the diverse buffer) the vectors compared for diversity.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .codecs import flat_repr
from .containers import Container

FINITE_MAX = np.finfo(np.float64).max


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


class Batch:
    """A prepared batch: encoded fields (codec path) or a container, plus per-item metadata."""

    __slots__ = ("n", "fields", "container", "logr", "prio", "repr")

    def __init__(
        self,
        n: int,
        fields: dict[str, torch.Tensor] | None,
        container: Any,
        logr: np.ndarray | None,
        repr_: torch.Tensor | None,
    ) -> None:
        self.n = n
        self.fields = fields
        self.container = container
        self.logr = logr
        self.prio = np.zeros(n) if logr is None else np.clip(logr, -FINITE_MAX, FINITE_MAX)  # NaN rejected earlier
        self.repr = repr_

    def subset(self, idx: np.ndarray) -> Batch:
        """A new batch of the items at positions ``idx`` (in that order)."""
        t = torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64))
        if self.fields is not None:
            dev = next(iter(self.fields.values())).device
            fields = {k: v.index_select(0, t.to(dev)) for k, v in self.fields.items()}
            container = None
        else:
            fields = None
            container = self.container[t]
        return Batch(
            len(idx),
            fields,
            container,
            None if self.logr is None else self.logr[idx],
            None if self.repr is None else self.repr[t.to(self.repr.device)],
        )


_CONTAINER_TYPES: set[type] = set()


def is_container(obj: Any) -> bool:
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


def container_repr(container: Any) -> torch.Tensor:
    """Flattened terminating states (and conditions) of a contract-only container."""
    states = container.terminating_states
    tensor = states.tensor
    if not isinstance(tensor, torch.Tensor):
        raise ValueError("the diverse buffer needs terminating states held in a tensor")
    if tensor.shape[0] != len(container):
        raise ValueError("the diverse buffer needs one terminating state per item")
    return flat_repr(tensor, getattr(states, "conditions", None))
