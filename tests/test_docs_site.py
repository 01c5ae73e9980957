"""The documentation site builds with ``mkdocs build --strict`` (broken links, nav, docstrings)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _installed(module: str) -> bool:
    """Whether ``module`` (dotted names too) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


# the [docs] extra: mkdocs, its Material theme, mkdocstrings and its Python handler
MISSING = [m for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python") if not _installed(m)]


@pytest.mark.skipif(bool(MISSING), reason=f"the [docs] extra is not installed (missing {MISSING})")
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--quiet",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    site = tmp_path / "site"
    assert (site / "index.html").is_file()
    # the API reference is generated from the docstrings: the Table's contract is on its page
    table_page = (site / "reference" / "table" / "index.html").read_text(encoding="utf-8")
    assert "update_priorities" in table_page and "sample" in table_page
    # every page of the nav was built, the existing docs files among them
    for page in (
        "getting_started",
        "serving",
        "offline_to_online",
        "sequences",
        "ray",
        "online",
        "durability",
        "architecture",
        "benchmarks",
        "compat/sb3",
        "compat/ding",
    ):
        assert (site / page / "index.html").is_file(), page
