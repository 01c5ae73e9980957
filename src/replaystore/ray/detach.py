"""``detach``: copy Ray-deserialized results so their NumPy arrays own writable memory.

NumPy arrays deserialized by Ray are read-only views of shared memory, and any view kept alive
pins the whole object in Ray's object store; the loaders' results are copied out once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


def detach(obj: Any) -> Any:
    """A copy of ``obj`` whose NumPy arrays own writable memory (dicts, lists, tuples, dataclasses)."""
    if isinstance(obj, np.ndarray):
        return np.array(obj, copy=True)
    if isinstance(obj, dict):
        return {k: detach(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [detach(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(detach(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: detach(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **fields)
    return obj


__all__ = ["detach"]
