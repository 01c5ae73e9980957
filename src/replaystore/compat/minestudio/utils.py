"""MineStudio's nested-data helpers (``minestudio.online.utils``): stack, to torch, to NumPy.

They walk dicts, lists and tuples recursively, as MineStudio's do; torch is imported only when a
tensor is met or asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def auto_stack(elems: list[Any]) -> Any:
    """Stack a list of same-shaped nested items along a new first axis.

    ndarray -> ``np.stack``; tensor -> ``torch.stack``; dict (any mapping) -> per key of the
    first element; list -> per index; int/float/bool/NumPy scalar -> ``np.array``; str and any other
    type (dataclasses, ...) -> the list unchanged.
    """
    if len(elems) == 0:
        return elems
    first = elems[0]
    if isinstance(first, np.ndarray):
        return np.stack(elems)
    if _is_tensor(first):
        import torch

        return torch.stack(elems)
    if isinstance(first, str):
        return elems
    if isinstance(first, Mapping) or _is_dictconfig(first):
        return {k: auto_stack([e[k] for e in elems]) for k in first}
    if isinstance(first, list):
        return [auto_stack([e[i] for e in elems]) for i in range(len(first))]
    if isinstance(first, (bool, int, float, np.number, np.bool_)):
        return np.array(elems)
    return elems


def _is_dictconfig(x: Any) -> bool:
    return type(x).__name__ == "DictConfig"


def auto_to_torch(data: Any, device: Any = None) -> Any:
    """NumPy arrays (nested in dicts, lists, tuples) to torch tensors on ``device``.

    Writable arrays are wrapped without a copy on the CPU (``torch.from_numpy``); read-only ones
    are copied. Tensors are moved; other values are returned unchanged.
    """
    import torch

    if isinstance(data, np.ndarray):
        t = torch.from_numpy(data) if data.flags.writeable and data.dtype != np.object_ else torch.tensor(data)
        return t.to(device) if device is not None else t
    if isinstance(data, torch.Tensor):
        return data.to(device) if device is not None else data
    if isinstance(data, Mapping):
        return {k: auto_to_torch(v, device) for k, v in data.items()}
    if isinstance(data, list):
        return [auto_to_torch(v, device) for v in data]
    if isinstance(data, tuple):
        return tuple(auto_to_torch(v, device) for v in data)
    return data


def auto_to_numpy(data: Any) -> Any:
    """Torch tensors (nested in dicts and lists) to NumPy arrays on the CPU; others unchanged."""
    if _is_tensor(data):
        return data.detach().cpu().numpy()
    if isinstance(data, Mapping):
        return {k: auto_to_numpy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [auto_to_numpy(v) for v in data]
    return data
