"""Every example script with a ``--smoke`` mode runs to completion in seconds.

The scripts are found, not listed: any ``examples/*.py`` whose source mentions ``--smoke`` is run
as ``python examples/NAME.py --smoke`` in a temporary working directory (so figures and
checkpoints land there). A script that imports an optional package that is not installed (torch,
Ray, Stable-Baselines3, torchgfn, ...) is skipped with that reason. A ``UserWarning`` raised by the
script's own code is an error.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(
    p
    for p in (ROOT / "examples").glob("*.py")
    if not p.name.startswith("_") and "--smoke" in p.read_text(encoding="utf-8")
)
OPTIONAL = {
    "torch",
    "ray",
    "gymnasium",
    "stable_baselines3",
    "gfn",
    "matplotlib",
    "tqdm",
    "lmdb",
    "minari",
    "zstandard",
    "tensorboard",
    "numba",
    "pettingzoo",
}
TIMEOUT = 240
#: Examples whose ``--smoke`` run another default test already makes, with checks of what it printed
#: or computed (exit code 0 included): not run a second time here (each costs 20-60 s of a loaded
#: machine). Each entry names that test; ``test_covered_examples_are_run_elsewhere`` keeps it honest.
COVERED = {
    "apex_dqn_ray.py": "tests/ray/test_example_apex.py",  # --smoke; batches > 0, the rates line
    "grpo_dapo_overprovision.py": "tests/ray/test_online_service.py",  # main(["--smoke"]); every mode's stats
    "dataloader_training.py": "tests/test_example_reports.py",  # --smoke; the two loss windows
    "demo_custom_config.py": "tests/test_cli_edges.py",  # --smoke; its figure, nothing in the cwd
    "ding_dqn_cartpole.py": "tests/test_figures_tool.py",  # tools/figures.py smoke:ding_dqn_cartpole; exit 0
    "r2d2_cartpole_pomdp.py": "tests/test_example_r2d2.py",  # main() on the smoke's 2,400 steps
}


def needed_packages(path: Path) -> set[str]:
    """The optional top-level packages a script imports anywhere (``replaystore.ray`` counts as ``ray``)."""
    needs = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in OPTIONAL:
                needs.add(parts[0])
            if parts[:2] == ["replaystore", "ray"]:
                needs.add("ray")
            if parts[:2] == ["replaystore", "demo"]:
                needs.update({"torch", "gymnasium", "matplotlib"})
            if (
                parts[:3] == ["replaystore", "integrations", "sb3"]
                or parts[:2] == ["replaystore", "integrations"]
                and "sb3" in name
            ):
                needs.add("stable_baselines3")
    return needs


def missing(path: Path) -> list[str]:
    """The optional packages ``path`` needs that are not installed here."""
    return sorted(m for m in needed_packages(path) if importlib.util.find_spec(m) is None)


def run_example(path: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python examples/NAME.py ARGS`` with this checkout's ``src`` first on the path."""
    env = dict(os.environ, MPLBACKEND="Agg")
    if "ray" not in needed_packages(path):
        # our own examples' code must not warn; not under Ray, whose workers inherit the variable and
        # run their own ``__main__`` (a warning there turned into an error kills the worker silently)
        env["PYTHONWARNINGS"] = "error::UserWarning:__main__"
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, str(path), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )


def test_every_existing_example_has_a_smoke_mode() -> None:
    scripts = {p.name for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_")}
    assert scripts == {p.name for p in EXAMPLES}, f"without --smoke: {sorted(scripts - {p.name for p in EXAMPLES})}"


def test_dependency_scan_sees_lazy_and_replaystore_imports(tmp_path: Path) -> None:
    script = tmp_path / "x.py"
    script.write_text(
        "import numpy\ndef main():\n    import torch\n    from replaystore import ray as rsr\n"
        "from replaystore.integrations.sb3 import PrioritizedDQN\n",
        encoding="utf-8",
    )
    assert needed_packages(script) == {"torch", "ray", "stable_baselines3"}


def test_covered_examples_are_run_elsewhere() -> None:
    for name, test in COVERED.items():
        assert (ROOT / "examples" / name) in EXAMPLES, name
        text = (ROOT / test).read_text(encoding="utf-8")
        assert Path(name).stem in text and ("smoke" in text or "2400" in text), (name, test)


SMOKED = [p for p in EXAMPLES if p.name not in COVERED]


@pytest.mark.parametrize("path", SMOKED, ids=[p.name for p in SMOKED])
def test_example_smoke(path: Path, tmp_path: Path) -> None:
    if missing(path):
        pytest.skip(f"needs {', '.join(missing(path))} (not installed)")
    proc = run_example(path, "--smoke", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{path.name} --smoke exited {proc.returncode}:\n{out[-4000:]}"
    assert proc.stdout.strip(), f"{path.name} --smoke printed nothing"
    assert "Traceback" not in out, out[-4000:]


@pytest.mark.skipif(importlib.util.find_spec("gfn") is not None, reason="torchgfn is installed here")
def test_gfn_example_without_torchgfn_says_how_to_install_it(tmp_path: Path) -> None:
    proc = run_example(ROOT / "examples" / "gfn_hypergrid.py", "--smoke", cwd=tmp_path)
    assert proc.returncode == 2
    assert "needs torchgfn" in proc.stderr and "pip install -e '.[gfn-test]'" in proc.stderr
    assert "Traceback" not in proc.stderr
