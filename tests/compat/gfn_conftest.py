"""Shared helpers of the torchgfn-compat tests: one "kit" per container flavour.

- ``builtin``: replaystore's own :class:`TensorContainer` (tensor store path);
- ``generic``: a contract-only container defined here (the buffer stores the containers);
- ``gfn``: torchgfn's HyperGrid ``Trajectories`` / ``StatesContainer`` / ``Transitions``
  (skipped when torchgfn is not installed).

A kit builds containers whose items have given terminating states and log-rewards.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from replaystore.compat.gfn import RankLayout, TensorContainer, TensorStates  # noqa: F401

HAS_GFN = importlib.util.find_spec("gfn") is not None
needs_gfn = pytest.mark.skipif(not HAS_GFN, reason="torchgfn is not installed (optional test extra)")


class ContractContainer:
    """Only what the contract asks for: len, getitem (new container), extend, log_rewards, terminating_states."""

    def __init__(
        self,
        states: torch.Tensor,
        log_rewards: torch.Tensor | None,
        conditions: torch.Tensor | None = None,
        log_probs: torch.Tensor | None = None,
    ) -> None:
        self.states = states
        self._log_rewards = log_rewards
        self.conditions = conditions
        self.log_probs = log_probs

    def __len__(self) -> int:
        return int(self.states.shape[0])

    def __getitem__(self, idx: Any) -> ContractContainer:
        if isinstance(idx, int):
            idx = [idx]

        def pick(t):
            return None if t is None else t[idx]

        return ContractContainer(self.states[idx], pick(self._log_rewards), pick(self.conditions), pick(self.log_probs))

    def extend(self, other: ContractContainer) -> None:
        self.states = torch.cat([self.states, other.states])

        def cat(a, b):
            return None if a is None or b is None else torch.cat([a, b])

        self._log_rewards = cat(self._log_rewards, other._log_rewards)
        self.conditions = cat(self.conditions, other.conditions)
        self.log_probs = cat(self.log_probs, other.log_probs)

    @property
    def log_rewards(self) -> torch.Tensor | None:
        return self._log_rewards

    @property
    def terminating_states(self) -> TensorStates:
        return TensorStates(self.states, self.conditions)

    @property
    def device(self) -> torch.device:
        return self.states.device


def _states_tensor(n: int, states: Any) -> torch.Tensor:
    if states is None:  # distinct states on a 2-D grid, far apart for small n
        return torch.stack([torch.arange(n) % 8, torch.arange(n) // 8], dim=1).long()
    return torch.as_tensor(states, dtype=torch.long).reshape(n, -1)


class Kit:
    """Builds containers of one flavour."""

    name = "abstract"
    env: Any = None
    main_type: str = ""

    def make(self, log_rewards, states=None, conditions=None, log_probs: bool = False) -> Any:
        raise NotImplementedError

    def make_states(self, log_rewards, states=None, conditions=None) -> Any:
        return self.make(log_rewards, states, conditions)

    def other(self) -> Any:
        """A container of a different type."""
        raise NotImplementedError

    @staticmethod
    def rewards(container: Any) -> list[float]:
        return [round(float(x), 4) for x in container.log_rewards]

    @staticmethod
    def terminal(container: Any) -> list[list[int]]:
        return container.terminating_states.tensor.long().tolist()


class BuiltinKit(Kit):
    name = "builtin"
    main_type = "TensorContainer"

    def make(self, log_rewards, states=None, conditions=None, log_probs=False):
        lr = torch.as_tensor(log_rewards, dtype=torch.get_default_dtype())
        n = len(lr)
        cond = None
        if conditions is not None:
            cond = torch.as_tensor(conditions, dtype=torch.get_default_dtype()).reshape(n, -1)
        lp = torch.zeros(n, 3) if log_probs else None
        return TensorContainer(
            _states_tensor(n, states),
            lr,
            cond,
            log_probs=lp,
            estimator_outputs=torch.zeros(n, 2) if log_probs else None,
        )

    def other(self):
        return ContractContainer(torch.zeros(2, 2), torch.zeros(2))


class GenericKit(Kit):
    name = "generic"
    main_type = "ContractContainer"

    def make(self, log_rewards, states=None, conditions=None, log_probs=False):
        lr = torch.as_tensor(log_rewards, dtype=torch.get_default_dtype())
        n = len(lr)
        cond = None
        if conditions is not None:
            cond = torch.as_tensor(conditions, dtype=torch.get_default_dtype()).reshape(n, -1)
        return ContractContainer(_states_tensor(n, states), lr, cond, torch.zeros(n, 3) if log_probs else None)

    def other(self):
        return TensorContainer(torch.zeros(2, 2), torch.zeros(2))


class GfnKit(Kit):
    """HyperGrid(ndim=2, height=8) containers built directly: s0 -> terminal state -> sf."""

    name = "gfn"
    main_type = "Trajectories"

    def __init__(self, ndim: int = 2, height: int = 8) -> None:
        from gfn.gym import HyperGrid

        self.env = HyperGrid(ndim=ndim, height=height, validate_modes=False)

    def make(self, log_rewards, states=None, conditions=None, log_probs=False):
        from gfn.containers import Trajectories

        env = self.env
        lr = torch.as_tensor(log_rewards, dtype=torch.get_default_dtype())
        n = len(lr)
        term = _states_tensor(n, states)
        s0 = env.s0.expand(n, -1)
        sf = env.sf.expand(n, -1)
        st = torch.stack([s0, term, sf], dim=0)
        acts = torch.stack([torch.zeros(n, 1, dtype=torch.long), env.exit_action.expand(n, 1)], dim=0)
        cond = None
        if conditions is not None:
            c = torch.as_tensor(conditions, dtype=torch.get_default_dtype()).reshape(n, -1)
            cond = c.unsqueeze(0).expand(3, n, c.shape[1]).contiguous()
        states_obj = env.states_from_tensor(st)
        if cond is not None:
            states_obj.conditions = cond
        return Trajectories(
            env,
            states=states_obj,
            actions=env.actions_from_tensor(acts),
            terminating_idx=torch.full((n,), 2, dtype=torch.long),
            log_rewards=lr,
            log_probs=torch.zeros(2, n) if log_probs else None,
            estimator_outputs=torch.zeros(2, n, env.n_actions) if log_probs else None,
        )

    def make_states(self, log_rewards, states=None, conditions=None):
        from gfn.containers import StatesContainer

        lr = torch.as_tensor(log_rewards, dtype=torch.get_default_dtype())
        n = len(lr)
        s = self.env.states_from_tensor(_states_tensor(n, states))
        if conditions is not None:
            s.conditions = torch.as_tensor(conditions, dtype=torch.get_default_dtype()).reshape(n, -1)
        return StatesContainer(self.env, states=s, is_terminating=torch.ones(n, dtype=torch.bool), log_rewards=lr)

    def transitions(self, log_rewards, log_probs=False):
        tr = self.make(log_rewards).to_transitions()
        if log_probs:
            tr.log_probs = torch.zeros(len(tr))
        return tr

    def sampled(self, n: int, seed: int = 0):
        """Trajectories sampled by a uniform policy (real, ragged trajectories)."""
        from gfn.estimators import DiscretePolicyEstimator
        from gfn.preprocessors import KHotPreprocessor
        from gfn.samplers import Sampler
        from gfn.utils.modules import DiscreteUniform

        env = self.env
        pf = DiscretePolicyEstimator(
            DiscreteUniform(env.n_actions), env.n_actions, preprocessor=KHotPreprocessor(env.height, env.ndim)
        )
        torch.manual_seed(seed)
        return Sampler(pf).sample_trajectories(env, n=n, save_logprobs=True)

    def other(self):
        return self.make_states([0.0, 1.0])


def make_kit(name: str) -> Kit:
    if name == "builtin":
        return BuiltinKit()
    if name == "generic":
        return GenericKit()
    if not HAS_GFN:
        pytest.skip("torchgfn is not installed (optional test extra)")
    return GfnKit()


KIT_NAMES = ["builtin", "generic", "gfn"]


# -- remote scenarios shared by the Ray and the torch.distributed tests ------------------------------------------
N_TRAINERS = 4


def score_batch(container: Any, sender: Any = None) -> dict[str, float]:
    """The test scoring function: the batch's best log-reward, its size, and whether states only arrived."""
    lr = container.log_rewards
    return {
        "score": float(lr.max()),
        "n": float(len(container)),
        "is_states": float(type(container).__name__ in ("StatesContainer", "TensorContainer")),
    }


def slow_score(container: Any, sender: Any = None) -> dict[str, float]:
    """A scoring function slower than the trainers' timeout."""
    import time

    time.sleep(3.0)
    return {"score": 0.0}


def scenario_batch(kit: Kit, scenario: str, k: int, index: int) -> Any:
    """The k-th batch of trainer ``index``: 4 items; rewards fall with k in the baseline scenario."""
    top = (10.0 - k) if scenario == "baseline" else float(k)
    rewards = [top + 0.1 * j + 0.01 * index for j in range(4)]
    states = [[(index + j) % 8, (k + j) % 8] for j in range(4)]
    return kit.make(rewards, states=states)


def scenario_buffer_kwargs(scenario: str) -> dict[str, Any]:
    """Trainer-side ReplayBuffer options of a scenario."""
    return {
        "sync": {},
        "freq": {"remote_buffer_freq": 2},
        "async": {"async_score": True},
        "baseline": {"baseline_filtering": True, "baseline_refresh_after": 2},
        "scoring_only": {"scoring_only": True},
    }[scenario]


def scenario_manager_kwargs(scenario: str) -> dict[str, Any]:
    """Manager options of a scenario."""
    return {
        "num_training_ranks": N_TRAINERS,
        "scoring_function": score_batch,
        "capacity": 8 if scenario == "baseline" else 100,
    }


def run_scenario_trainer(scenario: str, rb: Any, kit: Kit, index: int) -> dict[str, Any]:
    """The trainer side: adds, collects what ``add`` returned, drains and says goodbye."""
    n_adds = 6
    scores = [rb.add(scenario_batch(kit, scenario, k, index)) for k in range(n_adds)]
    drained = rb.drain_pending_score(10.0)
    rb.close()
    return {
        "scores": scores,
        "drained": drained,
        "total": rb._baseline_total,
        "kept": rb._baseline_kept,
        "skipped": rb._baseline_skipped_sends,
        "baseline": rb._baseline_log_reward,
        "local": len(rb),
    }


def _best(scenario: str, k: int, index: int) -> float:
    top = (10.0 - k) if scenario == "baseline" else float(k)
    return round(top + 0.3 + 0.01 * index, 4)


def check_scenario(scenario: str, results: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """What both backends must show for a scenario."""
    assert len(summary["exited"]) == N_TRAINERS, summary
    assert not summary["dead"]
    received = {k: v["n_items"] for k, v in summary["per_sender"].items()}
    for index, res in enumerate(results):
        scores = res["scores"]
        assert res["local"] == 24  # the local buffer keeps everything (capacity 1000)
        if scenario in ("sync", "scoring_only"):
            assert [round(s["score"], 4) for s in scores] == [_best(scenario, k, index) for k in range(6)]
            assert all(s["n"] == 4 and "baseline_log_reward" in s for s in scores)
            if scenario == "scoring_only":
                assert all(s["is_states"] == 1.0 for s in scores)
        elif scenario == "freq":
            assert scores[0::2] == [None] * 3
            assert [round(s["score"], 4) for s in scores[1::2]] == [_best(scenario, k, index) for k in (1, 3, 5)]
            assert all(s["n"] == 8 for s in scores[1::2])
        elif scenario == "async":
            assert scores[0] is None
            assert [round(s["score"], 4) for s in scores[1:]] == [_best(scenario, k, index) for k in range(5)]
            assert round(res["drained"]["score"], 4) == _best(scenario, 5, index)
        elif scenario == "baseline":
            assert res["total"] == 24 and res["kept"] < 24 and res["skipped"] >= 1
            assert res["baseline"] > float("-inf")
    if scenario == "baseline":
        assert sum(received.values()) == sum(r["kept"] for r in results)
    else:
        assert sum(received.values()) == N_TRAINERS * 24


def make_env_builtin() -> None:
    """The env of the builtin kit (none needed)."""
    return None


def make_env_gfn() -> Any:
    """The env of the gfn kit, built inside a manager."""
    return GfnKit().env


# -- torch.distributed: one spawned process per rank ---------------------------------------------------------
TORCH_SCENARIOS = ["sync", "freq", "async", "baseline", "scoring_only"]


def torch_worker(rank: int, world: int, port: int, kit_name: str, out_dir: str, barrier: Any, flag: Any) -> None:
    """Rank ``world - 1`` is the manager (torchgfn's layout); the others are trainers."""
    import datetime
    import json
    import os

    import torch.distributed as dist

    from replaystore.compat.gfn import ReplayBuffer, ReplayBufferManager
    from replaystore.compat.gfn.torch_backend import send_shutdown

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    layout = RankLayout.build(world, 1)
    manager = layout.managers[0]
    kit = make_kit(kit_name)
    results: dict[str, Any] = {}
    for scenario in TORCH_SCENARIOS:
        if rank == manager:
            m = ReplayBufferManager(kit.env, rank, communication_backend="torch", **scenario_manager_kwargs(scenario))
            results[scenario] = m.run(timeout=60)
        else:
            rb = ReplayBuffer(
                kit.env,
                remote_manager_rank=manager,
                communication_backend="torch",
                remote_timeout=60,
                **scenario_buffer_kwargs(scenario),
            )
            results[scenario] = run_scenario_trainer(scenario, rb, kit, rank)
        barrier.wait(150)  # a trainer that said goodbye must not talk to the next scenario's manager early
    # a manager stops when asked; later sends time out instead of hanging
    if rank == manager:
        m = ReplayBufferManager(kit.env, rank, world - 1, score_batch, communication_backend="torch")
        results["shutdown"] = m.run(timeout=60)
    elif rank == 0:
        rb = ReplayBuffer(kit.env, remote_manager_rank=manager, communication_backend="torch", remote_timeout=60)
        results["shutdown"] = {"score": rb.add(scenario_batch(kit, "sync", 0, rank))}
        send_shutdown(manager)
        flag.set()
    else:
        flag.wait(60)
        rb = ReplayBuffer(kit.env, remote_manager_rank=manager, communication_backend="torch", remote_timeout=2)
        try:
            rb.add(scenario_batch(kit, "sync", 0, rank))
            results["shutdown"] = {"outcome": "answered"}
        except TimeoutError:
            results["shutdown"] = {"outcome": "TimeoutError"}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    barrier.wait(150)
    if rank == manager or rank == 0:
        dist.destroy_process_group()
