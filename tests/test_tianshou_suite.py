"""Tianshou 2.0.1's own buffer tests (``test/base/test_buffer.py``), run against replaystore.compat.tianshou.

Tianshou's PyPI sdist carries no tests: they come from a Tianshou git repository at tag v2.0.1
(``$TIANSHOU_REPO``), extracted once into a cache (see ``tests/tianshou_suite``). Skipped without
Tianshou installed (it lives in its own environment: docs/compat/tianshou.md) or without the tests.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tianshou")
RUNNER = Path(__file__).parent / "tianshou_suite" / "run_tianshou_suite.py"
sys.path.insert(0, str(RUNNER.parent))
import run_tianshou_suite  # noqa: E402


@pytest.fixture(scope="module")
def tianshou_tests():
    cache = Path(os.environ.get("REPLAYSTORE_TIANSHOU_CACHE", Path.home() / ".cache" / "replaystore"))
    try:
        root = run_tianshou_suite.fetch_tests(cache, os.environ.get("TIANSHOU_REPO"))
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"cannot extract Tianshou {run_tianshou_suite.TAG}'s tests: {e}")
    if root is None:
        pytest.skip(f"Tianshou {run_tianshou_suite.TAG}'s tests are not available (set TIANSHOU_REPO)")
    return root


def test_tianshou_buffer_tests_pass(tianshou_tests):
    out = subprocess.run(
        [sys.executable, str(RUNNER), "--", "-q", "-p", "no:randomly"], capture_output=True, text=True, timeout=900
    )
    tail = "\n".join(out.stdout.splitlines()[-30:])
    assert out.returncode == 0, f"Tianshou's buffer tests failed on replaystore buffers:\n{tail}\n{out.stderr[-2000:]}"
    assert "redirected to replaystore" in out.stdout
    assert "18 passed" in tail and "failed" not in tail
