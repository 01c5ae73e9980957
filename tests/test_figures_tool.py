"""``tools/figures.py`` regenerates a stated figure and labels it (issue 38 item 8).

One cheap figure end to end (an example's ``--smoke``: its wall and CPU seconds, quiet or loaded),
and the parsers of the Ray examples' tables on the rows those examples print.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("figures", ROOT / "tools" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("figures", module)  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_one_figure_end_to_end_is_labelled(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    out = tmp_path / "figs.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "figures.py"), "smoke:ding_dqn_cartpole", "--json", str(out)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"wall [0-9.]+ s, CPU [0-9.]+ s \(process tree\), (quiet|loaded) \(load average", proc.stdout)
    [r] = json.loads(out.read_text())
    assert r["exit"] == 0 and r["cpu_s"] > 0 and r["wall_s"] > 0 and r["label"] in ("quiet", "loaded")


def test_the_table_parsers_read_the_rows_the_examples_print():
    tool = _tool()
    grpo = (
        "| base | 245 | 240 | 0 | 0 (0 long) | 49 | 9000 | 0 | 0.24 / 0.24 | 30.0 | 0.70 |\n"
        "| dapo | 344 | 240 | 99 | 0 (0 long) | 0 | 9000 | 1 | 0.25 / 0.33 | 30.0 | 0.70 |\n"
        "| dapo+over | 485 | 240 | 242 | 48 (35 long) | 0 | 9 | 2 | 0.20 / 0.29 | 30.0 | 0.70 |\n"
    )
    got = {k: re.findall(r, grpo)[-1] for k, r in tool._grpo_reads().items()}
    assert got["dapo completed"] == "344" and got["dapo+over rejected"] == "242"
    assert got["dapo+over cancelled"] == "48" and got["base zero-advantage trained"] == "49"
    pg = "mode | generated | trained\ndrop | 2233 | 1920 | 312 | 0 | 312\npace | 1924 | 1920 | 0 | 0 | 0\n"
    got = {k: re.findall(r, pg)[-1] for k, r in tool._pg_reads().items()}
    assert got == {
        "drop generated": "2233",
        "drop trained": "1920",
        "drop dropped": "312",
        "pace generated": "1924",
        "pace trained": "1920",
        "pace dropped": "0",
    }
