"""Every ```` ```python ```` block of README.md and docs/**/*.md runs.

Each Markdown file's blocks run in order, in one namespace, in a fresh Python process whose working
directory is a temporary directory (so a snippet that writes ``ckpt/`` writes it there, and a snippet
that starts a local Ray instance gets its own and loses it when the process ends). A block whose
fence is preceded (on the line right before it) by ``<!-- no-run: the reason -->`` is skipped; a block
that needs an optional package that is not installed (torch, Ray, gymnasium, ...) is skipped with
that reason. Every other block must run without an exception.

Run this file as a script to execute one Markdown file's blocks by hand:
``python tests/test_doc_snippets.py docs/ray.md``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_RUN = re.compile(r"^\s*<!--\s*no-run:\s*(?P<reason>.+?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
# optional packages: a snippet that needs a missing one is skipped, not failed
OPTIONAL = {"torch", "ray", "gymnasium", "stable_baselines3", "minari", "lmdb", "zstandard", "numba",
            "tensorboard", "wandb", "tensordict", "gfn", "ding", "minestudio", "matplotlib", "tqdm", "h5py"}
FILE_TIMEOUT = 240


@dataclass
class Block:
    """One fenced Python block: where it starts, its code, and the no-run reason if any."""

    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    no_run: str | None


def markdown_files() -> list[Path]:
    """README.md and every Markdown file under docs/, sorted."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(path: Path) -> list[Block]:
    """The ```` ```python ```` blocks of one Markdown file, in order (other languages are ignored)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group("lang"):
            i += 1
            continue
        indent, lang, start = m.group("indent"), m.group("lang"), i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1
        if lang not in ("python", "py"):
            continue
        prev = lines[start - 1] if start > 0 else ""
        nr = NO_RUN.match(prev)
        blocks.append(Block(path, start + 1, "\n".join(body) + "\n", nr.group("reason") if nr else None))
    return blocks


def run_file(path: Path, out: Path) -> None:
    """Run the blocks of ``path`` in this process (cwd: a fresh temporary directory); write JSON to ``out``.

    One result per block: ``{"line", "status": "passed" | "failed" | "skipped", "reason"}``.
    """
    import traceback

    results = []
    ns: dict = {"__name__": "__snippet__"}
    skip_rest: str | None = None
    for b in python_blocks(path):
        if b.no_run is not None:
            results.append({"line": b.line, "status": "skipped", "reason": f"no-run: {b.no_run}"})
            continue
        if skip_rest is not None:
            results.append({"line": b.line, "status": "skipped", "reason": skip_rest})
            continue
        try:
            exec(compile(b.code, f"{path.name}:{b.line}", "exec"), ns)  # noqa: S102
            results.append({"line": b.line, "status": "passed", "reason": ""})
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if top not in OPTIONAL:
                results.append({"line": b.line, "status": "failed", "reason": traceback.format_exc()})
                continue
            # the later blocks of the file build on this one: skip them with the same reason
            skip_rest = f"optional package {top!r} is not installed"
            results.append({"line": b.line, "status": "skipped", "reason": skip_rest})
        except BaseException:  # noqa: BLE001 - report every failure, SystemExit included
            results.append({"line": b.line, "status": "failed", "reason": traceback.format_exc()})
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        ray.shutdown()
    out.write_text(json.dumps(results))


def run_in_subprocess(path: Path) -> list[dict]:
    """Run one Markdown file's blocks in a fresh interpreter in a temporary directory."""
    env = dict(os.environ)
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env["MPLBACKEND"] = "Agg"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory(prefix="snippets-") as tmp:
        out = Path(tmp) / "results.json"
        work = Path(tmp) / "work"
        work.mkdir()
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), str(path), str(out)],
                              cwd=work, env=env, capture_output=True, text=True, timeout=FILE_TIMEOUT)
        if not out.exists():
            raise AssertionError(f"{path}: the snippet runner died (exit {proc.returncode}):\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


if __name__ == "__main__":
    target = Path(sys.argv[1]).resolve()
    result_path = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp()) / "results.json"
    if len(sys.argv) <= 2:
        os.chdir(tempfile.mkdtemp(prefix="snippets-"))
    run_file(target, result_path)
    for r in json.loads(result_path.read_text()):
        print(f"{target.name}:{r['line']}: {r['status']} {r['reason']}")
    sys.exit(0)

import pytest  # noqa: E402  (the script mode above needs no pytest)

FILES = [p for p in markdown_files() if python_blocks(p)]


def test_collector_finds_blocks_and_markers(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text("text\n```python\na = 1\n```\n<!-- no-run: needs a GPU -->\n```python\nb = 2\n```\n"
                  "```bash\nls\n```\n- item:\n\n  ```python\n  c = a + 1\n  ```\n", encoding="utf-8")
    blocks = python_blocks(md)
    assert [(b.line, b.no_run) for b in blocks] == [(2, None), (6, "needs a GPU"), (13, None)]
    assert blocks[2].code == "c = a + 1\n"
    out = tmp_path / "r.json"
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        run_file(md, out)
    finally:
        os.chdir(cwd)
    assert [r["status"] for r in json.loads(out.read_text())] == ["passed", "skipped", "passed"]


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_markdown_snippets_run(path: Path) -> None:
    results = run_in_subprocess(path)
    failed = [r for r in results if r["status"] == "failed"]
    counts = {s: sum(r["status"] == s for r in results) for s in ("passed", "skipped", "failed")}
    print(f"{path.relative_to(ROOT)}: {counts}")
    assert len(results) == len(python_blocks(path))
    assert not failed, "\n\n".join(f"{path.relative_to(ROOT)}:{r['line']}:\n{r['reason']}" for r in failed)
    if counts["passed"] == 0:
        pytest.skip("; ".join(sorted({r["reason"] for r in results})))
