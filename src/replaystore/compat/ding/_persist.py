"""DI-engine's persistence formats: item files and the per-slot part of a state dict.

``save_data`` / ``load_data`` files are a pickled list of the items held, written atomically.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...storage.diskspace import atomic_write

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def dump_items(items: list, file_name: str | os.PathLike) -> None:
    """Pickle ``items`` to ``file_name`` through a temporary file and a rename (parents created)."""
    path = os.fspath(file_name)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    atomic_write(path, lambda f: pickle.dump(list(items), f, protocol=pickle.HIGHEST_PROTOCOL))


def load_items(file_name: str | os.PathLike) -> list:
    """The items of a file written by :func:`dump_items`, or of DI-engine's hickle dump.

    Unpickling runs code chosen by whoever wrote the file: load only files you trust. A hickle
    (HDF5) file needs the ``hickle`` package; its empty slots (``None``) are dropped.
    """
    path = os.fspath(file_name)
    with open(path, "rb") as f:
        head = f.read(len(_HDF5_MAGIC))
    if head == _HDF5_MAGIC:
        try:
            import hickle  # type: ignore[import-not-found]
        except ImportError as exc:
            raise ImportError(f"{path} is a hickle (HDF5) file; install hickle to read it") from exc
        data: Any = hickle.load(path)
    else:
        with open(path, "rb") as f:
            data = pickle.load(f)  # noqa: S301 - documented: trusted files only
    if not isinstance(data, (list, tuple)):
        raise ValueError(f"{path} holds a {type(data).__name__}, expected a list of items")
    return [d for d in data if d is not None]


def slot_state(state: Mapping, data: list) -> tuple[np.ndarray, np.ndarray]:
    """Check a state dict's ``data`` (its slots: dicts or ``None``) and read its per-slot state.

    Returns ``(use_count, retired)``: int64 and bool arrays of ``len(data)`` (``use_count`` may be
    a list or DI-engine's ``{slot: count}`` dict; missing keys mean 0 and no flag).

    Raises:
        TypeError: a slot holds something other than a dict or ``None``.
    """
    n = len(data)
    for i, d in enumerate(data):
        if d is not None and not isinstance(d, dict):
            raise TypeError(f"slot {i} holds a {type(d).__name__}, expected a dict or None")
    use = state.get("use_count", None)
    if isinstance(use, Mapping):
        use = [use.get(i, 0) for i in range(n)]
    use_arr = np.zeros(n, dtype=np.int64) if use is None else np.asarray(use, dtype=np.int64).reshape(n)
    retired = np.asarray(state.get("retired", np.zeros(n, bool)), dtype=bool).reshape(n)
    return use_arr, retired
