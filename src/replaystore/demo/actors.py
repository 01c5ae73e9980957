"""The pieces of ``replaystore demo --distributed`` that run in Ray actors (see :mod:`.distributed`).

:class:`WeightStore` (the published weights), :class:`RolloutActor` (an environment stream) and
:func:`service_table` (the replay service's table); each says what it does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

import replaystore as rs
from replaystore import ray as rsr  # does not import Ray

from .config import DemoConfig, DistributedConfig

ACTOR_FIELD = "actor"  # extra field of each transition: the index of the actor that wrote it
#: an actor's running totals in each ``collect`` reply, named as ``DistributedResult`` keeps them
ACTOR_TOTALS = ("actor_steps", "actor_inserts", "actor_episodes", "actor_weight_pulls")


class WeightStore:
    """The newest published weights: a reference into Ray's object store and its version."""

    def __init__(self) -> None:
        self.version = -1
        self.box: list[Any] | None = None

    def publish(self, box: list[Any], version: int) -> None:
        """Keep ``box`` (``[ObjectRef]`` of a state dict) if ``version`` is newer."""
        if version > self.version:
            self.version, self.box = version, box

    def latest(self, known: int) -> tuple[int, list[Any] | None]:
        """``(version, [ObjectRef])`` when newer than ``known``, else ``(known, None)``."""
        return (self.version, self.box) if self.version > known else (known, None)


class RolloutActor:
    """One environment stream: epsilon-greedy on a pulled copy of the Q-network, batched inserts.

    Args:
        service: the replay service's name; table: its table.
        weights: the :class:`WeightStore` actor handle.
        config: the demo hyperparameters (env, network width, epsilon schedule).
        dist: the distributed knobs (sync period, write batch).
        index: this actor's index; it seeds the environment, NumPy and PyTorch with ``seed + index``.
    """

    def __init__(
        self, service: str, table: str, weights: Any, config: DemoConfig, dist: DistributedConfig, index: int
    ) -> None:
        import gymnasium as gym
        import torch

        from .agent import DQNAgent

        torch.set_num_threads(1)
        seed = config.seed + index
        torch.manual_seed(seed)
        self.config, self.dist, self.index = config, dist, index
        self.env = gym.make(config.env_id)
        self.env.action_space.seed(seed)
        self.obs, _ = self.env.reset(seed=seed)
        self.rng = np.random.default_rng(seed)
        self.agent = DQNAgent(
            int(np.prod(self.env.observation_space.shape)), int(self.env.action_space.n), replace(config, device="cpu")
        )
        self.client = rsr.connect(service, table=table, rpc_grace=dist.rpc_grace)
        self.weights = weights
        self.ray = rsr.import_ray()
        self.version = -1
        self.steps = self.inserts = self.episodes = self.pulls = 0
        self.episode_return = 0.0
        self.rows: list[tuple] = []
        self.closed = False

    def _pull(self) -> None:
        version, box = self.ray.get(self.weights.latest.remote(self.version), timeout=self.dist.rpc_grace)
        if box is not None:
            self.agent.restore(self.ray.get(box[0], timeout=self.dist.rpc_grace))
            self.version = version
            self.pulls += 1

    def _flush(self) -> None:
        if not self.rows:
            return
        obs, action, reward, next_obs, terminated, truncated, version = zip(*self.rows)
        n = len(self.rows)
        batch = {
            "obs": np.stack(obs),
            "action": np.asarray(action, np.int64),
            "reward": np.asarray(reward, np.float32),
            "next_obs": np.stack(next_obs),
            "terminated": np.asarray(terminated, bool),
            "truncated": np.asarray(truncated, bool),
            ACTOR_FIELD: np.full(n, self.index, np.int16),
        }
        while True:  # the rate limiter may hold the batch back while the learner catches up
            try:
                self.client.extend(batch, version=np.asarray(version, np.int64), timeout=10.0)
                break
            except rs.Timeout:
                continue
        self.inserts += n
        self.rows = []

    def collect(self, n_steps: int) -> dict[str, Any]:
        """Play ``n_steps`` environment steps; return the steps done, the episodes that ended and the totals.

        Stops early (``closed``) when the service is closed.
        """
        cfg = self.config
        done_steps, episodes = 0, []
        try:
            for _ in range(n_steps):
                if self.steps % self.dist.sync_every == 0:
                    self._pull()
                if self.version < 0:  # nothing published yet: act at random
                    action = int(self.rng.integers(self.agent.n_actions))
                else:
                    action = self.agent.act(self.obs, cfg.epsilon(self.steps * self.dist.actors), self.rng)
                next_obs, reward, terminated, truncated, _ = self.env.step(action)
                self.rows.append((self.obs, action, reward, next_obs, terminated, truncated, max(self.version, 0)))
                self.steps += 1
                done_steps += 1
                self.episode_return += float(reward)
                self.obs = next_obs
                if terminated or truncated:
                    episodes.append((done_steps, self.episode_return))
                    self.episodes += 1
                    self.episode_return = 0.0
                    self.obs, _ = self.env.reset()
                if len(self.rows) >= self.dist.write_batch:
                    self._flush()
            self._flush()
        except rs.Closed:
            self.closed = True
        return {
            "index": self.index,
            "steps": done_steps,
            "episodes": episodes,
            "closed": self.closed,
            **dict(zip(ACTOR_TOTALS, (self.steps, self.inserts, self.episodes, self.pulls))),
        }


def service_table(config: DemoConfig, dist: DistributedConfig, spec: dict) -> rs.Table:
    """The service's table (runs inside the service actor): prioritized, FIFO, sample-to-insert ratio."""
    spi = dist.spi(config)
    return rs.Table(
        capacity=config.capacity,
        sampler=rs.Prioritized(alpha=config.alpha, beta=1.0),  # the learner applies its beta (module doc)
        remover=rs.Fifo(),
        rate_limiter=rs.SampleToInsertRatio(spi, config.learning_starts, spi * dist.slack),
        spec=spec,
        seed=config.seed,
        name="dqn-demo-distributed",
    )
