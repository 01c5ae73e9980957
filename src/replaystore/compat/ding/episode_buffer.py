"""``EpisodeReplayBuffer``: a naive buffer whose items are whole episodes."""

from __future__ import annotations

from .naive_buffer import NaiveReplayBuffer
from .registry import BUFFER_REGISTRY


@BUFFER_REGISTRY.register("episode")
class EpisodeReplayBuffer(NaiveReplayBuffer):
    """A naive buffer where each item is an episode (a sequence of transitions)."""

    config = {**NaiveReplayBuffer.config, "type": "episode"}

    @property
    def episode_len(self) -> list[int]:
        """Length of each stored episode, in slot order (empty slots are skipped)."""
        with self._lock:
            return [len(ep) for ep in self._data if ep is not None]
