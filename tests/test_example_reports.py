"""What the examples print is what they measured (issue 38 item 9).

``examples/dataloader_training.py --smoke`` trains 30 steps; its report compared "the first 50"
with "the last 50" steps, i.e. the same 30 twice, so it printed one loss twice.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_dataloader_smoke_compares_two_disjoint_windows(tmp_path):
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "dataloader_training.py"), "--smoke"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"mse: first (\d+) steps ([0-9.]+) -> last (\d+) steps ([0-9.]+) \((\d+) batches", proc.stdout)
    assert m, proc.stdout
    first, last, batches = int(m[1]), int(m[3]), int(m[5])
    assert first == last and first + last <= batches  # the windows do not overlap
    assert m[2] != m[4]  # two different means (the model learns; they are not one window twice)
