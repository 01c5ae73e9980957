"""examples/apex_dqn_ray.py --smoke: actors with their own priorities, a sharded table, one learner."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")
pytest.importorskip("ray")

PATH = Path(__file__).resolve().parents[2] / "examples" / "apex_dqn_ray.py"


@pytest.mark.timeout(280)
def test_apex_example_smoke_run():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PATH.parents[1] / "src"), env.get("PYTHONPATH")) if p)
    out = subprocess.run(
        [sys.executable, str(PATH), "--smoke", "--actors", "2", "--shards", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=260,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert "learner batches/s" in last and "inserts/s" in last and "samples/s" in last, out.stdout
    # the learner trained on the sharded table: some batches, and every sampled item was inserted first
    batches = int(last.split(" learner batches in ")[0].rsplit(",", 1)[1])
    assert batches > 0, last
