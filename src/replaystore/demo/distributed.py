"""``replaystore demo --distributed``: the DQN demo with rollout actors and the Ray replay service.

The same agent, update rule and hyperparameters as :mod:`.train` (``DQNAgent``, ``DemoConfig``), split
the Ape-X way over a local Ray instance:

- **the replay service** (:func:`replaystore.ray.serve`) hosts one prioritized Table:
  ``Prioritized(alpha)``, a ``Fifo`` remover and a ``SampleToInsertRatio`` rate limiter that keeps
  the learner at ``batch_size * gradient_steps / train_every`` sampled items per inserted
  transition (64, one gradient step per environment step, as in the in-process demo), give or
  take ``slack`` environment steps. Fast actors block on ``extend`` and a fast learner on
  ``sample``, so the run learns the same way on a busy or an idle machine.
- **rollout actors** (``actors`` Ray actors, actor ``i`` seeded with ``seed + i``) each play their
  own environment with an epsilon-greedy copy of the Q-network, pull the newest weights every
  ``sync_every`` of their steps from the object store (the learner stores them with ``ray.put`` and
  publishes the reference in a tiny ``WeightStore`` actor) and write their transitions in batches
  of ``write_batch`` with ``client.extend`` (tagged with the writing actor and the weights'
  version).
- **the learner** (this process) samples ``batch_size`` items with ``client.sample``, trains with
  the importance weights, writes ``|td| + eps`` back with ``client.update_priorities``, publishes
  its weights every ``publish_every`` updates, evaluates the greedy policy like the in-process
  demo (every ``eval_every`` environment steps and when the recent training returns reach
  ``solved_return``; stops once an evaluation does) and finally reports a fresh greedy evaluation.

Beta annealing without a service call: the service's sampler uses ``beta = 1``, so a sample's
weights are ``(P(i) / P_min) ** -1``; the learner raises them to ``config.beta(step)``, which gives
exactly the weights a sampler with that beta would have returned.

Ray stays on loopback (:func:`replaystore.ray.init_local`, a new local instance with ``num_cpus``
CPUs and no dashboard) and is shut down at the end, also after an error or Ctrl-C, when this
function started it.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from typing import Any, TextIO

import numpy as np

import replaystore as rs
from replaystore import ray as rsr  # does not import Ray
from replaystore.items import Sample
from replaystore.ray._runtime import get as ray_get

from ..errors import InvalidArgument
from .config import DemoConfig

_ACTOR_FIELD = "actor"  # extra field of each transition: the index of the actor that wrote it


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
        for name in ("actors", "sync_every", "write_batch", "publish_every", "chunk", "slack", "batches_per_call",
                     "num_cpus"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.samples_per_insert is not None and not self.samples_per_insert > 0:
            raise InvalidArgument(f"samples_per_insert must be > 0, got {self.samples_per_insert}")

    def check(self, config: DemoConfig) -> None:
        """Raise :class:`InvalidArgument` (a ``ValueError``) if a write or a sample could never pass."""
        if self.write_batch > 2 * self.slack:
            raise InvalidArgument(f"write_batch ({self.write_batch}) must be <= 2 * slack ({2 * self.slack}): "
                                  "a larger insert never fits the rate limiter's window")
        if config.batch_size * self.batches_per_call > 2 * self.spi(config) * self.slack:
            n = config.batch_size * self.batches_per_call
            raise InvalidArgument(f"a sample of batch_size * batches_per_call = {n} "
                                  "items never fits the rate limiter's window (2 * spi * slack)")

    def spi(self, config: DemoConfig) -> float:
        """The rate limiter's samples per insert."""
        if self.samples_per_insert is not None:
            return float(self.samples_per_insert)
        return config.batch_size * config.gradient_steps / config.train_every


@functools.cache
def _result_class() -> type:
    from .train import DemoResult  # PyTorch, Gymnasium, tqdm: only when a result is made

    @dataclass
    class DistributedResult(DemoResult):
        """:class:`~replaystore.demo.train.DemoResult` plus what only the distributed run has.

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

    DistributedResult.__module__ = __name__
    DistributedResult.__qualname__ = "DistributedResult"
    return DistributedResult


def __getattr__(name: str) -> Any:
    # ``DistributedResult`` subclasses DemoResult, whose module imports PyTorch: build it on first use
    # so that importing this module (the CLI's --help reads DistributedConfig) stays light.
    if name == "DistributedResult":
        return _result_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the pieces that run in Ray actors ----------------------------------------------------------------
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

    def __init__(self, service: str, table: str, weights: Any, config: DemoConfig, dist: DistributedConfig,
                 index: int) -> None:
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
        self.agent = DQNAgent(int(np.prod(self.env.observation_space.shape)), int(self.env.action_space.n),
                              replace(config, device="cpu"))
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
        batch = {"obs": np.stack(obs), "action": np.asarray(action, np.int64),
                 "reward": np.asarray(reward, np.float32), "next_obs": np.stack(next_obs),
                 "terminated": np.asarray(terminated, bool), "truncated": np.asarray(truncated, bool),
                 _ACTOR_FIELD: np.full(n, self.index, np.int16)}
        while True:  # the rate limiter may hold the batch back while the learner catches up
            try:
                self.client.extend(batch, version=np.asarray(version, np.int64), timeout=10.0)
                break
            except rs.Timeout:
                continue
        self.inserts += n
        self.rows = []

    def collect(self, n_steps: int) -> dict[str, Any]:
        """Play ``n_steps`` environment steps; return the steps done and the episodes that ended.

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
        return {"index": self.index, "steps": done_steps, "episodes": episodes, "closed": self.closed,
                "total_steps": self.steps, "inserts": self.inserts, "episodes_total": self.episodes,
                "pulls": self.pulls}


def minibatches(sample: Sample, k: int, beta: float) -> list[Sample]:
    """Split ``sample`` into ``k`` equal minibatches with importance weights for ``beta``.

    The service's sampler runs with ``beta = 1``, so ``sample.weights ** beta`` are the weights of
    a sampler with exponent ``beta`` (both are normalised by the table's smallest probability).
    The data arrays are copied: Ray hands over read-only ones, which PyTorch warns about.
    """
    n = len(sample) // k
    weights = np.power(sample.weights, beta)
    out = []
    for j in range(k):
        sl = slice(j * n, (j + 1) * n)
        meta = {f.name: getattr(sample, f.name)[sl] for f in fields(sample) if f.name not in ("data", "weights")}
        out.append(Sample(data={key: np.array(v[sl]) for key, v in sample.data.items()}, weights=weights[sl], **meta))
    return out


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


# -- the learner (driver) -------------------------------------------------------------------------------
def train_distributed(config: DemoConfig, dist: DistributedConfig | None = None, progress: bool = True,
                      out: TextIO | None = None,
                      on_update: Callable[[int], None] | None = None) -> Any:
    """Train DQN with prioritized replay from rollout actors through the Ray replay service.

    Args:
        config: the DQN hyperparameters (:class:`DemoConfig`); ``total_steps`` is the budget of
            environment steps over all actors.
        dist: the distributed knobs (:class:`DistributedConfig`).
        progress: a tqdm bar (environment steps, learner updates, actor returns, buffer stats);
            without it, one line per evaluation.
        out: where progress and messages go (default ``sys.stderr``).
        on_update: called with the learner's gradient-step count after each sample call (every
            ``dist.batches_per_call`` gradient steps).

    Returns a ``DistributedResult`` (a :class:`~replaystore.demo.train.DemoResult` with the
    actors' and the service's counters), which :func:`~replaystore.demo.plot.plot_result` draws.

    Starts a local Ray instance (loopback, ``dist.num_cpus`` CPUs, no dashboard) unless Ray is
    initialized already, and shuts it down at the end (also after an error or Ctrl-C) if it started it.
    """
    import gymnasium as gym
    import torch

    from replaystore.integrations.gym import spec_from_env

    from .agent import DQNAgent
    from .train import _FINAL_SEED, _SELECTION_SEED, _Reporter, evaluate, seed_everything

    dist = DistributedConfig() if dist is None else dist
    out = sys.stderr if out is None else out
    start, cpu_start = time.perf_counter(), time.process_time()
    torch.set_num_threads(config.threads)
    seed_everything(config.seed)
    env = gym.make(config.env_id)
    spec = {**spec_from_env(env), _ACTOR_FIELD: rs.Field((), np.dtype(np.int16))}
    obs_dim, n_actions = int(np.prod(env.observation_space.shape)), int(env.action_space.n)
    env.close()
    agent = DQNAgent(obs_dim, n_actions, config)
    result = _result_class()(config=config, dist=dist)
    dist.check(config)

    ray = rsr.import_ray()
    started_ray = not ray.is_initialized()
    name = f"replaystore-demo-{uuid.uuid4().hex[:8]}"
    client = None
    actors: list[Any] = []
    store = None
    report = None
    try:
        if started_ray:
            # address="local": always a new instance of our own, never a cluster someone else started
            rsr.init_local(address="local", num_cpus=dist.num_cpus, include_dashboard=False,
                           log_to_driver=False, logging_level=logging.WARNING)
        client = rsr.serve(functools.partial(service_table, config, dist, spec), name=name,
                           rpc_grace=dist.rpc_grace)
        store = ray.remote(num_cpus=0)(WeightStore).remote()
        version = 0

        def publish() -> None:
            nonlocal version
            version += 1
            store.publish.remote([ray.put(agent.snapshot())], version)
            client.set_version(version)
            result.weight_versions = version

        publish()
        actor_cls = ray.remote(num_cpus=0)(RolloutActor)
        actors = [actor_cls.remote(name, client.table_name, store, config, dist, i) for i in range(dist.actors)]
        result.actor_steps = [0] * dist.actors
        result.actor_inserts = [0] * dist.actors
        result.actor_episodes = [0] * dist.actors
        result.actor_weight_pulls = [0] * dist.actors
        report = _Reporter(config.total_steps, False, out)
        if progress:  # the in-process demo's bar, named after the actors
            from tqdm.auto import tqdm

            report.bar = tqdm(total=config.total_steps, unit="step", desc=f"DQN+PER Ray x{dist.actors}", file=out,
                              dynamic_ncols=True, mininterval=0.5, smoothing=0.1)

        inflight: dict[Any, int] = {}
        submitted = 0
        env_steps = 0
        best: tuple[float, dict[str, Any] | None] = (-np.inf, None)
        last_eval_block = 0
        last_stats_block = -1
        pending_bar = 0
        solved = False

        def submit(i: int) -> None:
            nonlocal submitted
            n = min(dist.chunk, config.total_steps - submitted)
            if n > 0:
                inflight[actors[i].collect.remote(n)] = i
                submitted += n

        def evaluation(why: str) -> float:
            nonlocal best
            mean = float(evaluate(agent, config.env_id, config.eval_episodes, _SELECTION_SEED + env_steps).mean())
            result.evaluations.append((env_steps, mean))
            if mean >= best[0]:
                best = (mean, agent.snapshot())
            report.message(f"step {env_steps:>7,} (update {agent.updates:,}): greedy evaluation ({why}) over "
                           f"{config.eval_episodes} episodes: {mean:.1f}")
            return mean

        def record() -> None:
            nonlocal pending_bar, last_stats_block
            st = client.stats()[client.table_name]
            last_stats_block = env_steps // config.stats_every
            result.ratio_steps.append(env_steps)
            result.ratio_values.append(st["sample_to_insert_ratio"])
            rets = result.episode_returns
            report.advance(
                pending_bar,
                upd=agent.updates,
                ret=f"{rets[-1]:.0f}" if rets else "-",
                avg10=f"{np.mean(rets[-10:]):.0f}" if rets else "-",
                eps=f"{config.epsilon(max(result.actor_steps) * dist.actors):.2f}",
                size=st["size"],
                pmax=f"{st['priority_max']:.2f}",
                spi=f"{st['sample_to_insert_ratio']:.1f}",
            )
            pending_bar = 0

        def harvest() -> bool:
            """Collect finished actor calls, queue new ones, evaluate; return True once solved."""
            nonlocal env_steps, pending_bar, last_eval_block
            if not inflight:
                return False
            ready, _ = ray.wait(list(inflight), num_returns=len(inflight), timeout=0)
            if not ready:
                return False
            check_solved = False
            for ref in ready:
                i = inflight.pop(ref)
                r = ray_get(ref, dist.rpc_grace, f"actor {i}.collect")
                base = env_steps
                env_steps += r["steps"]
                pending_bar += r["steps"]
                for offset, ret in r["episodes"]:
                    result.episode_returns.append(ret)
                    result.episode_end_steps.append(base + offset)
                    check_solved = True
                result.actor_steps[i] = r["total_steps"]
                result.actor_inserts[i] = r["inserts"]
                result.actor_episodes[i] = r["episodes_total"]
                result.actor_weight_pulls[i] = r["pulls"]
                submit(i)
            if env_steps // config.stats_every != last_stats_block:
                record()
            if agent.updates == 0:
                return False
            recent = result.episode_returns[-config.solved_window:]
            if (check_solved and len(recent) == config.solved_window
                    and np.mean(recent) >= config.solved_return):
                if evaluation("recent training returns are high") >= config.solved_return:
                    return True
                last_eval_block = env_steps // config.eval_every
            if env_steps // config.eval_every > last_eval_block:
                last_eval_block = env_steps // config.eval_every
                if evaluation("periodic") >= config.solved_return:
                    return True
            return False

        for i in range(dist.actors):  # one call running and one queued per actor
            submit(i)
            submit(i)

        # The learner's Ray calls run in one I/O thread, in order: the next batch is sampled while
        # this one trains, and the priority update of batch k reaches the service before batch
        # k + 2 is drawn (batch k + 1 may not see it yet; Ape-X's learner works the same way).
        io = ThreadPoolExecutor(1, thread_name_prefix="replaystore-learner-io")

        def draw() -> Any:
            return client.sample(config.batch_size * dist.batches_per_call, timeout=dist.sample_timeout)

        updates: deque[Future] = deque()

        def settle(wait: bool) -> None:
            while updates and (wait or updates[0].done()):
                result.priorities_applied += updates.popleft().result()

        try:
            next_sample = io.submit(draw) if dist.prefetch else None
            while True:
                if harvest():
                    solved = True
                    break
                try:
                    s = next_sample.result() if dist.prefetch else draw()
                except rs.Timeout:
                    if not inflight:
                        break  # the actors used up the budget and the rate limiter allows no more samples
                    next_sample = io.submit(draw) if dist.prefetch else None
                    continue
                if dist.prefetch:
                    next_sample = io.submit(draw)
                result.sample_calls += 1
                lr = config.learning_rate(env_steps)
                td = np.concatenate([agent.learn(mb, lr)[0] for mb in
                                     minibatches(s, dist.batches_per_call, config.beta(env_steps))])
                if dist.prefetch:
                    updates.append(io.submit(client.update_priorities, s.keys, td + config.priority_eps))
                    settle(wait=False)
                else:
                    result.priorities_applied += client.update_priorities(s.keys, td + config.priority_eps)
                result.priority_updates += 1
                if agent.updates // dist.publish_every > (agent.updates - dist.batches_per_call) // dist.publish_every:
                    publish()
                if on_update is not None:
                    on_update(agent.updates)
            settle(wait=True)
            if next_sample is not None:  # a batch drawn ahead and not trained on, or a Timeout
                next_sample.exception()
        finally:
            io.shutdown(wait=True, cancel_futures=True)
        if solved:
            result.solved_at = env_steps
        record()

        # the buffer as the learner left it, then stop the actors and read the final counters
        live = client.keys()
        info = client.info(live)
        result.priorities = info["priorities"]
        result.times_sampled = info["times_sampled"]
        data, _ = client.get(live)
        result.live_by_actor = np.bincount(data[_ACTOR_FIELD], minlength=dist.actors).astype(int).tolist()
        client.close()  # wakes actors blocked on the rate limiter with Closed
        for ref, i in list(inflight.items()):
            r = ray_get(ref, dist.rpc_grace, f"actor {i}.collect")
            env_steps += r["steps"]
            pending_bar += r["steps"]
            result.actor_steps[i] = r["total_steps"]
            result.actor_inserts[i] = r["inserts"]
            result.actor_episodes[i] = r["episodes_total"]
            result.actor_weight_pulls[i] = r["pulls"]
        inflight.clear()
        result.stats = client.stats()[client.table_name]
        report.advance(pending_bar)
    finally:
        if report is not None:
            report.close()
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - best effort: Ray goes down next anyway
                pass
        if store is not None:
            try:
                ray.kill(store, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        if client is not None:
            try:
                client.shutdown()
            except Exception:  # noqa: BLE001
                pass
        if started_ray:
            ray.shutdown()
            result.ray_shutdown = not ray.is_initialized()

    if best[1] is not None:
        agent.restore(best[1])
    result.steps = env_steps
    result.updates = agent.updates
    result.final_returns = evaluate(agent, config.env_id, config.eval_episodes,
                                          _FINAL_SEED + config.seed * 1000)
    result.wall_time = time.perf_counter() - start
    result.cpu_time = time.process_time() - cpu_start
    return result
