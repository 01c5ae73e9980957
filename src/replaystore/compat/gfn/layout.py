"""Which trainers report to which manager: torchgfn's rank layout, reused for Ray shards.

``world_size - num_managers`` trainers are split into ``num_managers`` contiguous chunks (sizes
differ by at most one, larger chunks first); each chunk is followed by its manager, so the last
rank of every group of (trainers + 1) is a manager. World 8 with 2 managers: managers ``[3, 7]``
serving ``[0, 1, 2]`` and ``[4, 5, 6]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RankLayout:
    """Manager ranks and the trainer ranks each one serves."""

    world_size: int
    num_managers: int
    managers: list[int] = field(default_factory=list)
    trainers_of: dict[int, list[int]] = field(default_factory=dict)

    @classmethod
    def build(cls, world_size: int, num_managers: int) -> RankLayout:
        """The contiguous layout described in the module docstring."""
        if num_managers < 1 or world_size < 2 * num_managers:
            raise ValueError(f"need at least one trainer per manager: world {world_size}, managers {num_managers}")
        n_train = world_size - num_managers
        base, extra = divmod(n_train, num_managers)
        managers, trainers_of, rank = [], {}, 0
        for i in range(num_managers):
            size = base + (1 if i < extra else 0)
            trainers = list(range(rank, rank + size))
            manager = rank + size
            managers.append(manager)
            trainers_of[manager] = trainers
            rank = manager + 1
        return cls(world_size, num_managers, managers, trainers_of)

    def manager_of(self, rank: int) -> int:
        """The manager a trainer rank reports to (``ValueError`` for a manager rank)."""
        for manager, trainers in self.trainers_of.items():
            if rank in trainers:
                return manager
        raise ValueError(f"rank {rank} is not a trainer")

    def is_manager(self, rank: int) -> bool:
        """Whether ``rank`` is a manager."""
        return rank in self.trainers_of
