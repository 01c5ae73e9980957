"""Table field specs from Gymnasium spaces (Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple).

``spec_from_env(env)`` also accepts vectorised environments: it uses their ``single_*_space``, so
the spec describes one transition and a step of ``n`` environments is inserted with ``extend``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidType
from ..storage.spec import Field


def space_spec(space: Any) -> Any:
    """The per-item spec of one space: a :class:`Field`, or a dict of them for Dict/Tuple spaces.

    Raises:
        InvalidType (a TypeError): a space type with no fixed-shape array form (Text, Graph, Sequence, ...).
    """
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return Field(tuple(space.shape), np.dtype(space.dtype))
    if isinstance(space, spaces.Discrete):
        return Field((), np.dtype(space.dtype or np.int64))
    if isinstance(space, spaces.MultiDiscrete):
        return Field(tuple(space.nvec.shape), np.dtype(space.dtype or np.int64))
    if isinstance(space, spaces.MultiBinary):
        return Field(tuple(np.atleast_1d(space.n)), np.dtype(space.dtype or np.int8))
    if isinstance(space, spaces.Dict):
        return {k: space_spec(s) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return {str(i): space_spec(s) for i, s in enumerate(space.spaces)}
    raise InvalidType(f"no fixed-shape array form for {type(space).__name__}; use storage='objects'")


def transition_spec(observation_space: Any, action_space: Any, next_observation: bool = True) -> dict:
    """The spec of a transition: obs, action, reward (float32), next_obs, terminated, truncated."""
    spec = {
        "obs": space_spec(observation_space),
        "action": space_spec(action_space),
        "reward": Field((), np.dtype(np.float32)),
        "terminated": Field((), np.dtype(bool)),
        "truncated": Field((), np.dtype(bool)),
    }
    if next_observation:
        spec["next_obs"] = space_spec(observation_space)
    return spec


def spec_from_env(env: Any, next_observation: bool = True) -> dict:
    """:func:`transition_spec` of an environment, vectorised or not."""
    obs = getattr(env, "single_observation_space", None) or env.observation_space
    act = getattr(env, "single_action_space", None) or env.action_space
    return transition_spec(obs, act, next_observation)
