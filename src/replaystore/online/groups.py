"""Rollouts and groups: what a :class:`~replaystore.online.RolloutBuffer` stores and returns.

A *group* is the unit of admission, sampling, reuse and eviction: ``size`` rollouts that belong
together (GRPO: the completions of one prompt). A rollout alone is a group of one. A group is
*pending* until its last member arrives; only complete groups can be sampled.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .versions import VersionRange


@dataclass(frozen=True)
class Rollout:
    """One rollout: its payload, the policy versions that produced it, its length (tokens, steps)."""

    data: Any
    versions: VersionRange
    length: int
    index: int | None = None  # the member's index in its group (idempotent writes), if given


@dataclass
class Group:
    """Rollouts that are admitted, sampled, reused and evicted together.

    Attributes:
        group_id: the producer's id (the ticket when the buffer paces producers).
        size: how many rollouts complete the group.
        members: the rollouts received so far, in arrival order.
        created: wall-clock time of the first member (or of the ticket), for ``group_timeout``.
        order: admission rank of the completed group (its ticket with pacing, else completion
            order; FIFO order; -1 while pending).
        times_sampled: how many samples returned the group.
        arrival: completion rank (-1 while pending); ``freshest`` breaks ties by it.
    """

    group_id: Hashable
    size: int
    members: list[Rollout] = field(default_factory=list)
    created: float = 0.0
    order: int = -1
    times_sampled: int = 0
    arrival: int = -1

    @property
    def complete(self) -> bool:
        """Whether every member arrived."""
        return len(self.members) >= self.size

    @property
    def versions(self) -> VersionRange:
        """The smallest range containing every member's range."""
        lo = min(m.versions.min for m in self.members)
        hi = max(m.versions.max for m in self.members)
        return VersionRange(lo, hi)

    @property
    def lengths(self) -> list[int]:
        """The members' lengths."""
        return [m.length for m in self.members]

    @property
    def tokens(self) -> int:
        """The sum of the members' lengths."""
        return sum(m.length for m in self.members)

    @property
    def indices(self) -> set[int]:
        """The member indices received (members added without an index are not in it)."""
        return {m.index for m in self.members if m.index is not None}

    @property
    def data(self) -> list[Any]:
        """The members' payloads."""
        return [m.data for m in self.members]


@dataclass(frozen=True)
class RolloutBatch:
    """What :meth:`RolloutBuffer.sample` returns: whole groups, plus per-rollout views.

    Attributes:
        groups: the sampled groups (each complete).
        version: the trainer's version when the batch was drawn.
    """

    groups: list[Group]
    version: int

    def __len__(self) -> int:
        return len(self.groups)

    @property
    def rollouts(self) -> list[Rollout]:
        """Every rollout of every group, group by group."""
        return [m for g in self.groups for m in g.members]

    @property
    def data(self) -> list[Any]:
        """Every rollout's payload, group by group."""
        return [m.data for g in self.groups for m in g.members]

    @property
    def group_ids(self) -> list[Hashable]:
        """The sampled groups' ids."""
        return [g.group_id for g in self.groups]

    @property
    def min_versions(self) -> np.ndarray:
        """Per rollout, the oldest version that produced it (int64)."""
        return np.array([m.versions.min for m in self.rollouts], dtype=np.int64)

    @property
    def max_versions(self) -> np.ndarray:
        """Per rollout, the newest version that produced it (int64)."""
        return np.array([m.versions.max for m in self.rollouts], dtype=np.int64)

    @property
    def lengths(self) -> np.ndarray:
        """Per rollout, its length (int64)."""
        return np.array([m.length for m in self.rollouts], dtype=np.int64)

    @property
    def tokens(self) -> int:
        """The sum of the rollouts' lengths."""
        return int(sum(m.length for g in self.groups for m in g.members))

    def staleness(self, end: str = "min") -> np.ndarray:
        """Per rollout, ``version - end`` of its range (``end`` ``"min"``: oldest part)."""
        v = self.min_versions if end == "min" else self.max_versions
        return self.version - v


__all__ = ["Group", "Rollout", "RolloutBatch"]
