"""The distributed DQN demo (rollout actors + the Ray replay service + a learner in this process).

One short run on a real local Ray instance (module fixture, about 15-30 s on two busy cores) feeds
the smoke checks; the full CartPole run is marked ``slow``.
"""

import io
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")
pytest.importorskip("tqdm")
pytest.importorskip("matplotlib")
ray = pytest.importorskip("ray")

import replaystore as rs  # noqa: E402
from replaystore import cli  # noqa: E402
from replaystore.demo import DemoConfig, distributed  # noqa: E402
from replaystore.demo.distributed import DistributedConfig, minibatches, train_distributed  # noqa: E402
from replaystore.demo.plot import plot_result  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def tiny(**kw) -> DemoConfig:
    # capacity above the step budget: nothing is evicted, so the live items show every insert
    base = dict(
        total_steps=640,
        learning_starts=200,
        capacity=1_000,
        batch_size=16,
        hidden=16,
        eval_every=320,
        eval_episodes=2,
        stats_every=64,
        eps_decay_steps=300,
    )
    base.update(kw)
    return DemoConfig(**base)


TINY_DIST = DistributedConfig(actors=2, chunk=64, sync_every=32, write_batch=16, publish_every=16, slack=64)


@pytest.fixture(scope="module")
def run():
    """One short distributed run: (result, progress text, seconds)."""
    if ray.is_initialized():  # a Ray left over by another module: the demo must start (and stop) its own
        ray.shutdown()
    buf = io.StringIO()
    start = time.perf_counter()
    result = train_distributed(tiny(), TINY_DIST, progress=True, out=buf)
    return result, buf.getvalue(), time.perf_counter() - start


def test_service_received_inserts_from_every_actor(run):
    r, _, _ = run
    assert r.steps == 640 and sum(r.actor_steps) == 640
    assert all(n > 0 for n in r.actor_inserts) and len(r.actor_inserts) == 2
    # the service's own counters and data: every insert arrived, each item tagged by its writer
    assert r.stats["inserts"] == sum(r.actor_inserts) == r.stats["size"]
    assert r.live_by_actor == r.actor_inserts
    assert all(n > 0 for n in r.actor_weight_pulls) and r.weight_versions > 1
    assert sum(r.actor_episodes) == len(r.episode_returns) > 0


def test_learner_sampled_and_updated_priorities(run):
    r, _, _ = run
    assert r.updates >= 300  # a few hundred gradient steps
    # batches_per_call gradient steps per sample call, one priority update per sample call
    assert r.updates == r.sample_calls * TINY_DIST.batches_per_call
    assert r.priority_updates == r.sample_calls
    assert r.stats["samples"] >= 16 * r.updates  # plus at most one batch drawn ahead
    assert r.priorities_applied > 0
    assert r.times_sampled.sum() > 0 and (r.priorities > 0).all()
    # priorities now hold |td| + eps: no longer all the initial largest-seen value
    assert len(np.unique(r.priorities)) > 10
    # the rate limiter kept the pace: batch_size sampled items per insert, give or take the slack
    assert r.stats["sample_to_insert_ratio"] <= 16 * (640 - 200 + 64 + 16) / 640
    assert r.ratio_values  # recorded (its first value depends on how actors and learner interleave)
    assert len(r.final_returns) == 2 and np.isfinite(r.final_return)
    assert [s for s, _ in r.evaluations][:1] == [320] or r.solved_at is not None


def test_ray_was_shut_down(run):
    r, _, _ = run
    assert r.ray_shutdown and not ray.is_initialized()


def test_progress_and_figure(run, tmp_path):
    r, text, seconds = run
    assert "DQN+PER Ray x2" in text and "640/640" in text
    for part in ("upd=", "ret=", "avg10=", "size=", "pmax=", "spi="):
        assert part in text
    assert "greedy evaluation (periodic)" in text
    out = tmp_path / "dist.png"
    titles = plot_result(r, out)
    assert out.read_bytes()[:8] == PNG and len(titles) == 4
    assert seconds < 240, seconds  # a smoke run (37 s at load 27 on 2 cores), not a training run


def test_cli_distributed_branch(run, tmp_path, capsys, monkeypatch):
    """The command's wiring (options, output, figure) on the run above, without a second Ray start."""
    seen = {}

    def fake(config, dist, progress):
        seen.update(config=config, dist=dist, progress=progress)
        return run[0]

    monkeypatch.setattr(distributed, "train_distributed", fake)
    out = tmp_path / "fig" / "d.png"
    code = cli.main(
        [
            "demo",
            "--distributed",
            "--actors",
            "3",
            "--sync-every",
            "16",
            "--write-batch",
            "8",
            "--batches-per-call",
            "2",
            "--steps",
            "5000",
            "--seed",
            "4",
            "--eval-episodes",
            "2",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    d = seen["dist"]
    assert (d.actors, d.sync_every, d.write_batch, d.batches_per_call) == (3, 16, 8, 2)
    assert seen["config"].total_steps == 5000 and seen["config"].seed == 4 and seen["progress"] is False
    text = capsys.readouterr().out
    assert "final average return over 2 greedy evaluation episodes" in text
    assert "actors: env steps" in text and "sample/insert ratio" in text and str(out) in text
    assert out.read_bytes()[:8] == PNG


def test_distributed_options_need_distributed(capsys):
    assert cli.main(["demo", "--actors", "3"]) == 2
    assert "--actors" in capsys.readouterr().err


def test_impossible_write_batch_is_refused_before_starting_ray(capsys):
    assert cli.main(["demo", "--distributed", "--write-batch", "100000"]) == 2
    assert "write_batch" in capsys.readouterr().err
    assert not ray.is_initialized()


def test_help_explains_the_distributed_options(capsys):
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    out = capsys.readouterr().out
    for option in (
        "--distributed",
        "--actors",
        "--sync-every",
        "--write-batch",
        "--batches-per-call",
        "object store",
        "Ray",
    ):
        assert option in out


def test_importing_the_module_stays_light():
    code = (
        "import sys, replaystore.demo.distributed as d; d.DistributedConfig(); "
        "assert 'torch' not in sys.modules and 'ray' not in sys.modules, 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_config_validation():
    with pytest.raises(ValueError):
        DistributedConfig(actors=0)
    with pytest.raises(ValueError):
        DistributedConfig(samples_per_insert=0)
    with pytest.raises(ValueError, match="write_batch"):
        DistributedConfig(write_batch=600, slack=256).check(DemoConfig())
    DistributedConfig(write_batch=512, slack=256).check(DemoConfig())
    assert DistributedConfig().spi(DemoConfig()) == 64.0
    assert DistributedConfig(samples_per_insert=8).spi(DemoConfig()) == 8.0


def test_minibatches_rescale_weights_to_any_beta():
    """weights ** beta of a beta=1 sampler are the weights a beta sampler returns (same draws)."""

    def table(beta):
        t = rs.Table(capacity=100, sampler=rs.Prioritized(alpha=0.6, beta=beta), seed=3)
        t.extend({"x": np.arange(100, dtype=np.float32)}, priorities=np.linspace(0.1, 5.0, 100))
        return t

    a, b = table(1.0).sample(32), table(0.55).sample(32)
    assert np.array_equal(a.keys, b.keys)
    parts = minibatches(a, 4, 0.55)
    assert [len(p) for p in parts] == [8, 8, 8, 8]
    assert np.allclose(np.concatenate([p.weights for p in parts]), b.weights)
    assert np.array_equal(np.concatenate([p.keys for p in parts]), a.keys)
    assert np.array_equal(np.concatenate([p.data["x"] for p in parts]), a.data["x"])
    assert parts[0].data["x"].flags.writeable


@pytest.mark.slow
def test_full_distributed_demo_solves_cartpole(tmp_path, capsys, request):
    """``replaystore demo --distributed`` reaches >= 450 within a few minutes (seed 0, 2 actors).

    Runs only when selected with ``-m slow`` (two to four minutes on two busy cores).
    """
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("full distributed demo run: select it with -m slow")
    if ray.is_initialized():
        ray.shutdown()
    out = tmp_path / "dist.png"
    start = time.perf_counter()
    assert cli.main(["demo", "--distributed", "--no-progress", "--out", str(out)]) == 0
    elapsed = time.perf_counter() - start
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("final average return over 20"))
    final = float(line.split(":")[1].split()[0])
    assert final >= 450, text
    assert elapsed < 420, elapsed
    assert out.read_bytes()[:8] == PNG
    assert not ray.is_initialized()
