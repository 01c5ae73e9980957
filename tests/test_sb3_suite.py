"""Stable-Baselines3 2.9.2's own test files, run against replaystore's SB3 buffers.

The fast subset (SB3's ``test_buffers.py`` and ``test_n_step_replay.py``, ~10 s) runs by default;
the whole list of buffer and off-policy test files (``run_sb3_suite.FILES``, several minutes) is
marked slow. Both fetch SB3's sdist from PyPI once into a cache (see ``tests/sb3_suite``); without
network access and without a cached copy the tests are skipped, saying so.
"""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")
RUNNER = Path(__file__).parent / "sb3_suite" / "run_sb3_suite.py"
sys.path.insert(0, str(RUNNER.parent))
import run_sb3_suite  # noqa: E402


@pytest.fixture(scope="module")
def sb3_tests(tmp_path_factory):
    import os

    cache = Path(os.environ.get("REPLAYSTORE_SB3_CACHE", Path.home() / ".cache" / "replaystore"))
    try:
        return run_sb3_suite.fetch_tests(cache)
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"cannot fetch stable-baselines3=={run_sb3_suite.VERSION} sdist: {e}")


def _run(files, timeout):
    out = subprocess.run(
        [sys.executable, str(RUNNER), *files, "--", "-q", "-x"], capture_output=True, text=True, timeout=timeout
    )
    tail = "\n".join(out.stdout.splitlines()[-30:])
    assert out.returncode == 0, f"SB3's tests failed on replaystore buffers:\n{tail}\n{out.stderr[-2000:]}"
    assert "redirected to replaystore" in out.stdout
    return tail


def test_sb3_buffer_tests_pass(sb3_tests):
    tail = _run(["test_buffers.py", "test_n_step_replay.py"], timeout=600)
    assert " passed" in tail and "failed" not in tail


@pytest.mark.slow
def test_sb3_suite_passes(sb3_tests):
    tail = _run(list(run_sb3_suite.FILES), timeout=3600)
    assert " passed" in tail and "failed" not in tail
