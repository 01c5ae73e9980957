"""Containers on the wire: a small header plus one array per field, never a pickled container.

``to_wire`` gives ``{"kind", "is_backward", "n", "fields": {name: numpy array}}`` for the types with
a codec (Ray moves the arrays through its object store, out of band); a container type without a
codec travels as ``{"kind": "object", "obj": container}``, pickled by the transport.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .codecs import codec_by_kind, codec_for


def encode(container: Any, env: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """The header ``{"kind", "is_backward", "n"}`` and the CPU tensors of a container; ``None`` without a codec."""
    codec = codec_for(container, env)
    if codec is None:
        return None
    header = {"kind": codec.kind, "is_backward": bool(getattr(codec, "is_backward", False)), "n": len(container)}
    return header, {name: t.detach().cpu() for name, t in codec.encode(container).items()}


def to_wire(container: Any, env: Any) -> dict[str, Any]:
    """Encode a container for a transport (the arrays share memory with CPU tensors)."""
    encoded = encode(container, env)
    if encoded is None:
        return {"kind": "object", "n": len(container), "obj": container}
    header, tensors = encoded
    fields = {}
    for name, t in tensors.items():
        try:
            fields[name] = t.numpy()
        except TypeError:  # dtypes NumPy lacks (bfloat16): let the transport pickle the tensor
            fields[name] = t
    return {**header, "fields": fields}


def wire_nbytes(wire: dict[str, Any]) -> int:
    """Payload size of a wire message (0 for pickled objects)."""
    return sum(
        int(a.nbytes) if isinstance(a, np.ndarray) else a.numel() * a.element_size()
        for a in wire.get("fields", {}).values()
    )


def _tensor(a: Any, device: Any) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        t = a
    else:
        # arrays from an object store are read-only views of shared memory: copy once
        t = torch.from_numpy(a if a.flags.writeable else np.array(a))
    return t if device is None else t.to(device)


def from_wire(wire: dict[str, Any], env: Any) -> Any:
    """Rebuild the container of a wire message (tensors on ``env.device`` when there is one)."""
    if wire["kind"] == "object":
        return wire["obj"]
    codec = codec_by_kind(wire["kind"], env, bool(wire.get("is_backward", False)))
    device = getattr(env, "device", None)
    return codec.decode({name: _tensor(a, device) for name, a in wire["fields"].items()})
