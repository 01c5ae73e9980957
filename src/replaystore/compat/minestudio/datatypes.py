"""MineStudio's rollout data types (``minestudio.online.utils.rollout.datatypes``), same fields.

- :class:`FragmentIndex` ``(worker_uuid, fid_in_worker)``: which stream, which fragment of it.
- :class:`FragmentMetadata`: what the replay buffer needs besides the payload.
- :class:`SampleFragment`: ``fragment_length`` steps of one environment (the payload).
- :class:`StepRecord`: one step as a producer stages it.
- :class:`FragmentDataDict`: per-fragment results keyed by index, batched with ``format_batch``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from .utils import auto_stack, auto_to_torch

log = logging.getLogger("replaystore")


@dataclass(frozen=True)
class FragmentIndex:
    """Identifies a fragment: its stream (one environment) and its 0-based number in that stream."""

    worker_uuid: str
    fid_in_worker: int


@dataclass(frozen=True)
class FragmentMetadata:
    """Metadata sent to the replay buffer with a fragment id.

    Attributes:
        model_version: policy version that produced the fragment's first step.
        session_id: training session that produced it.
        worker_uuid: the stream (environment) it comes from.
        fid_in_worker: its sequence number in that stream.
    """

    model_version: int
    session_id: str
    worker_uuid: str
    fid_in_worker: int


@dataclass
class SampleFragment:
    """``T`` consecutive steps of one environment.

    Attributes:
        obs: stacked observations, e.g. ``{"image": uint8 (T, 128, 128, 3)}``.
        action: stacked actions (dict of arrays or an array).
        next_done: bool (T,): step ``t + 1`` starts a new episode.
        reward: float32 (T,): reward received after action ``t``.
        first: bool (T,): step ``t`` starts an episode.
        in_state: recurrent state before step 0 (list of arrays).
        worker_uuid, fid_in_worker: the fragment's index.
        next_obs: the observation after the last step (for bootstrapping).
        episode_uuids: one episode id per step.
    """

    obs: dict[str, Any] | Any
    action: dict[str, Any] | Any
    next_done: np.ndarray
    reward: np.ndarray
    first: np.ndarray
    in_state: list[np.ndarray]
    worker_uuid: str
    fid_in_worker: int
    next_obs: dict[str, Any]
    episode_uuids: list[str]

    @property
    def index(self) -> FragmentIndex:
        """``FragmentIndex(worker_uuid, fid_in_worker)``."""
        return FragmentIndex(self.worker_uuid, self.fid_in_worker)

    def print(self) -> None:
        """Log every field (shapes for arrays)."""
        for f in fields(self):
            v = getattr(self, f.name)
            log.info("%s: %s", f.name, getattr(v, "shape", v))


@dataclass
class StepRecord:
    """One environment step as a producer stages it before building a fragment."""

    worker_uuid: str
    obs: dict[str, Any]
    state: list[np.ndarray] | None
    action: dict[str, Any]
    last_reward: float
    last_terminated: bool
    last_truncated: bool
    model_version: int
    episode_uuid: str
    session_id: str


class FragmentDataDict(dict):
    """``{FragmentIndex: value}`` with :meth:`format_batch`."""

    def format_batch(self, fragments: list[SampleFragment], device: Any) -> Any:
        """Stack the values of ``fragments`` (in order) and move them to ``device`` as torch tensors."""
        return auto_to_torch(auto_stack([self[f.index] for f in fragments]), device)
