"""MineStudio's trainer-side loading (``minestudio.online.utils.train.data``).

``create_loader_pool`` places its loaders on the store's node by node affinity (the original used
the ``database`` resource, which can pick a node without the files); ``data_iter`` takes ``seed=``
and ``timeout=``, copies results out of Ray's object store once (the original deep-copied for the
same reason) and drains the pool when stopped early.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ...ray import loader as _loader
from .actor import DEFAULT_NAME
from .datatypes import FragmentIndex, SampleFragment
from .utils import auto_stack, auto_to_torch

FragmentLoader = _loader.FragmentLoader


def create_loader_pool(
    num_readers: int,
    num_cpus_per_reader: float,
    name: str = DEFAULT_NAME,
    namespace: str | None = None,
    local: bool = False,
    per_node: bool | None = None,
) -> Any:
    """An ``ActorPool`` of ``num_readers`` loaders on the store's node.

    Each loader's ``load((index, id))`` returns ``{"index": index, "fragment": SampleFragment}``.
    ``local=True`` (an addition): threads of this process read the store directly instead, for a
    trainer on the store's node (see :class:`replaystore.ray.loader.LocalLoaderPool`).
    ``per_node`` (an addition; default: whether the buffer keeps node-local stores, config key
    ``node_local``): ``num_readers`` loaders on every node keeping a store, and :func:`data_iter`
    reads each fragment on its own node (:class:`replaystore.ray.NodeLoaderPool`).
    """
    if per_node is None:
        per_node = not local and _loader.node_local(name, namespace)
    return _loader.create_loader_pool(
        num_readers, num_cpus_per_reader, service=name, namespace=namespace, local=local, per_node=per_node
    )


def data_iter(
    loader_pool: Any,
    records: Sequence[tuple[FragmentIndex, str]],
    batch_size: int,
    prefetch_batches: int,
    seed: int | None = None,
    timeout: float | None = None,
) -> Iterator[dict]:
    """Yield ``auto_stack``-ed batches ``{"index": [...], "fragment": [...]}`` (the last may be short).

    Records are shuffled (seeded by ``seed``), ``(prefetch_batches + 1) * batch_size`` loads are
    in flight, batches are formed in completion order. ``rs.Timeout`` if a load takes longer than
    ``timeout`` seconds.
    """
    return _loader.data_iter(
        loader_pool, records, batch_size, prefetch_batches, seed=seed, timeout=timeout, collate=auto_stack
    )


def prepare_batch(model: Any, batch_fragments: list[SampleFragment]) -> dict[str, Any]:
    """``{"obs", "state", "action", "first"}`` as torch tensors on ``model.device``, shape ``(B, T, ...)``.

    ``state`` is ``model.merge_state`` of the fragments' ``in_state``.
    """
    device = model.device
    obs = auto_to_torch(auto_stack([f.obs for f in batch_fragments]), device=device)
    state = model.merge_state(auto_to_torch([f.in_state for f in batch_fragments], device=device))
    action = auto_to_torch(auto_stack([f.action for f in batch_fragments]), device=device)
    first = auto_to_torch(auto_stack([f.first for f in batch_fragments]), device=device)
    return {"obs": obs, "state": state, "action": action, "first": first}


def batchify_next_obs(next_obs: dict[str, Any], device: Any) -> Any:
    """One observation as a batch of one sequence of one step, ``(1, 1, ...)``, on ``device``."""
    return auto_to_torch(auto_stack([auto_stack([next_obs])]), device=device)
