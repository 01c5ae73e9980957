"""examples/apex_local.py --smoke: actor processes and a learner through a shared table, end to end."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_apex_local_smoke():
    pytest.importorskip("gymnasium")
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "apex_local.py"), "--smoke"], env=env,
                       capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "inserts/s" in r.stdout and "learner batches/s" in r.stdout
