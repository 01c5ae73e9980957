"""What a sample returns: the data plus the metadata of every sampled item, and its PyTorch form."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidArgument, InvalidType


@dataclass(frozen=True)
class Sample:
    """A batch drawn from a :class:`~replaystore.Table`.

    All metadata arrays have the batch length as their only axis; row ``i`` of each describes the
    item behind row ``i`` of ``data``.

    Attributes:
        data: the payload. A (nested) dict of arrays with the batch as leading axis for column
            storages; a list of objects for object storage.
        keys: int64 unique keys; pass them to ``update_priorities`` / ``delete``.
        indices: int64 storage slots the items were read from (slots are reused; keys are not).
        probabilities: float64 probability with which the sampler chose each item.
        weights: float64 importance-sampling weights, ``(N * P(i)) ** -beta / max_j w_j`` for the
            prioritized sampler; ones for the others.
        priorities: float64 priorities of the items at sampling time (1.0 for every item of a
            table that keeps no per-item priority: its sampler and remover read none, e.g.
            ``Uniform`` with ``Fifo``; see ``Table.update_priorities``).
        times_sampled: int64 count of samples of each item, including this one.
        versions: int64 model version the item was inserted with.
    """

    data: Any
    keys: np.ndarray
    indices: np.ndarray
    probabilities: np.ndarray
    weights: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray
    versions: np.ndarray

    @classmethod
    def build(cls, **fields: Any) -> "Sample":
        """The constructor minus the frozen-field checks, for hot paths: every field must be given."""
        sample = object.__new__(cls)
        sample.__dict__.update(fields)
        return sample

    def __len__(self) -> int:
        return int(self.keys.shape[0])


# -- PyTorch output ----------------------------------------------------------------------------------
# Here, beside Sample, so the Table can convert without importing the integrations
# (:mod:`replaystore.integrations.torch` re-exports them). What copies and what shares memory:
# :func:`sample_to_tensors`; ``pin_memory=True`` asks for page-locked memory (fast asynchronous
# host-to-device copies; skipped with a warning on a machine without an accelerator).


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ImportError("as_tensor=True needs PyTorch: pip install torch==2.13.0") from e
    return torch


def _pinning_available(torch) -> bool:
    return bool(torch.cuda.is_available()) or bool(
        getattr(torch, "accelerator", None) and torch.accelerator.is_available()
    )


def check_device(device: Any) -> None:
    """Raise before any work if tensors cannot be made on ``device``.

    Raises:
        ImportError: PyTorch is not installed.
        InvalidArgument: ``device`` is not a device name, or names an accelerator that is not
            available here (so a call that would fail after sampling fails before it instead).
    """
    torch = _torch()
    if device is None:
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise InvalidArgument(f"device {device!r} is not a torch device: {e}") from None
    if dev.type in ("cpu", "meta"):
        return
    backend = getattr(torch, dev.type, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        raise InvalidArgument(f"device {device!r} is not available on this machine")


def to_tensor(value: Any, device: Any = None, pin_memory: bool = False) -> Any:
    """Convert arrays (and nested dicts of arrays) to tensors; lists of objects are returned as is."""
    torch = _torch()
    if isinstance(value, dict):
        return {k: to_tensor(v, device, pin_memory) for k, v in value.items()}
    if not isinstance(value, np.ndarray):
        return value
    t = torch.from_numpy(value if value.flags.writeable else value.copy())
    if pin_memory:
        if _pinning_available(torch):
            t = t.pin_memory()
        else:
            warnings.warn("pin_memory=True ignored: no accelerator is available", RuntimeWarning, stacklevel=3)
    if device is not None and torch.device(device) != t.device:
        t = t.to(device, non_blocking=pin_memory)
    return t


def sample_to_tensors(sample: Sample, device: Any = None, pin_memory: bool = False) -> Sample:
    """A new :class:`Sample` whose data and metadata arrays are torch tensors.

    On the CPU without pinning the tensors share memory with the sample's arrays (no copy:
    ``torch.from_numpy``); pinning or another ``device`` copies.
    """
    torch = _torch()
    pin = pin_memory and _pinning_available(torch)
    if pin_memory and not pin:
        warnings.warn("pin_memory=True ignored: no accelerator is available", RuntimeWarning, stacklevel=2)
    fields = {f.name: to_tensor(getattr(sample, f.name), device, pin) for f in dataclasses.fields(sample)}
    return Sample(**fields)


def sample_to_tensordict(sample: Sample, device: Any = None) -> Any:
    """The sample as a ``tensordict.TensorDict`` (data fields plus ``keys``, ``weights``, ...).

    Raises ImportError when ``tensordict`` is not installed.
    """
    from tensordict import TensorDict

    s = sample_to_tensors(sample, device)
    if not isinstance(s.data, dict):
        raise InvalidType("TensorDict output needs a column storage (dict of arrays)")
    meta = {f.name: getattr(s, f.name) for f in dataclasses.fields(s) if f.name != "data"}
    return TensorDict({**s.data, **meta}, batch_size=[len(sample)], device=device)


def drawn_sample(
    data: Any,
    slots: np.ndarray,
    probabilities: np.ndarray,
    weights: np.ndarray | None,
    rows: np.ndarray,
    as_tensor: bool = False,
    device: Any = None,
    pin_memory: bool = False,
) -> Sample:
    """The :class:`Sample` of a draw (``Table._draw``'s results; ``weights`` ``None``: all ones).

    Its metadata columns are views of ``rows`` (the sample's own copy of the items' metadata rows).
    """
    sample = Sample.build(
        data=data,
        keys=rows[:, 0],  # (sample rows: rows.ROW_KEY .. ROW_PRIORITY)
        indices=slots,
        probabilities=probabilities,
        weights=np.ones(len(slots)) if weights is None else weights,
        priorities=rows.view(np.float64)[:, 3],
        times_sampled=rows[:, 1],
        versions=rows[:, 2],
    )
    if as_tensor:
        return sample_to_tensors(sample, device=device, pin_memory=pin_memory)
    return sample
