import numpy as np
import pytest

import replaystore as rs

gym = pytest.importorskip("gymnasium")
from gymnasium import spaces  # noqa: E402

from replaystore.integrations.gym import space_spec, spec_from_env, transition_spec  # noqa: E402


def test_box_discrete_multidiscrete_multibinary():
    assert space_spec(spaces.Box(-1, 1, (3, 2), np.float32)) == rs.Field((3, 2), np.dtype(np.float32))
    assert space_spec(spaces.Box(0, 255, (4, 84, 84), np.uint8)).dtype == np.uint8
    assert space_spec(spaces.Discrete(5)) == rs.Field((), np.dtype(np.int64))
    assert space_spec(spaces.MultiDiscrete([3, 4, 5])) == rs.Field((3,), np.dtype(np.int64))
    assert space_spec(spaces.MultiBinary(6)) == rs.Field((6,), np.dtype(np.int8))


def test_dict_and_tuple_spaces_nest():
    sp = spaces.Dict(
        {
            "image": spaces.Box(0, 255, (8, 8, 3), np.uint8),
            "state": spaces.Tuple((spaces.Discrete(2), spaces.Box(-1, 1, (2,)))),
        }
    )
    spec = space_spec(sp)
    assert spec["image"].shape == (8, 8, 3)
    assert spec["state"]["0"] == rs.Field((), np.dtype(np.int64))
    assert spec["state"]["1"].shape == (2,)


def test_unsupported_space_raises():
    with pytest.raises(TypeError, match="objects"):
        space_spec(spaces.Text(5))


def test_table_from_cartpole_spec_accepts_real_transitions():
    env = gym.make("CartPole-v1")
    t = rs.Table(100, spec=spec_from_env(env))
    obs, _ = env.reset(seed=0)
    action = env.action_space.sample()
    nobs, r, term, trunc, _ = env.step(action)
    t.add({"obs": obs, "action": action, "reward": r, "terminated": term, "truncated": trunc, "next_obs": nobs})
    assert len(t) == 1
    assert t.storage.columns["obs"].dtype == np.float32


def test_vector_env_uses_single_spaces_and_extends_per_step():
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)])
    spec = spec_from_env(envs)
    assert spec["obs"].shape == (4,)
    t = rs.Table(100, spec=spec)
    obs, _ = envs.reset(seed=0)
    actions = envs.action_space.sample()
    nobs, r, term, trunc, _ = envs.step(actions)
    keys = t.extend(
        {
            "obs": obs,
            "action": actions,
            "reward": r.astype(np.float32),
            "terminated": term,
            "truncated": trunc,
            "next_obs": nobs,
        }
    )
    assert len(keys) == 3
    envs.close()


def test_transition_spec_without_next_obs():
    spec = transition_spec(spaces.Box(-1, 1, (2,)), spaces.Discrete(2), next_observation=False)
    assert "next_obs" not in spec and set(spec) == {"obs", "action", "reward", "terminated", "truncated"}
