"""Files for ``save_data`` / ``load_data``: a pickled list of the items held, written atomically."""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def dump_items(items: list, file_name: str | os.PathLike) -> None:
    """Pickle ``items`` to ``file_name`` through a temporary file and a rename (parents created)."""
    path = os.fspath(file_name)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ding-buffer-", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(list(items), f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


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
