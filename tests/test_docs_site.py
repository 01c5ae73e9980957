"""The documentation site builds with ``mkdocs build --strict`` (broken links, nav, docstrings)."""

from __future__ import annotations

import importlib.util
import os
import re
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
    # the README's command, as written (from the repository root; no --quiet, which would hide the
    # warnings from strict mode); only the output goes to a temporary directory
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "mkdocs build --strict" in readme
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    log = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    assert "WARNING" not in log, log
    site = tmp_path / "site"
    # Sphinx roles in docstrings are rendered as links (or code), never as raw text
    raw = re.compile(r":(?:mod|class|meth|func|attr|exc|data|obj):(?:`|<code>)")
    pages = [str(p.relative_to(site)) for p in site.rglob("*.html") if raw.search(p.read_text(encoding="utf-8"))]
    assert not pages, f"raw reST roles on {pages}"
    assert (site / "index.html").is_file()
    # the API reference is generated from the docstrings: the Table's contract is on its page
    table_page = (site / "reference" / "table" / "index.html").read_text(encoding="utf-8")
    assert "update_priorities" in table_page and "sample" in table_page
    # every public method a user calls has its own entry on its class's page: those the class gets
    # from our mixins (inherited_members) and those generated from the contract (griffe_contract)
    entries = {
        "table": {"replaystore.table.Table": ["update_priorities", "sample", "extend", "add_episode", "get", "save"]},
        "ray": {
            "replaystore.ray.ReplayClient": ["sample", "extend", "update_priorities", "add_episode"],
            "replaystore.ray.OnlineClient": ["acquire", "add", "sample", "version_of"],
            "replaystore.ray.FragmentBuffer": ["fetch", "release"],
            "replaystore.ray.FragmentClient": ["fetch", "release", "update_model_version", "drain"],
        },
        "online": {"replaystore.online.StalenessBudget": ["acquire", "finish"]},
    }
    for page, classes in entries.items():
        text = (site / "reference" / page / "index.html").read_text(encoding="utf-8")
        for cls, methods in classes.items():
            missing = [m for m in methods if f'id="{cls}.{m}"' not in text]
            assert not missing, f"reference/{page}: {cls} lacks {missing}"
        # Google-style sections were parsed (a generated method's docstring too), never shown raw
        assert "Args:" not in text, page
    # only members from our own classes: not those of a third-party base (SB3's ReplayBuffer)
    integrations = (site / "reference" / "integrations" / "index.html").read_text(encoding="utf-8")
    assert 'id="replaystore.integrations.sb3.ReplaystoreReplayBuffer.sample"' in integrations
    assert 'id="replaystore.integrations.sb3.ReplaystoreReplayBuffer.swap_and_flatten"' not in integrations
    # a role became a cross-reference link: Table.extend's docstring names Table.sample
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]*href="#replaystore\.table\.Table\.sample"', table_page)
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


@pytest.mark.skipif(not _installed("griffe"), reason="the [docs] extra is not installed (griffe)")
def test_every_docstring_parses(caplog: pytest.LogCaptureFixture) -> None:
    # every docstring of the package, on a reference page or not (a class's page may show it later,
    # as an inherited member): its Google-style sections parse without a warning, once the Sphinx
    # roles are rewritten as the docs build does (a malformed ``Raises:`` continuation line fails
    # the strict build only when a page shows it)
    import griffe

    extensions = griffe.load_extensions(str(ROOT / "tools" / "griffe_rst_roles.py"))
    pkg = griffe.load("replaystore", search_paths=[str(ROOT / "src")], resolve_aliases=False, extensions=extensions)

    def walk(obj: griffe.Object) -> list[griffe.Object]:
        out = [obj]
        for member in obj.members.values():
            if not member.is_alias:
                out.extend(walk(member))  # type: ignore[arg-type]
        return out

    with caplog.at_level("WARNING", logger="griffe"):
        parsed = [o.docstring.parse("google") for o in walk(pkg) if o.docstring is not None]
    assert len(parsed) > 500
    failed = [r.getMessage() for r in caplog.records if "Failed to get" in r.getMessage()]
    assert not failed, "\n".join(failed)
