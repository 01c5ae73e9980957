"""The recurrent Q-learning example (examples/r2d2_cartpole_pomdp.py): targets and a short run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gymnasium")

import replaystore as rs  # noqa: E402

PATH = Path(__file__).resolve().parent.parent / "examples" / "r2d2_cartpole_pomdp.py"


@pytest.fixture(scope="module")
def ex():
    spec = importlib.util.spec_from_file_location("r2d2_example", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference_targets(r, term, boot, n, gamma):
    b, length = r.shape
    out = np.zeros((b, length))
    for i in range(b):
        for t in range(length):
            k = min(n, length - t)
            total, alive = 0.0, 1.0
            for j in range(k):
                total += gamma**j * r[i, t + j] * alive
                if term[i, t + j]:
                    alive = 0.0
            out[i, t] = total + gamma**k * boot[i, t + k] * alive
    return out


@pytest.mark.parametrize("n", [1, 3, 5])
def test_nstep_targets_match_reference(ex, n):
    rng = np.random.default_rng(n)
    r = rng.standard_normal((6, 9)).astype(np.float32)
    term = rng.random((6, 9)) < 0.15
    boot = rng.standard_normal((6, 10)).astype(np.float32)
    got = ex.nstep_targets(torch.as_tensor(r), torch.as_tensor(term).float(), torch.as_tensor(boot), n, 0.9)
    np.testing.assert_allclose(got.numpy(), reference_targets(r, term, boot, n, 0.9), rtol=1e-5, atol=1e-5)


def test_learn_step_on_prioritized_sequences(ex):
    """One learner step on a real prioritized sequence sample: |td| per step, priorities written back."""
    burn_in, length = 3, 6
    table = ex.make_table(1_000, burn_in, length, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(200):  # 2 streams, episodes of 12 steps
        t = len(table) // 2
        obs = rng.standard_normal((2, 2)).astype(np.float32)
        end = np.full(2, t % 12 == 11)
        table.extend_steps(
            {
                "obs": obs,
                "action": rng.integers(0, 2, 2),
                "reward": np.ones(2, np.float32),
                "next_obs": obs + 1,
                "terminated": end,
            },
            streams=np.arange(2),
            terminated=end,
        )
    s = table.sample_sequences(16, length, burn_in=burn_in)
    assert s.data["obs"].shape == (16, burn_in + length, 2)
    q = ex.RecurrentQ(2, 2, hidden=8)
    target = ex.RecurrentQ(2, 2, hidden=8)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    td = ex.learn(q, target, opt, s, burn_in, 0.99, 3)
    assert td.shape == (16, length) and np.isfinite(td).all()
    prio = rs.sequence_priority(td, eta=0.9)
    np.testing.assert_allclose(prio, 0.9 * td.max(1) + 0.1 * td.mean(1))
    assert table.update_priorities(s.keys, prio + 1e-3) == len(np.unique(s.keys))


def test_short_run(ex, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["r2d2", "--steps", "2400", "--eval-every", "1000000", "--batch", "8"])
    ex.main()
    out = capsys.readouterr().out
    assert "final greedy return over 20 episodes" in out and "2,400 env steps" in out
