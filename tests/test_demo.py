"""The DQN demo: a fast smoke test by default; the full CartPole run is marked ``slow``."""

import io
import time

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")
pytest.importorskip("tqdm")
pytest.importorskip("matplotlib")

from replaystore import cli  # noqa: E402
from replaystore.demo import DemoConfig  # noqa: E402
from replaystore.demo.plot import moving_average, plot_result  # noqa: E402
from replaystore.demo.train import evaluate, train  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def tiny(**kw) -> DemoConfig:
    base = dict(
        total_steps=600,
        learning_starts=200,
        capacity=400,
        batch_size=16,
        hidden=16,
        eval_every=300,
        eval_episodes=2,
        stats_every=50,
        eps_decay_steps=300,
    )
    base.update(kw)
    return DemoConfig(**base)


def test_train_smoke_writes_four_panel_figure(tmp_path):
    buf = io.StringIO()
    r = train(tiny(), progress=True, out=buf)
    assert r.steps == 600 or r.solved_at is not None
    assert r.updates == r.steps - 200 + 1
    assert len(r.episode_returns) == len(r.episode_end_steps) > 0
    assert [s for s, _ in r.evaluations] == [300, 600][: len(r.evaluations)] and r.evaluations
    assert len(r.final_returns) == 2 and np.isfinite(r.final_return)
    # buffer stats: 600 inserts, FIFO kept the last 400, 16 sampled per update
    assert r.stats["inserts"] == 600 and r.stats["size"] == 400 and len(r.priorities) == 400
    assert r.stats["samples"] == 16 * r.updates
    assert r.times_sampled.sum() > 0 and (r.priorities > 0).all()
    assert r.ratio_steps[0] == 50 and r.ratio_values[-1] == pytest.approx(16 * r.updates / 600)
    assert r.ratio_values[0] == 0.0  # nothing sampled before learning starts
    # progress output: tqdm bar with the step count, episode return and buffer stats
    text = buf.getvalue()
    assert "DQN+PER" in text and "600/600" in text
    for field in ("ret=", "avg10=", "size=400", "pmax=", "spi="):
        assert field in text
    assert "greedy evaluation (periodic)" in text
    out = tmp_path / "demo.png"
    titles = plot_result(r, out)
    assert out.read_bytes()[:8] == PNG
    assert len(titles) == 4
    assert [
        "Learning curve" in titles[0],
        "Priorities" in titles[1],
        "sampled" in titles[2],
        "Sample-to-insert" in titles[3],
    ] == [True] * 4


def test_nstep_smoke_uses_episodic_table_and_nstep_targets():
    """``n_step=3``: steps go in with add_step, batches come from sample_nstep (returns, discount)."""
    import replaystore as rs
    from replaystore.demo.agent import DQNAgent

    if not hasattr(rs, "Episodes"):
        pytest.skip("the episode API is not in this checkout's core yet")
    r = train(tiny(n_step=3), progress=False, out=io.StringIO())
    assert r.steps == 600 or r.solved_at is not None
    assert r.updates == r.steps - 200 + 1
    assert r.stats["inserts"] == r.steps and r.stats["samples"] == 16 * r.updates
    assert (r.priorities > 0).all() and np.isfinite(r.final_return)
    # the n-step target: returns + discount * Q'(next_obs), discount 0 at termination
    cfg = tiny(n_step=3)
    table = rs.Table(
        100, sampler=rs.Uniform(), remover=rs.Fifo(), episodes=rs.Episodes(next_obs_field="next_obs"), seed=0
    )
    obs = np.arange(40, dtype=np.float32).reshape(10, 4)
    for t in range(10):
        table.add_step(
            {
                "obs": obs[t],
                "action": np.int64(t % 2),
                "reward": np.float32(1.0),
                "next_obs": obs[t] + 4,
                "terminated": t == 9,
                "truncated": False,
            },
            terminated=t == 9,
        )
    s = table.sample_nstep(64, 3, cfg.gamma)
    agent = DQNAgent(4, 2, cfg)
    with torch_no_grad():
        q_next = (
            agent.target(torch_tensor(s.next_obs))
            .gather(1, agent.q(torch_tensor(s.next_obs)).argmax(1, keepdim=True))
            .squeeze(1)
            .numpy()
        )
        q = (
            agent.q(torch_tensor(s.data["obs"]))
            .gather(1, torch_tensor(s.data["action"]).long()[:, None])
            .squeeze(1)
            .numpy()
        )
    td, _ = agent.learn(s, lr=0.0)
    expect = np.abs(s.returns + s.discount * q_next - q)
    np.testing.assert_allclose(td, expect, rtol=1e-4, atol=1e-5)
    k = np.minimum(3, 10 - s.data["obs"][:, 0].astype(int) // 4)  # steps left in the episode
    np.testing.assert_allclose(s.returns, (1 - cfg.gamma**k) / (1 - cfg.gamma))
    np.testing.assert_array_equal(s.discount == 0, s.data["obs"][:, 0] // 4 + k == 10)


def torch_no_grad():
    import torch

    return torch.no_grad()


def torch_tensor(x):
    import torch

    return torch.as_tensor(np.asarray(x))


def test_same_seed_same_run():
    a = train(tiny(total_steps=400, eval_every=10_000), progress=False, out=io.StringIO())
    b = train(tiny(total_steps=400, eval_every=10_000), progress=False, out=io.StringIO())
    assert a.episode_returns == b.episode_returns
    assert np.array_equal(a.priorities, b.priorities)
    assert np.array_equal(a.final_returns, b.final_returns)


def test_no_progress_prints_lines_not_a_bar():
    buf = io.StringIO()
    train(tiny(total_steps=300), progress=False, out=buf)
    text = buf.getvalue()
    assert "DQN+PER" not in text and "step     300: greedy evaluation" in text


def test_schedules():
    c = DemoConfig(total_steps=1000, eps_decay_steps=100)
    assert c.epsilon(0) == 1.0 and c.epsilon(100) == c.eps_end and c.epsilon(10_000) == c.eps_end
    assert c.beta(0) == c.beta_start and c.beta(1000) == pytest.approx(1.0)
    assert c.learning_rate(500) == pytest.approx((c.lr + c.lr_final) / 2)


def test_moving_average():
    assert np.allclose(moving_average(np.array([1.0, 3.0, 5.0, 7.0]), 2), [1, 2, 4, 6])
    assert len(moving_average(np.array([]), 5)) == 0


def test_evaluate_runs_side_by_side():
    from replaystore.demo.agent import DQNAgent

    agent = DQNAgent(4, 2, tiny())
    rets = evaluate(agent, "CartPole-v1", 3, seed=0)
    assert rets.shape == (3,) and (rets >= 1).all()


def test_demo_command_smoke(tmp_path, capsys):
    out = tmp_path / "fig" / "demo.png"
    code = cli.main(["demo", "--steps", "1200", "--eval-episodes", "2", "--no-progress", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "final average return over 2 greedy evaluation episodes" in text
    assert "sample/insert ratio" in text and str(out) in text
    assert out.read_bytes()[:8] == PNG


def test_demo_command_nstep_refuses_distributed(capsys):
    assert cli.main(["demo", "--n-step", "3", "--distributed"]) == 2
    assert "--n-step applies only without --distributed" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("n_step", [3])
def test_full_nstep_demo_solves_cartpole(tmp_path, capsys, request, n_step):
    """``replaystore demo --n-step 3`` reaches the same >= 450 bar (seed 0)."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("full demo run: select it with -m slow")
    out = tmp_path / "demo.png"
    assert cli.main(["demo", "--n-step", str(n_step), "--no-progress", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("final average return over 20"))
    assert float(line.split(":")[1].split()[0]) >= 450, text


@pytest.mark.slow
def test_full_demo_solves_cartpole(tmp_path, capsys, request):
    """The product promise: ``replaystore demo`` reaches >= 450 within a few minutes (seed 0).

    Runs only when selected with ``-m slow`` (one to three minutes on two cores).
    """
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("full demo run: select it with -m slow")
    out = tmp_path / "demo.png"
    start = time.perf_counter()
    assert cli.main(["demo", "--no-progress", "--out", str(out)]) == 0
    elapsed = time.perf_counter() - start
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("final average return over 20"))
    final = float(line.split(":")[1].split()[0])
    assert final >= 450, text
    assert elapsed < 300, elapsed
    assert out.read_bytes()[:8] == PNG
