"""The remote buffer on a real local Ray instance: 4 trainer actors and named manager actors."""

from __future__ import annotations

import os
import sys
import time

import pytest

ray = pytest.importorskip("ray")

import gfn_conftest as gc  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ray"))
from ray_fixtures import start_ray  # noqa: E402

from replaystore.compat.gfn import ReplayBuffer, ReplayBufferManager  # noqa: E402
from replaystore.errors import Closed  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def ray_cluster():
    here = os.path.dirname(os.path.abspath(__file__))
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([here] + ([old] if old else []))  # workers import gfn_conftest
    start_ray()  # torn down and retried if the start fails (tests/ray/ray_fixtures.py)
    yield
    ray.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


@ray.remote(num_cpus=0)
class Trainer:
    """A trainer actor: builds a buffer connected to a manager and runs a scenario."""

    def __init__(self, kit_name: str = "builtin") -> None:
        self.kits = {kit_name: gc.make_kit(kit_name)}
        self.kit = self.kits[kit_name]

    def run(self, scenario: str, manager: str, index: int, kit_name: str = "builtin") -> dict:
        if kit_name not in self.kits:
            self.kits[kit_name] = gc.make_kit(kit_name)
        kit = self.kits[kit_name]
        rb = ReplayBuffer(kit.env, remote_manager=manager, sender=f"t{index}", **gc.scenario_buffer_kwargs(scenario))
        return gc.run_scenario_trainer(scenario, rb, kit, index)

    def run_forever(self, manager: str, index: int) -> None:
        rb = ReplayBuffer(self.kit.env, remote_manager=manager, sender=f"t{index}")
        k = 0
        while True:
            rb.add(gc.scenario_batch(self.kit, "sync", k, index))
            k += 1
            time.sleep(0.05)

    def try_add(self, manager: str, index: int, **kw) -> str:
        rb = ReplayBuffer(self.kit.env, remote_manager=manager, sender=f"t{index}", **kw)
        try:
            out = rb.add(gc.scenario_batch(self.kit, "sync", 0, index))
            if kw.get("async_score"):
                return repr(rb.drain_pending_score(0.5))
            return repr(out)
        except Exception as exc:  # noqa: BLE001 - the test inspects the type
            return type(exc).__name__


@pytest.fixture(scope="module")
def trainers(ray_cluster):
    actors = [Trainer.remote() for _ in range(gc.N_TRAINERS)]
    ray.get([a.__ray_ready__.remote() for a in actors], timeout=120)
    yield "builtin", actors
    for a in actors:
        ray.kill(a)


def _start(name: str, kit_name: str, **kw):
    return ReplayBufferManager.start(name, env_fn=_env_factory(kit_name), **kw)


def _env_factory(kit_name: str):
    return gc.make_env_builtin if kit_name == "builtin" else gc.make_env_gfn


SCENARIOS = [(s, "builtin") for s in ("sync", "freq", "async", "baseline", "scoring_only")]
SCENARIOS += [(s, "gfn") for s in ("sync", "scoring_only") if gc.HAS_GFN]


@pytest.mark.parametrize(("scenario", "kit_name"), SCENARIOS)
def test_scenario_four_trainers_one_manager(trainers, scenario, kit_name):
    _, actors = trainers
    name = f"mgr-{scenario}-{kit_name}"
    _start(name, kit_name, **gc.scenario_manager_kwargs(scenario))
    results = ray.get([a.run.remote(scenario, name, i, kit_name) for i, a in enumerate(actors)], timeout=120)
    summary = ReplayBufferManager.wait(name, timeout=30)
    gc.check_scenario(scenario, results, summary)
    ReplayBufferManager.kill(name)


def test_two_managers_shard_the_trainers(trainers):
    kit_name, actors = trainers
    layout = gc.RankLayout.build(world_size=6, num_managers=2)  # managers 2 and 5, two trainers each
    names = {m: f"shard-{m}-{kit_name}" for m in layout.managers}
    for m, trainer_ranks in layout.trainers_of.items():
        _start(names[m], kit_name, num_training_ranks=len(trainer_ranks), scoring_function=gc.score_batch, capacity=100)
    trainer_ranks = [r for m in layout.managers for r in layout.trainers_of[m]]
    refs = [a.run.remote("sync", names[layout.manager_of(r)], i) for i, (a, r) in enumerate(zip(actors, trainer_ranks))]
    results = ray.get(refs, timeout=120)
    assert all(len(r["scores"]) == 6 for r in results)
    for m in layout.managers:
        summary = ReplayBufferManager.wait(names[m], timeout=30)
        assert len(summary["exited"]) == 2 and summary["size"] == 48
        ReplayBufferManager.kill(names[m])


def test_trainer_dies_mid_run(trainers):
    kit_name, actors = trainers
    name = f"mgr-death-{kit_name}"
    _start(
        name,
        kit_name,
        num_training_ranks=gc.N_TRAINERS,
        scoring_function=gc.score_batch,
        capacity=100,
        liveness_interval=0.2,
    )
    victim = Trainer.remote(kit_name)
    ray.get(victim.__ray_ready__.remote(), timeout=120)
    victim.run_forever.remote(name, 3)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the victim has sent something
        if ray.get(ray.get_actor(name).summary.remote(), timeout=30)["per_sender"].get("t3", {}).get("n_requests"):
            break
        time.sleep(0.1)
    ray.kill(victim)
    results = ray.get([a.run.remote("sync", name, i) for i, a in enumerate(actors[:3])], timeout=120)
    assert all(len(r["scores"]) == 6 for r in results)
    summary = ReplayBufferManager.wait(name, timeout=30)
    assert summary["dead"] == ["t3"] and len(summary["exited"]) == 3
    ReplayBufferManager.kill(name)


def test_shutdown_when_asked_and_exit_when_done(trainers):
    kit_name, actors = trainers
    name = f"mgr-shutdown-{kit_name}"
    handle = _start(name, kit_name, num_training_ranks=gc.N_TRAINERS, capacity=100)
    assert ray.get(actors[0].try_add.remote(name, 0), timeout=60).startswith("{")
    summary = ReplayBufferManager.shutdown(name)
    assert summary["size"] == 4
    assert ray.get(actors[1].try_add.remote(name, 1), timeout=60) == "Closed"  # a closed manager refuses data
    ReplayBufferManager.kill(handle)
    assert ray.get(actors[1].try_add.remote(handle, 1), timeout=60) == "Closed"  # and a dead one too

    name = f"mgr-exit-{kit_name}"
    handle = _start(name, kit_name, num_training_ranks=1, capacity=100, exit_when_done=True)
    ReplayBufferManager.send_termination_signal(name, sender="only")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(handle.summary.remote(), timeout=30)
        except (ray.exceptions.RayActorError, Closed):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the manager did not exit after the last goodbye")


def test_timeouts_never_hang_a_trainer(trainers):
    kit_name, actors = trainers
    name = f"mgr-slow-{kit_name}"
    _start(name, kit_name, num_training_ranks=1, capacity=100, scoring_function=gc.slow_score)
    t0 = time.monotonic()
    assert ray.get(actors[0].try_add.remote(name, 0, remote_timeout=0.5), timeout=60) == "TimeoutError"
    assert ray.get(actors[1].try_add.remote(name, 1, async_score=True), timeout=60) == "None"  # drain gives up
    assert time.monotonic() - t0 < 100  # neither call hung (each ray.get has 60 s)
    ReplayBufferManager.kill(name)
