"""Peer replay buffers behind one small interface, and the timing harness that compares them.

Every implementation is wrapped by a :class:`Peer` (``check()`` says whether it can run here,
``make(params)`` builds an empty :class:`Buffer` for one workload). A :class:`Buffer` has
the operations the workloads time:

* ``add_one(tr)``          - store one transition;
* ``add_batch(batch)``     - store a batch of transitions;
* ``add_rows(rows)``       - store the rows one step of a vectorised env produces, called the way
  each library's users call it (SB3: ``add`` of ``(n_envs, dim)`` arrays; rlox: ``push_batch``);
* ``sample(n)``            - draw ``n`` transitions uniformly (data gathered);
* ``per_iteration(n, p)``  - one prioritized-replay step: sample ``n`` with importance weights
  and gathered data, then set those items' priorities to ``p``.

Inputs are handed to each buffer in its own native form (``prepare_*``), converted *before*
timing: NumPy arrays for NumPy/cpprb/replaystore, ``TensorDict`` s of torch tensors for TorchRL,
``(1, dim)``-shaped arrays plus an ``infos`` list for SB3. So the timed loop measures the buffer,
not a format conversion a real training loop might not need.

:func:`run_workload` times all peers in one process, interleaving them round-robin over
``repeats`` rounds, and reports medians. :func:`wait_for_quiet` waits for a calm machine.
:func:`measure_memory` measures the bytes a filled buffer holds, in a fresh subprocess.
"""

from __future__ import annotations

import gc
import importlib
import json
import logging
import os
import subprocess
import sys
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

OBS_DIM = 17
ACT_DIM = 6
#: Field name -> per-item shape. All fields are float32 (``done`` is 0.0/1.0).
FIELDS: dict[str, tuple[int, ...]] = {
    "obs": (OBS_DIM,),
    "action": (ACT_DIM,),
    "reward": (),
    "next_obs": (OBS_DIM,),
    "done": (),
}
Batch = dict[str, np.ndarray]
Transition = dict[str, Any]

FILL_CHUNK = 1 << 16  # items per call when pre-filling a buffer (untimed)
#: Bytes of one transition's data (42 float32): the "payload" memory is compared against.
PAYLOAD_BYTES = 4 * sum(int(np.prod(s)) for s in FIELDS.values())


# --------------------------------------------------------------------------------------------
# Workload description and test data
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadParams:
    """What a buffer is built for and how a workload drives it."""

    capacity: int
    batch_size: int  # items per add_batch / sample / PER iteration
    prioritized: bool = False
    alpha: float = 0.6
    beta: float = 0.4
    prefill: int = 0  # items stored (untimed) before timing; == capacity means steady state
    seed: int = 0
    n_envs: int = 1  # envs of the vectorised env feeding add_rows (SB3 builds its buffer for it)


@dataclass(frozen=True)
class Workload:
    """A named workload: the operation timed, its parameters and how results are reported."""

    name: str
    op: str  # "add_one" | "add_batch" | "sample" | "per" | "add_rows" | "per_add_rows"
    params: WorkloadParams
    description: str
    ops_per_chunk: int = 1  # operations between two clock reads (tiny ops are batched)

    @property
    def items_per_op(self) -> int:
        """Transitions added or sampled by one timed operation."""
        return 1 if self.op == "add_one" else self.params.batch_size


def make_transitions(n: int, rng: np.random.Generator) -> Batch:
    """``n`` random transitions as a dict of float32 columns (``obs`` is ``[n, 17]`` ...)."""
    out: Batch = {}
    for name, shape in FIELDS.items():
        if name == "done":
            out[name] = (rng.random(n) < 0.01).astype(np.float32)
        else:
            out[name] = rng.standard_normal((n, *shape), dtype=np.float32)
    return out


def split_transitions(batch: Batch) -> list[Transition]:
    """One dict per row; vector fields stay float32 arrays, scalars become ``np.float32``."""
    n = len(batch["obs"])
    return [{k: v[i].copy() if v.ndim > 1 else v[i] for k, v in batch.items()} for i in range(n)]


def random_priorities(n: int, rng: np.random.Generator) -> np.ndarray:
    """Positive priorities, as a TD-error magnitude might give (float32 in [0.01, 2))."""
    return rng.uniform(0.01, 2.0, n).astype(np.float32)


# --------------------------------------------------------------------------------------------
# The buffer interface
# --------------------------------------------------------------------------------------------


class Unsupported(Exception):
    """The implementation has no such operation (e.g. SB3 has no prioritized buffer)."""


class Buffer(ABC):
    """One implementation's buffer, built for one :class:`WorkloadParams`."""

    def __init__(self, params: WorkloadParams) -> None:
        self.params = params

    # Conversion of inputs into the buffer's native form (done before timing).
    def prepare_one(self, tr: Transition) -> Any:
        """Native form of one transition (default: the NumPy dict itself)."""
        return tr

    def prepare_batch(self, batch: Batch) -> Any:
        """Native form of a batch (default: the dict of NumPy columns itself)."""
        return batch

    def prepare_priorities(self, priorities: np.ndarray) -> Any:
        """Native form of a priority vector (default: NumPy float32)."""
        return priorities

    def fill(self, data: Batch, priorities: np.ndarray | None) -> None:
        """Store ``data`` (untimed setup), with initial ``priorities`` when prioritized."""
        n = len(data["obs"])
        for lo in range(0, n, FILL_CHUNK):
            hi = min(lo + FILL_CHUNK, n)
            chunk = {k: v[lo:hi] for k, v in data.items()}
            prio = None if priorities is None else priorities[lo:hi]
            self._fill_chunk(chunk, prio)

    def fill_chunk(self, chunk: Batch, priorities: np.ndarray | None) -> None:
        """Store one chunk of setup data (untimed); chunks are stored in call order."""
        self._fill_chunk(chunk, priorities)

    def _fill_chunk(self, chunk: Batch, priorities: np.ndarray | None) -> None:
        if priorities is not None:
            raise Unsupported("prioritized fill")
        self.add_batch(self.prepare_batch(chunk))

    @abstractmethod
    def add_one(self, tr: Any) -> None:
        """Store one (prepared) transition."""

    @abstractmethod
    def add_batch(self, batch: Any) -> None:
        """Store one (prepared) batch."""

    @abstractmethod
    def sample(self, n: int) -> Any:
        """Sample ``n`` items uniformly, data gathered."""

    def prepare_rows(self, batch: Batch) -> Any:
        """Native form of one vectorised-env step's rows (default: :meth:`prepare_batch`)."""
        return self.prepare_batch(batch)

    def add_rows(self, rows: Any) -> None:
        """Store one vectorised-env step's (prepared) rows (default: :meth:`add_batch`)."""
        self.add_batch(rows)

    def per_iteration(self, n: int, priorities: Any) -> None:
        """Sample ``n`` with IS weights and data, then set their priorities to ``priorities``."""
        raise Unsupported("per")


class Peer(ABC):
    """An implementation under comparison: availability check plus buffer factory."""

    name: str = ""
    #: Importable modules the peer needs; a failed import marks it "not installed".
    modules: tuple[str, ...] = ()
    #: Operations it can run ("add_one", "add_batch", "sample", "per").
    supports: frozenset[str] = frozenset({"add_one", "add_batch", "sample", "add_rows"})
    #: Distribution whose version is reported.
    dist: str = ""
    #: Remarks shown in the report (how the peer is used where that is not obvious).
    notes: dict[str, str] = {}

    def check(self) -> str | None:
        """``None`` if the peer can run here, else why not (e.g. "not installed: ...")."""
        for mod in self.modules:
            try:
                importlib.import_module(mod)
            except Exception as exc:  # noqa: BLE001 - any import failure means "skip it"
                return f"not installed ({mod}: {type(exc).__name__}: {exc})"
        return None

    def version(self) -> str:
        """Installed version of the distribution named ``dist`` ("" when unknown)."""
        if not self.dist:
            return ""
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(self.dist)
        except PackageNotFoundError:
            mod = importlib.import_module(self.modules[-1])
            return str(getattr(mod, "__version__", ""))

    @abstractmethod
    def make(self, params: WorkloadParams) -> Buffer:
        """A new empty buffer for ``params``."""


# --------------------------------------------------------------------------------------------
# NumPy ring buffer: the "limit" for uniform workloads
# --------------------------------------------------------------------------------------------


class NumpyRing(Buffer):
    """Preallocated column per field; add = slice assignment; sample = ``np.take(out=...)``."""

    def __init__(self, params: WorkloadParams) -> None:
        super().__init__(params)
        cap = params.capacity
        self.cols = {k: np.zeros((cap, *s), np.float32) for k, s in FIELDS.items()}
        self.pos = 0
        self.size = 0
        self.rng = np.random.default_rng(params.seed)
        self._out: dict[int, Batch] = {}

    def _out_for(self, n: int) -> Batch:
        out = self._out.get(n)
        if out is None:
            out = {k: np.empty((n, *s), np.float32) for k, s in FIELDS.items()}
            self._out[n] = out
        return out

    def add_one(self, tr: Transition) -> None:
        pos = self.pos
        for k, col in self.cols.items():
            col[pos] = tr[k]
        self.pos = (pos + 1) % self.params.capacity
        if self.size < self.params.capacity:
            self.size += 1

    def add_batch(self, batch: Batch) -> int:
        cap = self.params.capacity
        n = len(batch["obs"])
        start = self.pos
        first = min(n, cap - start)
        for k, col in self.cols.items():
            v = batch[k]
            col[start : start + first] = v[:first]
            if first < n:
                col[: n - first] = v[first:]
        self.pos = (start + n) % cap
        self.size = min(self.size + n, cap)
        return start

    def _gather(self, idx: np.ndarray) -> Batch:
        out = self._out_for(len(idx))
        for k, col in self.cols.items():
            # mode="clip", not the default "raise": with "raise" NumPy gathers into a temporary
            # and copies it into ``out`` (its docs: "raise" buffers ``out``), an extra pass that
            # made this "limit" slower than libraries gathering with plain ``take``. The indices
            # are in range by construction, so "clip" never changes the result.
            np.take(col, idx, axis=0, out=out[k], mode="clip")
        return out

    def sample(self, n: int) -> Batch:
        idx = self.rng.integers(0, self.size, n)
        return self._gather(idx)


class NumpyPeer(Peer):
    """Raw NumPy ring buffer (no library): what plain array code can reach."""

    name = "numpy"
    notes = {"sample": "reuses a preallocated output batch"}

    def version(self) -> str:
        return np.__version__

    def make(self, params: WorkloadParams) -> Buffer:
        return NumpyRing(params)


# --------------------------------------------------------------------------------------------
# NumPy sum tree: the reference for prioritized replay
# --------------------------------------------------------------------------------------------


class NumpySumTree(NumpyRing):
    """Ring buffer plus flat-array sum tree and min tree (root at 1, leaves at ``cap + i``).

    Priorities are stored as ``p ** alpha``; new items without a priority get the largest
    seen so far. Sampling is stratified proportional sampling with a vectorised descent;
    importance weights are ``(N * P(i)) ** -beta`` normalised by their maximum possible value
    ``(N * min P) ** -beta`` (Schaul et al. 2016). Updates set the leaves and recompute every
    ancestor level by level (duplicates just recompute the same value).
    """

    def __init__(self, params: WorkloadParams) -> None:
        super().__init__(params)
        cap = 1 << max(0, (params.capacity - 1).bit_length())
        self.tree_cap = cap
        self.depth = cap.bit_length() - 1
        self.sum = np.zeros(2 * cap, np.float64)
        self.min = np.full(2 * cap, np.inf, np.float64)
        self.max_priority = 1.0  # already ** alpha

    def _set(self, idx: np.ndarray, values: np.ndarray) -> None:
        pos = idx + self.tree_cap
        self.sum[pos] = values
        self.min[pos] = values
        s, m = self.sum, self.min
        for _ in range(self.depth):
            pos = pos >> 1
            left = pos << 1
            s[pos] = s[left] + s[left + 1]
            m[pos] = np.minimum(m[left], m[left + 1])

    def update(self, idx: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of items ``idx`` (raw, before ``** alpha``)."""
        v = np.power(priorities, self.params.alpha, dtype=np.float64)
        self.max_priority = max(self.max_priority, float(v.max()))
        self._set(idx, v)

    def add_one(self, tr: Transition) -> None:
        pos = self.pos
        super().add_one(tr)
        self._set(np.array([pos]), np.array([self.max_priority]))

    def add_batch(self, batch: Batch) -> int:
        n = len(batch["obs"])
        start = super().add_batch(batch)
        idx = (start + np.arange(n)) % self.params.capacity
        self._set(idx, np.full(n, self.max_priority))
        return start

    def _fill_chunk(self, chunk: Batch, priorities: np.ndarray | None) -> None:
        n = len(chunk["obs"])
        start = NumpyRing.add_batch(self, chunk)
        idx = (start + np.arange(n)) % self.params.capacity
        if priorities is None:
            self._set(idx, np.full(n, self.max_priority))
        else:
            self.update(idx, priorities)

    def sample_prioritized(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Stratified proportional sample: ``(indices, importance weights)``."""
        s = self.sum
        total = s[1]
        u = (np.arange(n) + self.rng.random(n)) * (total / n)
        np.minimum(u, np.nextafter(total, 0.0), out=u)
        pos = np.ones(n, np.int64)
        for _ in range(self.depth):
            left = pos << 1
            lv = s[left]
            right = u >= lv
            u -= np.where(right, lv, 0.0)
            pos = left + right
        idx = pos - self.tree_cap
        np.minimum(idx, self.size - 1, out=idx)
        n_items = self.size
        p = s[idx + self.tree_cap] / total
        p_min = self.min[1] / total
        weights = np.power(n_items * p, -self.params.beta) / (n_items * p_min) ** -self.params.beta
        return idx, weights.astype(np.float32)

    def per_iteration(self, n: int, priorities: np.ndarray) -> None:
        idx, weights = self.sample_prioritized(n)
        self._gather(idx)
        self.update(idx, priorities)


class NumpySumTreePeer(Peer):
    """Plain vectorised NumPy sum tree + min tree: the reference PER peer."""

    name = "numpy-sumtree"
    supports = frozenset({"per", "per_add_rows"})
    notes = {"per_add_rows": "slice assignment + new leaves at the max priority, ancestors recomputed"}

    def version(self) -> str:
        return np.__version__

    def make(self, params: WorkloadParams) -> Buffer:
        return NumpySumTree(params)


# --------------------------------------------------------------------------------------------
# cpprb
# --------------------------------------------------------------------------------------------


def _cpprb_env_dict() -> dict[str, dict[str, Any]]:
    return {k: ({"shape": s} if s else {}) for k, s in FIELDS.items()}


class CpprbBuffer(Buffer):
    """``cpprb.ReplayBuffer`` / ``PrioritizedReplayBuffer``: ``add(**kw)``, ``sample(n)``."""

    def __init__(self, params: WorkloadParams) -> None:
        super().__init__(params)
        import cpprb

        if params.prioritized:
            self.rb = cpprb.PrioritizedReplayBuffer(params.capacity, _cpprb_env_dict(), alpha=params.alpha)
        else:
            self.rb = cpprb.ReplayBuffer(params.capacity, _cpprb_env_dict())

    def _fill_chunk(self, chunk: Batch, priorities: np.ndarray | None) -> None:
        if priorities is None:
            self.rb.add(**chunk)
        else:
            self.rb.add(**chunk, priorities=priorities)

    def add_one(self, tr: Transition) -> None:
        self.rb.add(**tr)

    def add_batch(self, batch: Batch) -> None:
        self.rb.add(**batch)

    def sample(self, n: int) -> dict[str, np.ndarray]:
        return self.rb.sample(n)

    def per_iteration(self, n: int, priorities: np.ndarray) -> None:
        s = self.rb.sample(n, beta=self.params.beta)
        self.rb.update_priorities(s["indexes"], priorities)


class CpprbPeer(Peer):
    """cpprb (C++/Cython ring buffer and segment trees)."""

    name = "cpprb"
    modules = ("cpprb",)
    dist = "cpprb"
    supports = frozenset({"add_one", "add_batch", "sample", "per", "add_rows", "per_add_rows"})

    def make(self, params: WorkloadParams) -> Buffer:
        return CpprbBuffer(params)


# --------------------------------------------------------------------------------------------
# TorchRL
# --------------------------------------------------------------------------------------------


class TorchRLBuffer(Buffer):
    """TorchRL ``ReplayBuffer(LazyTensorStorage)`` or ``TensorDictPrioritizedReplayBuffer``."""

    def __init__(self, params: WorkloadParams) -> None:
        super().__init__(params)
        import torch
        from torchrl.data import (
            LazyTensorStorage,
            ReplayBuffer,
            TensorDictPrioritizedReplayBuffer,
        )

        logging.getLogger("torchrl").setLevel(logging.WARNING)
        self.torch = torch
        torch.manual_seed(params.seed)
        storage = LazyTensorStorage(params.capacity)
        if params.prioritized:
            self.rb = TensorDictPrioritizedReplayBuffer(
                alpha=params.alpha,
                beta=params.beta,
                storage=storage,
                batch_size=params.batch_size,
            )
        else:
            self.rb = ReplayBuffer(storage=storage, batch_size=params.batch_size)
        self._count = 0

    def prepare_one(self, tr: Transition) -> Any:
        from tensordict import TensorDict

        return TensorDict({k: self.torch.as_tensor(v) for k, v in tr.items()}, batch_size=[])

    def prepare_batch(self, batch: Batch) -> Any:
        from tensordict import TensorDict

        n = len(batch["obs"])
        cols = {k: self.torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
        return TensorDict(cols, batch_size=[n])

    def prepare_priorities(self, priorities: np.ndarray) -> Any:
        return self.torch.from_numpy(priorities)

    def _fill_chunk(self, chunk: Batch, priorities: np.ndarray | None) -> None:
        idx = self.rb.extend(self.prepare_batch(chunk))
        if priorities is not None:
            self.rb.update_priority(idx, self.torch.from_numpy(priorities))

    def add_one(self, tr: Any) -> None:
        self.rb.add(tr)

    def add_batch(self, batch: Any) -> None:
        self.rb.extend(batch)

    def sample(self, n: int) -> Any:
        # The buffer was built with batch_size == n, TorchRL's recommended way.
        return self.rb.sample()

    def per_iteration(self, n: int, priorities: Any) -> None:
        td = self.rb.sample()  # carries "index" and "priority_weight"
        self.rb.update_priority(td["index"], priorities)


class TorchRLPeer(Peer):
    """TorchRL replay buffers (LazyTensorStorage; PrioritizedSampler with its C++ sum tree)."""

    name = "torchrl"
    modules = ("torch", "tensordict", "torchrl")
    dist = "torchrl"
    supports = frozenset({"add_one", "add_batch", "sample", "per", "add_rows", "per_add_rows"})
    notes = {"per": "TensorDictPrioritizedReplayBuffer; update_priority(td['index'], p)"}

    def check(self) -> str | None:
        reason = super().check()
        if reason is not None:
            return reason
        try:
            importlib.import_module("torchrl._torchrl")
        except Exception as exc:  # noqa: BLE001
            return (
                "PrioritizedSampler unavailable (torchrl._torchrl: "
                f"{type(exc).__name__}); run shared/tools/build_torchrl_ext.py"
            )
        return None

    def make(self, params: WorkloadParams) -> Buffer:
        return TorchRLBuffer(params)


# --------------------------------------------------------------------------------------------
# Stable-Baselines3
# --------------------------------------------------------------------------------------------


class SB3Buffer(Buffer):
    """``stable_baselines3.common.buffers.ReplayBuffer`` with Box spaces.

    Built with ``n_envs = params.n_envs``: SB3 divides ``buffer_size`` by ``n_envs``
    (``buffer_size // n_envs`` slots of ``n_envs`` rows each), so the buffer holds
    ``n_envs * (capacity // n_envs)`` rows (999,936 for 1M at 256 envs; exactly 1M otherwise).
    ``add`` takes one row per env as ``(n_envs, dim)`` arrays plus one ``info`` dict per env,
    as a VecEnv step produces them. SB3 has no prioritized buffer: in the ``per_add_rows``
    tables it runs as a uniform stand-in (priorities in the setup data are ignored), because
    the issue's target compares ``Prioritized`` adds against SB3's ``add``.
    """

    def __init__(self, params: WorkloadParams) -> None:
        super().__init__(params)
        from gymnasium import spaces
        from stable_baselines3.common.buffers import ReplayBuffer

        obs_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
        act_space = spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)
        np.random.seed(params.seed)  # SB3 samples with the global NumPy RNG
        self.n_envs = params.n_envs
        self.rb = ReplayBuffer(params.capacity, obs_space, act_space, device="cpu", n_envs=self.n_envs)
        self._filled = 0  # rows written by fill_chunk (setup), in flat (slot, env) order

    def prepare_one(self, tr: Transition) -> tuple[Any, ...]:
        """The arguments of ``ReplayBuffer.add`` as a VecEnv with one env produces them."""
        if self.n_envs != 1:
            raise Unsupported(f"add of one row into a buffer built for n_envs={self.n_envs}")
        return (
            tr["obs"].reshape(1, OBS_DIM),
            tr["next_obs"].reshape(1, OBS_DIM),
            tr["action"].reshape(1, ACT_DIM),
            np.array([tr["reward"]], np.float32),
            np.array([tr["done"]], np.float32),
            [{}],
        )

    def prepare_batch(self, batch: Batch) -> list[tuple[Any, ...]]:
        return [self.prepare_one(tr) for tr in split_transitions(batch)]

    def prepare_rows(self, batch: Batch) -> tuple[Any, ...]:
        """``add``'s arguments for one step of ``n_envs`` envs: ``(n_envs, dim)`` arrays, infos."""
        n = len(batch["obs"])
        if n != self.n_envs:
            raise Unsupported(f"{n} rows per add into a buffer built for n_envs={self.n_envs}")
        return (batch["obs"], batch["next_obs"], batch["action"], batch["reward"], batch["done"],
                [{} for _ in range(n)])

    def _fill_chunk(self, chunk: Batch, priorities: np.ndarray | None) -> None:
        # Setup only: write the arrays directly (untimed; SB3 has no batch add). Every array
        # ``add`` writes is written here too (timeouts included), so memory is touched alike.
        rb = self.rb
        total = rb.buffer_size * self.n_envs
        flat = {
            "obs": rb.observations.reshape(total, OBS_DIM),
            "next_obs": rb.next_observations.reshape(total, OBS_DIM),
            "action": rb.actions.reshape(total, ACT_DIM),
            "reward": rb.rewards.reshape(total),
            "done": rb.dones.reshape(total),
        }
        m = len(chunk["obs"])
        lo = 0
        while lo < m:
            at = self._filled % total
            k = min(m - lo, total - at)
            for name, dst in flat.items():
                dst[at : at + k] = chunk[name][lo : lo + k]
            rb.timeouts.reshape(total)[at : at + k] = 0.0
            lo += k
            self._filled += k
        rb.full = rb.full or self._filled >= total
        rb.pos = (self._filled % total) // self.n_envs

    def add_one(self, tr: tuple[Any, ...]) -> None:
        self.rb.add(*tr)

    def add_batch(self, batch: list[tuple[Any, ...]]) -> None:
        add = self.rb.add
        for tr in batch:
            add(*tr)

    def add_rows(self, rows: tuple[Any, ...]) -> None:
        self.rb.add(*rows)

    def sample(self, n: int) -> Any:
        return self.rb.sample(n)  # ReplayBufferSamples of torch tensors: SB3's normal path


class SB3Peer(Peer):
    """Stable-Baselines3's off-policy ReplayBuffer (NumPy storage, torch output)."""

    name = "sb3"
    modules = ("torch", "gymnasium", "stable_baselines3")
    dist = "stable-baselines3"
    supports = frozenset({"add_one", "add_batch", "sample", "add_rows", "per_add_rows"})
    notes = {
        "add_batch": "no batch add in SB3: loops add() per transition",
        "sample": "returns torch tensors (its normal path)",
        "add_rows": "ReplayBuffer(n_envs=rows).add((rows, dim) arrays, infos)",
        "per_add_rows": "UNIFORM (SB3 has no PER): ReplayBuffer(n_envs=rows).add, for the target ratio",
    }

    def make(self, params: WorkloadParams) -> Buffer:
        return SB3Buffer(params)


# --------------------------------------------------------------------------------------------
# rlox
# --------------------------------------------------------------------------------------------


class RloxBuffer(Buffer):
    """``rlox.ReplayBuffer`` / ``rlox.PrioritizedReplayBuffer`` (Rust core, PyO3 bindings).

    rlox has fixed fields ``obs``, ``action``, ``reward``, ``terminated``, ``truncated``,
    ``next_obs``; our transition maps onto them as ``done -> terminated`` (uint8 in batches,
    ``bool`` for ``push``) and ``truncated = False``: the same 17 + 6 + 1 + 17 floats plus
    2 flag bytes (166 B stored per item against our 168 B). ``push_batch`` takes *flat* float32
    arrays (``obs.ravel()``, a view of a C-contiguous ``(n, 17)`` array) and uint8 flags; its
    ``sample(n, seed)`` needs a seed per call (a fixed seed repeats the same batch), so the buffer
    passes a counter. ``PrioritizedReplayBuffer`` has no batch push: rows are pushed one by one,
    with its default priority 1.0 (it does not track a running maximum); priorities for
    ``update_priorities`` are float64 and the indices are the uint64 ones ``sample`` returns.
    """

    def __init__(self, params: WorkloadParams) -> None:
        super().__init__(params)
        import rlox

        if params.prioritized:
            self.rb = rlox.PrioritizedReplayBuffer(params.capacity, OBS_DIM, ACT_DIM,
                                                   alpha=params.alpha, beta=params.beta)
        else:
            self.rb = rlox.ReplayBuffer(params.capacity, OBS_DIM, ACT_DIM)
        self._seed = params.seed

    def prepare_one(self, tr: Transition) -> tuple[Any, ...]:
        """``push``'s arguments as an env loop has them: arrays, a float, two bools."""
        return (tr["obs"], tr["action"], float(tr["reward"]), bool(tr["done"]), False, tr["next_obs"])

    def prepare_batch(self, batch: Batch) -> Any:
        if self.params.prioritized:  # no push_batch in PrioritizedReplayBuffer: one push per row
            return [self.prepare_one(tr) for tr in split_transitions(batch)]
        n = len(batch["obs"])
        term = batch["done"].astype(np.uint8)
        return (
            np.ascontiguousarray(batch["obs"]).ravel(),
            np.ascontiguousarray(batch["next_obs"]).ravel(),
            np.ascontiguousarray(batch["action"]).ravel(),
            np.ascontiguousarray(batch["reward"]),
            term,
            np.zeros(n, np.uint8),
        )

    def prepare_priorities(self, priorities: np.ndarray) -> np.ndarray:
        return priorities.astype(np.float64)

    def _fill_chunk(self, chunk: Batch, priorities: np.ndarray | None) -> None:
        if priorities is None:
            self.add_batch(self.prepare_batch(chunk))
            return
        push = self.rb.push
        for (obs, act, rew, term, trunc, nxt), p in zip(self.prepare_batch(chunk), priorities.tolist()):
            push(obs, act, rew, term, trunc, nxt, priority=p)

    def add_one(self, tr: tuple[Any, ...]) -> None:
        self.rb.push(*tr)

    def add_batch(self, batch: Any) -> None:
        if self.params.prioritized:
            push = self.rb.push
            for tr in batch:
                push(*tr)
        else:
            self.rb.push_batch(*batch)

    def _next_seed(self) -> int:
        self._seed += 1
        return self._seed

    def sample(self, n: int) -> dict[str, np.ndarray]:
        return self.rb.sample(n, self._next_seed())

    def per_iteration(self, n: int, priorities: np.ndarray) -> None:
        s = self.rb.sample(n, self._next_seed())  # data, "weights", "indices"
        self.rb.update_priorities(s["indices"], priorities)


class RloxPeer(Peer):
    """rlox 1.2 (Rust ring buffer and sum tree behind PyO3)."""

    name = "rlox"
    modules = ("rlox",)
    dist = "rlox"
    supports = frozenset({"add_one", "add_batch", "sample", "per", "add_rows", "per_add_rows"})
    notes = {
        "add_one": "push(obs, action, reward, terminated, truncated, next_obs)",
        "add_batch": "push_batch of flat arrays",
        "sample": "sample(n, seed); seed advanced per call",
        "per": "sample(n, seed) + update_priorities(indices, f64)",
        "add_rows": "push_batch of flat arrays",
        "per_add_rows": "push per row (no batch push in its PER buffer), default priority 1.0",
    }

    def make(self, params: WorkloadParams) -> Buffer:
        return RloxBuffer(params)


# --------------------------------------------------------------------------------------------
# replaystore (the library under test)
# --------------------------------------------------------------------------------------------


class ReplaystoreBuffer(Buffer):
    """``replaystore.Table`` with Uniform or Prioritized sampler, Fifo remover, MinSize(1)."""

    backend = "auto"  # the sum-tree kernels: numba when the [fast] extra is installed
    tree_dtype = "float64"

    def __init__(self, params: WorkloadParams) -> None:
        super().__init__(params)
        import replaystore as rs

        sampler = (rs.Prioritized(alpha=params.alpha, beta=params.beta, backend=self.backend,
                                  tree_dtype=self.tree_dtype)
                   if params.prioritized else rs.Uniform())
        self.table = rs.Table(
            capacity=params.capacity,
            sampler=sampler,
            remover=rs.Fifo(),
            rate_limiter=rs.MinSize(1),
            seed=params.seed,
        )

    def _fill_chunk(self, chunk: Batch, priorities: np.ndarray | None) -> None:
        self.table.extend(chunk, priorities=priorities)

    def add_one(self, tr: Transition) -> None:
        self.table.add(tr)

    def add_batch(self, batch: Batch) -> None:
        self.table.extend(batch)

    def sample(self, n: int) -> Any:
        return self.table.sample(n).data

    def per_iteration(self, n: int, priorities: np.ndarray) -> None:
        s = self.table.sample(n)  # s.data gathered, s.weights = IS weights
        self.table.update_priorities(s.keys, priorities)


class ReplaystorePeer(Peer):
    """replaystore, the library being benchmarked."""

    name = "replaystore"
    modules = ("replaystore",)
    dist = "replaystore"
    supports = frozenset({"add_one", "add_batch", "sample", "per", "add_rows", "per_add_rows"})
    notes = {"per": "numba sum trees (the [fast] extra)"}

    def version(self) -> str:
        """The version, plus whether the optional C extension of the small-call path is loaded."""
        base = Peer.version(self)
        try:
            rows = importlib.import_module("replaystore.rows")
        except ImportError:  # a replaystore without the compiled row path
            return base
        return f"{base} ({'C ext' if getattr(rows, 'COMPILED', False) else 'no C ext'})"

    def make(self, params: WorkloadParams) -> Buffer:
        return ReplaystoreBuffer(params)


class ReplaystoreNumpyBuffer(ReplaystoreBuffer):
    """The same table with the NumPy sum trees (what runs without the ``[fast]`` extra)."""

    backend = "numpy"


class ReplaystoreNumpyPeer(Peer):
    """replaystore's prioritized replay without numba (the NumPy fallback)."""

    name = "replaystore-numpy"
    modules = ("replaystore",)
    dist = "replaystore"
    version = ReplaystorePeer.version
    supports = frozenset({"per", "per_add_rows"})
    notes = {"per": "Prioritized(backend='numpy'): no numba",
             "per_add_rows": "Prioritized(backend='numpy'): no numba"}

    def make(self, params: WorkloadParams) -> Buffer:
        return ReplaystoreNumpyBuffer(params)


class ReplaystoreF32Buffer(ReplaystoreBuffer):
    """The same table with float32 sum and min trees (``Prioritized(tree_dtype=np.float32)``)."""

    tree_dtype = "float32"


class ReplaystoreF32Peer(Peer):
    """replaystore's prioritized replay with float32 trees (half their memory)."""

    name = "replaystore-f32"
    modules = ("replaystore",)
    dist = "replaystore"
    version = ReplaystorePeer.version
    supports = frozenset({"per", "per_add_rows"})
    notes = {"per": "Prioritized(tree_dtype=float32)", "per_add_rows": "Prioritized(tree_dtype=float32)"}

    def make(self, params: WorkloadParams) -> Buffer:
        return ReplaystoreF32Buffer(params)


#: Every peer, in report order (replaystore first, the NumPy limits last).
ALL_PEERS: tuple[Peer, ...] = (
    ReplaystorePeer(),
    ReplaystoreNumpyPeer(),
    ReplaystoreF32Peer(),
    RloxPeer(),
    CpprbPeer(),
    TorchRLPeer(),
    SB3Peer(),
    NumpyPeer(),
    NumpySumTreePeer(),
)


# --------------------------------------------------------------------------------------------
# Memory: bytes a filled buffer holds, measured in a fresh process
# --------------------------------------------------------------------------------------------


def _rss_bytes() -> int:
    """Resident set size of this process (``VmRSS``), in bytes; 0 where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass(frozen=True)
class MemoryResult:
    """What a filled buffer holds: ``rss_bytes`` over ``items`` stored (or why it is unknown)."""

    rss_bytes: int = 0
    items: int = 0
    reason: str = ""  # non-empty: not measured

    @property
    def ok(self) -> bool:
        """Whether a measurement exists."""
        return not self.reason and self.items > 0

    @property
    def bytes_per_item(self) -> float:
        """Resident bytes per stored item (NaN when not measured)."""
        return self.rss_bytes / self.items if self.ok else float("nan")


def _memory_child(peer_name: str, params: WorkloadParams) -> dict[str, Any]:
    """Body of the measuring subprocess: RSS after build + fill minus RSS after the imports.

    "After the imports" means after the peer's modules are imported *and* a small buffer of the
    same kind was built, filled and sampled once and thrown away, so lazy imports, JIT
    compilation (numba) and first-use caches are in the baseline, not in the buffer's figure.
    The setup data is generated chunk by chunk and dropped after each chunk is stored, so a
    peer that kept a reference to its input instead of copying it would be charged for it.
    """
    import gc as _gc

    peer = next(p for p in ALL_PEERS if p.name == peer_name)
    reason = peer.check()
    if reason is not None:
        return {"reason": reason}
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    rng = np.random.default_rng(params.seed + 1)
    small = WorkloadParams(capacity=4096, batch_size=64, prioritized=params.prioritized,
                           alpha=params.alpha, beta=params.beta, prefill=4096, seed=params.seed, n_envs=1)
    warm = peer.make(small)
    warm.fill(make_transitions(4096, rng), random_priorities(4096, rng) if params.prioritized else None)
    if params.prioritized and "per" in peer.supports:
        warm.per_iteration(64, warm.prepare_priorities(random_priorities(64, rng)))
    else:
        warm.sample(64)
    del warm
    make_transitions(FILL_CHUNK, rng), random_priorities(FILL_CHUNK, rng)  # warm the generators
    _gc.collect()
    rss0 = _rss_bytes()

    buf = peer.make(replace(params, n_envs=1))
    stored = 0
    while stored < params.prefill:
        m = min(FILL_CHUNK, params.prefill - stored)
        chunk = make_transitions(m, rng)
        prio = random_priorities(m, rng) if params.prioritized else None
        buf.fill_chunk(chunk, prio)
        del chunk, prio
        stored += m
    _gc.collect()
    rss1 = _rss_bytes()
    items = min(stored, params.capacity)
    del buf
    return {"rss_bytes": rss1 - rss0, "items": items}


def measure_memory(peer_name: str, params: WorkloadParams, timeout: float = 600.0) -> MemoryResult:
    """Resident bytes a buffer of peer ``peer_name`` holds once filled with ``params.prefill`` items.

    Runs in a fresh Python process (the same interpreter, the same import path): within one
    process RSS does not fall when earlier buffers are freed (the allocator keeps or reuses the
    pages), so only a new process gives each buffer a clean baseline. The child runs with
    ``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB, so every freed temporary larger than that goes
    back to the OS rather than staying resident in the heap, and with one thread for OpenMP /
    torch. Nothing here is timed. Returns a :class:`MemoryResult` whose ``reason`` says why
    when the child failed.
    """
    payload = json.dumps({"peer": peer_name, "params": asdict(params)})
    env = dict(os.environ)
    env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    env.setdefault("OMP_NUM_THREADS", "1")
    paths = [os.path.dirname(os.path.abspath(__file__))]
    try:  # the replaystore this process imported (it may come from sys.path, not PYTHONPATH)
        import replaystore

        paths.append(os.path.dirname(os.path.dirname(os.path.abspath(replaystore.__file__))))
    except Exception:  # noqa: BLE001 - the child then reports replaystore as not installed
        pass
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    try:
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--memory-child", payload],
            capture_output=True, text=True, env=env, timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired:
        return MemoryResult(reason=f"timed out after {timeout:g}s")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return MemoryResult(reason=f"child exit {proc.returncode}: {tail[:200]}")
    out = json.loads(lines[-1])
    if "reason" in out:
        return MemoryResult(reason=out["reason"])
    return MemoryResult(rss_bytes=int(out["rss_bytes"]), items=int(out["items"]))


class MemoryCache:
    """:func:`measure_memory` once per ``(peer, capacity, prioritized)`` for one process run."""

    def __init__(self, timeout: float = 600.0, log: Callable[[str], None] | None = None) -> None:
        self.timeout = timeout
        self.log = log
        self._cache: dict[tuple[str, int, bool], MemoryResult] = {}

    def __call__(self, peer_name: str, params: WorkloadParams) -> MemoryResult:
        """The memory of ``peer_name``'s buffer for ``params`` (measured on first request)."""
        key = (peer_name, params.capacity, params.prioritized)
        res = self._cache.get(key)
        if res is None:
            t0 = time.perf_counter()
            res = measure_memory(peer_name, params, self.timeout)
            self._cache[key] = res
            if self.log:
                what = (f"{res.rss_bytes / 1e6:.0f} MB, {res.bytes_per_item:.0f} B/item" if res.ok
                        else f"not measured: {res.reason}")
                self.log(f"  memory {peer_name} cap={params.capacity} prioritized={params.prioritized}: "
                         f"{what} ({time.perf_counter() - t0:.0f}s)")
        return res


# --------------------------------------------------------------------------------------------
# Machine quietness
# --------------------------------------------------------------------------------------------


def read_loadavg() -> tuple[float, float, float]:
    """The 1-, 5- and 15-minute load averages (zeros where /proc/loadavg is missing)."""
    try:
        with open("/proc/loadavg") as f:
            a, b, c = f.read().split()[:3]
        return float(a), float(b), float(c)
    except OSError:
        return 0.0, 0.0, 0.0


def wait_for_quiet(
    max_wait: float = 60.0,
    threshold: float = 1.0,
    poll: float = 2.0,
    log: Callable[[str], None] | None = print,
) -> tuple[float, float]:
    """Wait up to ``max_wait`` s for the 1-min load to fall below ``threshold``.

    Proceeds either way; returns ``(1-min load when proceeding, seconds waited)`` so the
    caller can note it beside the results.
    """
    t0 = time.monotonic()
    load = read_loadavg()[0]
    while load >= threshold and time.monotonic() - t0 < max_wait:
        if log:
            log(f"waiting for a quiet machine: 1-min load {load:.2f} >= {threshold}")
        time.sleep(poll)
        load = read_loadavg()[0]
    waited = time.monotonic() - t0
    if log and load >= threshold:
        log(f"machine still busy after {waited:.0f}s (load {load:.2f}); proceeding anyway")
    return load, waited


def _cpu_jiffies() -> tuple[int, int]:
    """(busy jiffies of the whole machine, jiffies used by this process), or zeros."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return 0, 0
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return user + nice + system + irq + softirq + steal, int(own[11]) + int(own[12])


class OtherCpuMeter:
    """Average number of CPUs kept busy by *other* processes between ``start()`` and ``stop()``.

    Unlike the load average it excludes this process, so it tells whether the timings
    shared the machine (0.0 = quiet; 1.0 = one core's worth of someone else's work).
    """

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._busy0, self._own0 = _cpu_jiffies()

    def stop(self) -> float:
        """Other processes' average busy CPUs since construction."""
        busy, own = _cpu_jiffies()
        dt = time.monotonic() - self._t0
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        if dt <= 0 or not busy:
            return float("nan")
        return max(0.0, ((busy - self._busy0) - (own - self._own0)) / hz / dt)


def wait_for_idle_others(
    max_wait: float = 30.0,
    threshold: float = 0.3,
    sample: float = 1.0,
    log: Callable[[str], None] | None = print,
) -> float:
    """Wait up to ``max_wait`` s until other processes use < ``threshold`` CPUs (sampled).

    For use between workloads, where the load average would count this run itself.
    Returns the last sampled value.
    """
    t0 = time.monotonic()
    while True:
        meter = OtherCpuMeter()
        time.sleep(sample)
        busy = meter.stop()
        if not busy >= threshold or time.monotonic() - t0 >= max_wait:
            if log and busy >= threshold:
                log(f"other processes still use {busy:.2f} CPUs; proceeding anyway")
            return busy
        if log:
            log(f"waiting: other processes use {busy:.2f} CPUs")


# --------------------------------------------------------------------------------------------
# Harness
# --------------------------------------------------------------------------------------------


@dataclass
class PeerResult:
    """One peer's outcome for one workload."""

    peer: str
    status: str  # "ok" | "not installed" | "unsupported" | "error"
    version: str = ""
    reason: str = ""
    note: str = ""
    ops_per_s: list[float] = field(default_factory=list)  # one per repeat (wall clock)
    cpu_ops_per_s: list[float] = field(default_factory=list)  # the same rounds by this process's CPU time
    setup_s: float = 0.0
    memory: MemoryResult | None = None  # what the filled buffer holds (None: not measured)

    @property
    def median_ops(self) -> float:
        """Median operations per second over the repeats (NaN when none)."""
        return float(np.median(self.ops_per_s)) if self.ops_per_s else float("nan")

    @property
    def median_cpu_ops(self) -> float:
        """Median operations per CPU-second of this process (NaN when none).

        Steadier than the wall-clock rate on a shared machine: time the scheduler gives to
        other processes is not counted (their cache and memory-bandwidth pressure still is).
        """
        return float(np.median(self.cpu_ops_per_s)) if self.cpu_ops_per_s else float("nan")


@dataclass
class WorkloadResult:
    """All peers' outcomes for one workload, plus the conditions of the run."""

    workload: Workload
    results: list[PeerResult]
    repeats: int
    seconds: float
    load_before: float
    load_after: float
    other_cpu: float = float("nan")  # CPUs busy with other processes while timing

    def get(self, peer: str) -> PeerResult | None:
        """The result of peer ``peer`` (by name), if it took part."""
        return next((r for r in self.results if r.peer == peer), None)


def _make_chunk(workload: Workload, buf: Buffer, rng: np.random.Generator) -> Callable[[], int]:
    """A closure performing ``workload.ops_per_chunk``-ish operations, returning the count."""
    p = workload.params
    n = p.batch_size
    if workload.op == "add_one":
        pool = [buf.prepare_one(tr) for tr in split_transitions(make_transitions(1000, rng))]
        add_one = buf.add_one

        def chunk() -> int:
            for tr in pool:
                add_one(tr)
            return len(pool)

    elif workload.op == "add_batch":
        batches = [buf.prepare_batch(make_transitions(n, rng)) for _ in range(4)]
        add_batch = buf.add_batch

        def chunk() -> int:
            for b in batches:
                add_batch(b)
            return len(batches)

    elif workload.op in ("add_rows", "per_add_rows"):
        # Distinct batches, so no call sees the arrays of the one before; small for small n.
        pool = [buf.prepare_rows(make_transitions(n, rng)) for _ in range(max(4, min(64, 8192 // n)))]
        add_rows = buf.add_rows

        def chunk() -> int:
            for b in pool:
                add_rows(b)
            return len(pool)

    elif workload.op == "sample":
        k = workload.ops_per_chunk
        sample = buf.sample

        def chunk() -> int:
            for _ in range(k):
                sample(n)
            return k

    elif workload.op == "per":
        k = workload.ops_per_chunk
        prios = [buf.prepare_priorities(random_priorities(n, rng)) for _ in range(max(k, 4))]
        per_iteration = buf.per_iteration
        state = {"i": 0}

        def chunk() -> int:
            i = state["i"]
            for j in range(k):
                per_iteration(n, prios[(i + j) % len(prios)])
            state["i"] = i + k
            return k

    else:
        raise ValueError(f"unknown op {workload.op!r}")
    return chunk


def _time(chunk: Callable[[], int], seconds: float) -> tuple[float, float]:
    """``chunk`` called until ``seconds`` of wall time have passed (>= 1 call): operations per
    wall-clock second and per CPU-second of this process (``time.process_time``)."""
    ops = 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    while True:
        ops += chunk()
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            cpu = time.process_time() - c0
            return ops / elapsed, (ops / cpu if cpu > 0 else float("nan"))


def run_workload(
    workload: Workload,
    peers: Sequence[Peer],
    repeats: int = 3,
    seconds: float = 1.0,
    warmup: float = 0.2,
    log: Callable[[str], None] | None = print,
    memory: Callable[[str, WorkloadParams], MemoryResult] | None = None,
) -> WorkloadResult:
    """Time every peer on ``workload`` in this process and return per-repeat rates.

    All buffers are built and pre-filled first (untimed), warmed up, then timed in
    ``repeats`` rounds; each round runs every peer for ``seconds``, in an order rotated
    round by round so drifts in machine load spread over all peers. After the timing, when
    ``memory`` is given (e.g. a :class:`MemoryCache`), each peer that ran gets the memory of
    its filled buffer (measured in a subprocess, after this workload's buffers are freed).
    """
    p = workload.params
    say = log or (lambda _msg: None)
    load_before = read_loadavg()[0]
    results: list[PeerResult] = []
    live: list[tuple[PeerResult, Callable[[], int]]] = []

    fill_data: Batch | None = None
    fill_prio: np.ndarray | None = None
    if p.prefill:
        rng = np.random.default_rng(p.seed + 1)
        fill_data = make_transitions(p.prefill, rng)
        fill_prio = random_priorities(p.prefill, rng) if p.prioritized else None

    for peer in peers:
        res = PeerResult(peer=peer.name, status="ok", note=peer.notes.get(workload.op, ""))
        results.append(res)
        if workload.op not in peer.supports:
            res.status = "unsupported"
            continue
        reason = peer.check()
        if reason is not None:
            res.status, res.reason = "not installed", reason
            continue
        res.version = peer.version()
        try:
            t0 = time.perf_counter()
            buf = peer.make(p)
            if fill_data is not None:
                buf.fill(fill_data, fill_prio)
            chunk = _make_chunk(workload, buf, np.random.default_rng(p.seed + 2))
            res.setup_s = time.perf_counter() - t0
            _time(chunk, warmup)
        except Unsupported as exc:
            res.status, res.reason = "unsupported", str(exc)
            continue
        except Exception as exc:  # noqa: BLE001 - a broken peer must not stop the run
            res.status = "error"
            res.reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            say(f"  {peer.name}: ERROR {res.reason}")
            say(traceback.format_exc(limit=3))
            continue
        say(f"  {peer.name}: ready (setup {res.setup_s:.1f}s)")
        live.append((res, chunk))
    fill_data = fill_prio = None

    meter = OtherCpuMeter()
    for r in range(repeats):
        order = live[r % len(live) :] + live[: r % len(live)] if live else []
        for res, chunk in order:
            gc.collect()
            try:
                wall_rate, cpu_rate = _time(chunk, seconds)
                res.ops_per_s.append(wall_rate)
                res.cpu_ops_per_s.append(cpu_rate)
            except Exception as exc:  # noqa: BLE001
                res.status = "error"
                res.reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                say(f"  {res.peer}: ERROR in round {r + 1}: {res.reason}")
        live = [(res, c) for res, c in live if res.status == "ok"]
        say(f"  round {r + 1}/{repeats} done")

    other_cpu = meter.stop()
    live.clear()
    gc.collect()
    if memory is not None and p.prefill:
        for res in results:
            if res.status == "ok":
                res.memory = memory(res.peer, p)
    return WorkloadResult(
        workload=workload,
        results=results,
        repeats=repeats,
        seconds=seconds,
        load_before=load_before,
        load_after=read_loadavg()[0],
        other_cpu=other_cpu,
    )


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--memory-child":
    _req = json.loads(sys.argv[2])
    print(json.dumps(_memory_child(_req["peer"], WorkloadParams(**_req["params"]))), flush=True)
