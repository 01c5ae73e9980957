"""torchgfn buffers' files: a container as one ``.pt`` file of tensors, and back.

The layout is torchgfn's (its ``Container.load`` reads our files; we read its files), plus one
key, ``replaystore_kind``, naming the container kind so that a fresh buffer can load it. Files
are read with ``torch.load(weights_only=True)``: tensors only, no pickled code.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ...storage.diskspace import atomic_write
from .codecs import Codec, codec_by_kind, infer_file_kind

KIND_KEY = "replaystore_kind"


def save_container(path: str | os.PathLike, container: Any, codec: Codec | None, container_type: type) -> None:
    """Write ``container`` to ``path`` atomically (temporary file + rename).

    Raises:
        TypeError: no ``codec`` and the container has no ``to_tensordict``.
    """
    if codec is not None:
        raw = codec.to_file(container)
        kind = codec.kind
    elif hasattr(container, "to_tensordict"):
        raw = dict(container.to_tensordict().to_dict())
        kind = "object"
    else:
        raise TypeError(
            f"cannot save {container_type.__name__}: it has no tensor codec "
            "(TensorContainer, torchgfn containers, or a to_tensordict method)"
        )
    raw = {k: v for k, v in raw.items() if k not in ("log_probs", "estimator_outputs")}
    raw[KIND_KEY] = torch.tensor(list(kind.encode()), dtype=torch.uint8)
    atomic_write(path, lambda f: torch.save(raw, f))


def load_container(
    path: str | os.PathLike, device: Any, env: Any, codec: Codec | None, container_type: type | None
) -> Any:
    """The container a file written by :func:`save_container` (or torchgfn's ``save``) holds.

    ``codec`` and ``container_type`` are the loading buffer's (``None`` for a fresh buffer); the
    file's kind decides, else the buffer's, else the file's keys.

    Raises:
        TypeError: the file holds a container type without a codec and ``container_type`` cannot
            rebuild it (no ``from_tensordict``).
    """
    raw = torch.load(os.fspath(path), weights_only=True, map_location=device)
    kind_t = raw.pop(KIND_KEY, None)
    if kind_t is not None:
        kind = bytes(kind_t.tolist()).decode()
    elif codec is not None:
        kind = codec.kind
    elif container_type is not None:
        kind = "object"
    else:
        kind = infer_file_kind(raw)
    if kind == "object":
        if container_type is None or not hasattr(container_type, "from_tensordict"):
            raise TypeError(
                "this file holds a container type without a codec: load it into a buffer that already holds that type"
            )
        from tensordict import TensorDict

        return container_type.from_tensordict(env, TensorDict(raw, batch_size=[]))
    is_backward = bool(raw["is_backward"].item()) if "is_backward" in raw else False
    file_codec = codec if (codec is not None and codec.kind == kind) else codec_by_kind(kind, env, is_backward)
    return file_codec.from_file(raw)


__all__ = ["KIND_KEY", "load_container", "save_container"]
