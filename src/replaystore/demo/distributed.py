"""``replaystore demo --distributed``: the DQN demo with rollout actors and the Ray replay service.

The same agent, update rule and hyperparameters as :mod:`.train`, split the Ape-X way over a local
Ray instance: the replay service hosts one prioritized table (:func:`service_table`), rollout actors
(:class:`RolloutActor`) write their transitions into it and pull the newest weights through a
:class:`WeightStore`, and the learner (:func:`train_distributed`, this process) samples, trains and
updates priorities. docs/guide_demo.md ("replaystore demo --distributed") describes the run and
its rate limiter; beta annealing without a service call: :func:`minibatches`.

The actors' side lives in :mod:`.actors`, :class:`DistributedConfig` in :mod:`.config`; both are
importable from here too.
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
from dataclasses import fields
from typing import Any, TextIO

import numpy as np

import replaystore as rs
from replaystore import ray as rsr  # does not import Ray
from replaystore.items import Sample
from replaystore.ray._runtime import get as ray_get

from .actors import ACTOR_FIELD, ACTOR_TOTALS, RolloutActor, WeightStore, service_table
from .config import DemoConfig, DistributedConfig, DistributedResult

__all__ = [
    "DistributedConfig",
    "DistributedResult",
    "RolloutActor",
    "WeightStore",
    "minibatches",
    "service_table",
    "train_distributed",
]


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


# -- the learner (driver) -------------------------------------------------------------------------------
def train_distributed(
    config: DemoConfig,
    dist: DistributedConfig | None = None,
    progress: bool = True,
    out: TextIO | None = None,
    on_update: Callable[[int], None] | None = None,
) -> Any:
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
    from .train import PolicySelection, Reporter, record, seed_everything

    dist = DistributedConfig() if dist is None else dist
    out = sys.stderr if out is None else out
    start, cpu_start = time.perf_counter(), time.process_time()
    torch.set_num_threads(config.threads)
    seed_everything(config.seed)
    env = gym.make(config.env_id)
    spec = {**spec_from_env(env), ACTOR_FIELD: rs.Field((), np.dtype(np.int16))}
    obs_dim, n_actions = int(np.prod(env.observation_space.shape)), int(env.action_space.n)
    env.close()
    agent = DQNAgent(obs_dim, n_actions, config)
    result = DistributedResult(config=config, dist=dist)
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
            rsr.init_local(
                address="local",
                num_cpus=dist.num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
        client = rsr.serve(functools.partial(service_table, config, dist, spec), name=name, rpc_grace=dist.rpc_grace)
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
        for name in ACTOR_TOTALS:
            setattr(result, name, [0] * dist.actors)
        report = Reporter(config.total_steps, progress, out, desc=f"DQN+PER Ray x{dist.actors}")
        selection = PolicySelection(agent, config, result, report)

        inflight: dict[Any, int] = {}
        submitted = 0
        env_steps = 0
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

        def absorb(i: int, r: dict[str, Any]) -> None:
            """Keep actor ``i``'s totals from the reply ``r`` of its ``collect``."""
            for name in ACTOR_TOTALS:
                getattr(result, name)[i] = r[name]

        def evaluation(why: str) -> float:
            return selection.evaluate(env_steps, why, f" (update {agent.updates:,})")

        def refresh() -> None:
            nonlocal pending_bar, last_stats_block
            last_stats_block = env_steps // config.stats_every
            eps = config.epsilon(max(result.actor_steps) * dist.actors)
            record(result, client.stats()[client.table_name], env_steps, report, pending_bar, eps, upd=agent.updates)
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
                absorb(i, r)
                submit(i)
            if env_steps // config.stats_every != last_stats_block:
                refresh()
            if agent.updates == 0:
                return False
            recent = result.episode_returns[-config.solved_window :]
            if check_solved and len(recent) == config.solved_window and np.mean(recent) >= config.solved_return:
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
            next_sample = None
            while True:
                if harvest():
                    solved = True
                    break
                try:
                    s = (next_sample or io.submit(draw)).result()
                except rs.Timeout:
                    next_sample = None
                    if not inflight:
                        break  # the actors used up the budget and the rate limiter allows no more samples
                    continue
                # without prefetch, the next draw is queued after this batch's priority update
                next_sample = io.submit(draw) if dist.prefetch else None
                result.sample_calls += 1
                lr = config.learning_rate(env_steps)
                td = np.concatenate(
                    [agent.learn(mb, lr)[0] for mb in minibatches(s, dist.batches_per_call, config.beta(env_steps))]
                )
                updates.append(io.submit(client.update_priorities, s.keys, td + config.priority_eps))
                settle(wait=not dist.prefetch)
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
        refresh()

        # the buffer as the learner left it, then stop the actors and read the final counters
        live = client.keys()
        info = client.info(live)
        result.priorities = info["priorities"]
        result.times_sampled = info["times_sampled"]
        data, _ = client.get(live)
        result.live_by_actor = np.bincount(data[ACTOR_FIELD], minlength=dist.actors).astype(int).tolist()
        client.close()  # wakes actors blocked on the rate limiter with Closed
        for ref, i in list(inflight.items()):
            r = ray_get(ref, dist.rpc_grace, f"actor {i}.collect")
            env_steps += r["steps"]
            pending_bar += r["steps"]
            absorb(i, r)
        inflight.clear()
        result.stats = client.stats()[client.table_name]
        report.advance(pending_bar)
    finally:
        if report is not None:
            report.close()
        for a in [*actors, *([store] if store is not None else [])]:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # noqa: BLE001 - best effort: Ray goes down next anyway
                pass
        if client is not None:
            try:
                client.shutdown()
            except Exception:  # noqa: BLE001
                pass
        if started_ray:
            ray.shutdown()
            result.ray_shutdown = not ray.is_initialized()

    selection.finish(env_steps, start, cpu_start)
    return result
