"""Rows of a TorchRL storage's tensors gathered (or written) in one compiled call: the fast paths' copies.

A :class:`RowPlan` describes one stored ``TensorDict`` (nested allowed) or tuple/list of tensors:
its leaves, their addresses and row sizes, and how to rebuild the container around fresh output
tensors. :meth:`RowPlan.gather` returns what ``storage[index]`` returns for a 1-D ``int64`` index
of rows inside the storage (``TensorDict`` indexing, ``index_select``): same keys (in the same
order), nested batch sizes, dtypes, shapes, values and device, each leaf a new contiguous tensor
of its own. All leaves are copied by one call of the C module ``_native`` (rows of every leaf per
index, cache misses overlapped), which is why a plan exists only where that module is built.

A plan is checked before every use (:meth:`RowPlan.valid`): the same stored object, every level's
dict holding the same leaf objects and no others, every leaf at the address it had when the plan was made (a
plan is remade, with all its checks, when not: e.g. after a ``load_state_dict`` that replaced the
stored tensors). Leaves that are not plain contiguous CPU tensors (``MemoryMappedTensor`` counts as
one), non-tensor data, lazy stacks, tensorclasses or dimension names give no plan (None): the
callers then take the general path. Not thread-safe: callers hold TorchRL's buffer locks.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tensordict import MemoryMappedTensor, TensorDict

try:  # (optional, built by setup.py)
    from . import _native
except ImportError:  # pragma: no cover - no compiler at install time
    _native = None

__all__ = ["RowPlan", "leaf_ok", "make_plan"]

_PLAIN = (torch.Tensor, MemoryMappedTensor)
_CPU = torch.device("cpu")
_DATA_PTR = torch.Tensor.data_ptr  # (map over the leaves: a third less than a generator of method calls)
_new_td = TensorDict.__new__
_HAS_MPS = torch.backends.mps.is_available()  # (what _new_unsafe caches in each TensorDict with a device)


def _direct(entries: dict, shape: torch.Size, device: torch.device | None) -> TensorDict:
    """``TensorDict._new_unsafe(entries, batch_size=shape, device=device, nested=False)`` by its attribute writes only.

    (``entries``: a plain dict of checked values; ``device``: None or a ``torch.device``.) The
    steps ``_new_unsafe`` takes outside ``torch.compile`` for these arguments, without its copy of
    the dict, its device conversion and its ``torch.backends.mps.is_available()`` per object (the
    largest part of its cost); used only where :func:`_direct_ok` found both build the same object.
    """
    td = _new_td(TensorDict)
    if device is not None:
        td._has_mps_val = _HAS_MPS
    td._device = device
    td._tensordict = entries
    td._batch_size = shape
    td._td_dim_names = None
    return td


def _unsafe(entries: dict, shape: torch.Size, device: torch.device | None) -> TensorDict:
    return TensorDict._new_unsafe(entries, batch_size=shape, device=device, nested=False)


def _direct_ok() -> bool:
    """Whether :func:`_direct` builds what ``_new_unsafe`` builds (same attributes and values) in this tensordict."""
    try:
        leaf = torch.zeros(2, 3)
        for device in (None, _CPU):
            a = _unsafe({"x": leaf}, torch.Size((2,)), device)
            b = _direct({"x": leaf}, torch.Size((2,)), device)
            if type(a._tensordict) is not dict or list(vars(a)) != list(vars(b)):
                return False
            if any(k != "_tensordict" and getattr(a, k) != getattr(b, k) for k in vars(a)):
                return False
            if a["x"] is not b["x"] or a.batch_size != b.batch_size or a.device != b.device:
                return False
        return True
    except Exception:  # noqa: BLE001 - any difference: TensorDict's own constructor
        return False


#: the builder of the gathered ``TensorDict`` s (:func:`_direct` where it is equivalent)
_build_td = _direct if _direct_ok() else _unsafe


def leaf_ok(value: Any, min_ndim: int = 1) -> bool:
    """Whether ``value`` is a plain contiguous CPU tensor (or memmap) of ``min_ndim`` or more dims, needing no grad."""
    return (
        type(value) in _PLAIN
        and value.device.type == "cpu"
        and value.layout == torch.strided
        and value.ndim >= min_ndim
        and value.is_contiguous()
        and not value.requires_grad
        and not value.is_conj()
        and not value.is_neg()
        and not value.is_quantized
    )


class RowPlan:
    """The leaves of one stored container and how to rebuild it around gathered rows (module doc)."""

    __slots__ = (
        "_build",
        "_checks",
        "_protos",
        "_ptrs",
        "_rowbytes",
        "_shapes",
        "_sizes",
        "_tail",
        "cap",
        "leaves",
        "paths",
        "root",
    )

    def __init__(
        self, root: Any, leaves: list, paths: list, checks: list, levels: list, build: Any, tail: torch.Size
    ) -> None:
        self.root = root
        self._tail = tail
        #: the gathered leaves (stored tensors) and their key paths (``()``-rooted tuples; indices for sequences)
        self.leaves = tuple(leaves)
        self.paths = tuple(paths)
        self._checks = tuple(checks)
        self._sizes = tuple((d, len(d)) for d in levels)
        self._build = build
        self._ptrs = tuple(t.data_ptr() for t in leaves)
        self._rowbytes = tuple(math.prod(t.shape[1:]) * t.element_size() for t in leaves)
        self._shapes = tuple(t.shape[1:] for t in leaves)
        #: the rows every leaf holds
        self.cap = min((t.shape[0] for t in leaves), default=0)
        self._protos: tuple[int, torch.Size, tuple] = (-1, tail, ())

    def valid(self, root: Any) -> bool:
        """Whether this plan still describes ``root`` (same objects, same addresses)."""
        if root is not self.root:
            return False
        for owner, d, key, value in self._checks:
            if owner._tensordict is not d or d.get(key) is not value:
                return False
        for d, n in self._sizes:  # (a key added since: e.g. TorchRL's write of a batch with a new key)
            if len(d) != n:
                return False
        return tuple(map(_DATA_PTR, self.leaves)) == self._ptrs

    def gather(self, index: torch.Tensor, batch: int, skipped: Any = None) -> Any:
        """``root[index]`` (``index``: contiguous 1-D int64 CPU, ``batch`` entries); None if an index is out of range.

        The output's batch size is ``(batch, *root.batch_size[1:])``; ``skipped`` is placed where
        the plan's skipped leaf was (e.g. the sample's ``"index"``).
        """
        n_protos, shape, protos = self._protos
        if n_protos != batch:
            protos = tuple(torch.empty((batch, *s), dtype=t.dtype) for s, t in zip(self._shapes, self.leaves))
            shape = torch.Size((batch,)) + self._tail
            self._protos = (batch, shape, protos)
        outs = [torch.empty_like(p) for p in protos]
        if not _native.gather(
            self._ptrs,
            tuple(o.data_ptr() for o in outs),
            self._rowbytes,
            index.data_ptr(),
            batch,
            self.cap,
        ):
            return None
        return self._build(iter(outs), shape, skipped)

    def overlaps(self, i: int, t: torch.Tensor) -> bool:
        """Whether tensor ``t``'s bytes lie (partly) inside leaf ``i``'s rows (e.g. a view of the storage)."""
        lo = self._ptrs[i]
        hi = lo + self.cap * self._rowbytes[i]
        p = t.data_ptr()
        return p < hi and lo < p + t.numel() * t.element_size()

    def put(self, sources: list, start: int, n: int) -> None:
        """Rows ``[start, start + n)`` (wrapping at :attr:`cap`) of every leaf = the ``n`` rows of its source.

        ``sources``: contiguous CPU tensors in :attr:`leaves` order, each ``n`` rows of the leaf's
        row shape and dtype, none overlapping a leaf; ``0 <= start < cap`` and ``n <= cap`` (the
        caller checks all of it).
        """
        srcs = tuple(t.data_ptr() for t in sources)
        first = min(n, self.cap - start)
        _native.put(self._ptrs, srcs, self._rowbytes, start, first)
        if n > first:
            srcs = tuple(p + first * b for p, b in zip(srcs, self._rowbytes))
            _native.put(self._ptrs, srcs, self._rowbytes, 0, n - first)


def make_plan(root: Any, skip_key: str | None = None) -> RowPlan | None:
    """A :class:`RowPlan` for a stored ``TensorDict`` or tuple/list of tensors, or None (module doc).

    ``skip_key``: a top-level key not gathered (its place is filled by ``gather``'s ``skipped``).
    """
    if _native is None:
        return None
    leaves: list = []
    paths: list = []
    checks: list = []
    if type(root) in (tuple, list):
        if not root or not all(leaf_ok(v) for v in root):
            return None
        leaves.extend(root)
        paths.extend((i,) for i in range(len(root)))
        kind = type(root)

        def build_seq(outs, shape, skipped):
            return kind(outs)

        return RowPlan(root, leaves, paths, checks, [], build_seq, torch.Size())
    if type(root) is not TensorDict:
        return None
    levels: list = []
    build = _plan_td(root, leaves, paths, checks, levels, skip_key, ())
    if build is None or not leaves:
        return None
    return RowPlan(root, leaves, paths, checks, levels, build, root.batch_size[1:])


def _plan_td(
    td: TensorDict, leaves: list, paths: list, checks: list, levels: list, skip_key: Any, prefix: tuple
) -> Any:
    """The builder of one ``TensorDict`` level (recursively), or None when a value is not plain."""
    if td._td_dim_names is not None or (td._device is not None and td._device != _CPU):
        return None
    d = td._tensordict
    levels.append(d)
    parts: list = []  # (key, kind, builder): kind 0 leaf, 1 nested, 2 skipped
    for key, value in d.items():
        checks.append((td, d, key, value))
        if not prefix and key == skip_key and isinstance(value, torch.Tensor):
            parts.append((key, 2, None))
        elif type(value) is TensorDict:
            sub = _plan_td(value, leaves, paths, checks, levels, None, (*prefix, key))
            if sub is None:
                return None
            parts.append((key, 1, (sub, value)))
        elif leaf_ok(value):
            leaves.append(value)
            paths.append((*prefix, key))
            parts.append((key, 0, None))
        else:
            return None
    parts = tuple(parts)
    device = td._device
    new = _build_td if device is None or type(device) is torch.device else _unsafe

    def build(outs, shape, skipped):
        out = {}
        for key, kind, sub in parts:
            if kind == 0:
                out[key] = next(outs)
            elif kind == 1:
                builder, nested = sub
                out[key] = builder(outs, shape + nested.batch_size[1:], None)
            else:
                out[key] = skipped
        return new(out, shape, device)

    return build
