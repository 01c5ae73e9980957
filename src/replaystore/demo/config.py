"""Hyperparameters and results of the DQN demo and its distributed variant (no heavy imports: the CLI reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ..errors import InvalidArgument


@dataclass(frozen=True)
class DemoConfig:
    """Every knob of the demo; the defaults solve CartPole-v1 in a few minutes on two CPU cores.

    Attributes:
        seed: seeds PyTorch, NumPy, the environment, the evaluation episodes and the table.
        total_steps: budget of environment steps (training stops earlier once solved).
        env_id: Gymnasium environment id (discrete actions, vector observations).
        device: PyTorch device of the Q-network (``"cpu"``, ``"cuda"``, ...).
        threads: PyTorch intra-op threads (``torch.set_num_threads``).
        hidden: width of the two hidden layers of the Q-network.
        lr, lr_final: Adam learning rate, decayed linearly from ``lr`` to ``lr_final`` over
            ``total_steps``.
        gamma: discount factor.
        n_step: 1 for one-step TD targets; ``n > 1`` stores steps in an episodic table and trains
            on ``Table.sample_nstep(batch_size, n, gamma)``: ``R + gamma**k * Q(s_{t+k})``, ``k <= n``,
            cut at termination (no bootstrap), truncation and the newest step.
        batch_size: transitions per gradient step.
        capacity: table capacity (oldest transitions leave first).
        learning_starts: the table's ``MinSize``: no gradient step before this many transitions.
        train_every, gradient_steps: ``gradient_steps`` updates every ``train_every`` env steps.
        target_tau: Polyak factor of the target network, applied after every gradient step.
        max_grad_norm: gradient-norm clipping.
        eps_start, eps_end, eps_decay_steps: epsilon-greedy exploration, linear decay.
        alpha: priority exponent of the prioritized sampler.
        beta_start, beta_end: importance-sampling exponent, annealed linearly over ``total_steps``.
        priority_eps: added to ``|td error|`` so that no transition gets priority 0.
        solved_return: training stops once the moving average of the last ``solved_window``
            training episodes reaches this and a greedy evaluation confirms it.
        solved_window: episodes in the moving average that triggers a confirming evaluation.
        pass_return: the run is reported "solved" when the final evaluation (fresh greedy
            episodes) averages at least this; the figure draws this bar (CartPole-v1: 450, a
            little below the stopping bar, since fresh episodes vary).
        eval_every: also evaluate every this many env steps (the best policy is kept).
        eval_episodes: episodes of each evaluation, and of the final one.
        stats_every: record the table's sample-to-insert ratio every this many env steps.
    """

    seed: int = 0
    total_steps: int = 60_000
    env_id: str = "CartPole-v1"
    device: str = "cpu"
    threads: int = 1
    hidden: int = 128
    lr: float = 1e-3
    lr_final: float = 1e-4
    gamma: float = 0.99
    n_step: int = 1
    batch_size: int = 64
    capacity: int = 50_000
    learning_starts: int = 1_000
    train_every: int = 1
    gradient_steps: int = 1
    target_tau: float = 0.005
    max_grad_norm: float = 10.0
    eps_start: float = 1.0
    eps_end: float = 0.02
    eps_decay_steps: int = 10_000
    alpha: float = 0.6
    beta_start: float = 0.4
    beta_end: float = 1.0
    priority_eps: float = 1e-3
    solved_return: float = 475.0
    solved_window: int = 10
    pass_return: float = 450.0
    eval_every: int = 2_500
    eval_episodes: int = 20
    stats_every: int = 250

    @property
    def figure_name(self) -> str:
        """The default PNG name: ``replaystore-demo.png``, ``replaystore-demo-nstep3.png`` with ``n_step=3``."""
        return "replaystore-demo.png" if self.n_step <= 1 else f"replaystore-demo-nstep{self.n_step}.png"

    @property
    def title(self) -> str:
        """What is trained: ``DQN + prioritized replay`` (plus `` with 3-step returns`` when ``n_step=3``)."""
        return "DQN + prioritized replay" + (f" with {self.n_step}-step returns" if self.n_step > 1 else "")

    def linear(self, start: float, end: float, step: int, horizon: int) -> float:
        """``start`` moved linearly towards ``end`` over ``horizon`` steps, then held."""
        frac = step / max(1, horizon)
        return end if frac >= 1.0 else start + frac * (end - start)

    def epsilon(self, step: int) -> float:
        """Exploration rate at env step ``step``."""
        return self.linear(self.eps_start, self.eps_end, step, self.eps_decay_steps)

    def beta(self, step: int) -> float:
        """Importance-sampling exponent at env step ``step``."""
        return self.linear(self.beta_start, self.beta_end, step, self.total_steps)

    def learning_rate(self, step: int) -> float:
        """Learning rate at env step ``step``."""
        return self.linear(self.lr, self.lr_final, step, self.total_steps)


@dataclass(frozen=True)
class DistributedConfig:
    """The knobs of the distributed demo (the DQN ones stay in :class:`DemoConfig`).

    Attributes:
        actors: rollout actors (Ray actors), each with its own environment.
        sync_every: an actor pulls the newest weights every this many of its environment steps.
        write_batch: transitions per ``client.extend`` call (one Ray call per batch).
        publish_every: the learner puts its weights into the object store every this many gradient steps.
        chunk: environment steps per ``collect`` call of an actor (the unit of progress reports;
            each actor always has one call queued behind the running one, so it never idles).
        samples_per_insert: the rate limiter's target of sampled items per inserted transition;
            ``None``: ``batch_size * gradient_steps / train_every`` (the in-process demo's pace).
        slack: how many environment steps actors may run ahead of the learner (or the learner
            ahead of them) before the rate limiter blocks them (``error_buffer = spi * slack``).
        sample_timeout: seconds a ``sample`` call waits for the rate limiter before the learner
            collects finished actor calls and tries again.
        prefetch: sample the next batch (and send the last priority update) in a background
            thread while the learner trains on the current one, hiding the Ray round trips.
        batches_per_call: the learner samples ``batches_per_call * batch_size`` items per Ray call
            and makes that many gradient steps of ``batch_size`` from them, then sends their
            priorities in one ``update_priorities`` call (fewer round trips per gradient step).
        num_cpus: CPUs of the local Ray instance.
        rpc_grace: seconds a client waits for the service beyond an operation's own timeout.
    """

    actors: int = 2
    sync_every: int = 64
    write_batch: int = 32
    publish_every: int = 32
    chunk: int = 256
    samples_per_insert: float | None = None
    slack: int = 256
    sample_timeout: float = 0.5
    prefetch: bool = True
    batches_per_call: int = 4
    num_cpus: int = 2
    rpc_grace: float = 60.0

    def __post_init__(self) -> None:
        for name in (f.name for f in fields(self) if f.type == "int"):  # every count is at least 1
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.samples_per_insert is not None and not self.samples_per_insert > 0:
            raise InvalidArgument(f"samples_per_insert must be > 0, got {self.samples_per_insert}")

    def check(self, config: DemoConfig) -> None:
        """Raise :class:`InvalidArgument` (a ``ValueError``) if a write or a sample could never pass."""
        if self.write_batch > 2 * self.slack:
            raise InvalidArgument(
                f"write_batch ({self.write_batch}) must be <= 2 * slack ({2 * self.slack}): "
                "a larger insert never fits the rate limiter's window"
            )
        if config.batch_size * self.batches_per_call > 2 * self.spi(config) * self.slack:
            n = config.batch_size * self.batches_per_call
            raise InvalidArgument(
                f"a sample of batch_size * batches_per_call = {n} "
                "items never fits the rate limiter's window (2 * spi * slack)"
            )

    def spi(self, config: DemoConfig) -> float:
        """The rate limiter's samples per insert."""
        if self.samples_per_insert is not None:
            return float(self.samples_per_insert)
        return config.batch_size * config.gradient_steps / config.train_every


@dataclass
class DemoResult:
    """Everything the demo measured (what the figure and the summary are drawn from)."""

    config: DemoConfig
    episode_returns: list[float] = field(default_factory=list)
    episode_end_steps: list[int] = field(default_factory=list)
    evaluations: list[tuple[int, float]] = field(default_factory=list)
    ratio_steps: list[int] = field(default_factory=list)
    ratio_values: list[float] = field(default_factory=list)
    final_returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    priorities: np.ndarray = field(default_factory=lambda: np.zeros(0))
    times_sampled: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    stats: dict[str, Any] = field(default_factory=dict)
    steps: int = 0
    updates: int = 0
    solved_at: int | None = None
    wall_time: float = 0.0
    cpu_time: float = 0.0

    @property
    def final_return(self) -> float:
        """Mean return of the final greedy evaluation."""
        return float(np.mean(self.final_returns)) if len(self.final_returns) else float("nan")


@dataclass
class DistributedResult(DemoResult):
    """:class:`DemoResult` plus what only the distributed run has.

    ``steps`` counts the environment steps of every actor; ``stats`` is the service's table
    stats after the actors stopped (so ``stats["inserts"] == sum(actor_inserts)``);
    ``live_by_actor`` counts the live items by the actor that wrote them.
    """

    dist: DistributedConfig = field(default_factory=DistributedConfig)
    actor_steps: list[int] = field(default_factory=list)
    actor_inserts: list[int] = field(default_factory=list)
    actor_episodes: list[int] = field(default_factory=list)
    actor_weight_pulls: list[int] = field(default_factory=list)
    live_by_actor: list[int] = field(default_factory=list)
    sample_calls: int = 0
    priority_updates: int = 0
    priorities_applied: int = 0
    weight_versions: int = 0
    ray_shutdown: bool = False
