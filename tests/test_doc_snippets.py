"""Every ```` ```python ```` block of README.md and docs/**/*.md runs.

Each Markdown file's blocks run in order, in one namespace of their own, with a fresh temporary
directory as the working directory (so a snippet that writes ``ckpt/`` writes it there). The files
run in two child processes: the files that use Ray in one (they share the local Ray instance the
first of them starts, which ends with the process), all others in the other, so the suite pays for
one interpreter start and one Ray start, not one per file. A block whose
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
OPTIONAL = {
    "torch",
    "ray",
    "gymnasium",
    "stable_baselines3",
    "minari",
    "lmdb",
    "zstandard",
    "numba",
    "tensorboard",
    "wandb",
    "tensordict",
    "torchrl",
    "gfn",
    "ding",
    "minestudio",
    "matplotlib",
    "tqdm",
    "h5py",
    "tianshou",
}
GROUP_TIMEOUT = 420  # seconds for each child process (a quiet machine needs well under a minute)


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
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1
        if lang not in ("python", "py"):
            continue
        prev = lines[start - 1] if start > 0 else ""
        nr = NO_RUN.match(prev)
        blocks.append(Block(path, start + 1, "\n".join(body) + "\n", nr.group("reason") if nr else None))
    return blocks


def uses_ray(path: Path) -> bool:
    """Whether a file's runnable blocks use Ray (they then run in the Ray group)."""
    code = "".join(b.code for b in python_blocks(path) if b.no_run is None)
    return any(s in code for s in ("import ray", "replaystore import ray", "replaystore.ray", "rsr."))


def run_file(path: Path) -> list[dict]:
    """Run the blocks of ``path`` in this process, in the current directory; one result per block.

    A result is ``{"line", "status": "passed" | "failed" | "skipped", "reason"}``.
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
    return results


def run_files(paths: list[Path], out: Path) -> None:
    """Run each file's blocks (its own namespace, its own temporary cwd); write ``{path: results}`` to ``out``.

    The JSON is rewritten after every file, so a file that hangs costs only the files after it.
    Every file's directory lives until Ray is shut down: Ray starts its workers in the directory
    the driver was in when Ray started, so deleting it after the first file made a later file's
    new actor fail to start (its workers could not enter a deleted directory; a timeout).
    """
    done: dict[str, list[dict]] = {}
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="snippets-") as parent:
        try:
            for i, path in enumerate(paths):
                work = os.path.join(parent, str(i))
                os.mkdir(work)
                os.chdir(work)
                try:
                    done[str(path)] = run_file(path)
                finally:
                    os.chdir(cwd)
                out.write_text(json.dumps(done))
        finally:
            ray = sys.modules.get("ray")
            if ray is not None and getattr(ray, "is_initialized", lambda: False)():
                ray.shutdown()


def run_in_subprocess(paths: list[Path], timeout: float) -> dict[str, list[dict]]:
    """Run these Markdown files' blocks in one fresh interpreter; ``{path: results}``."""
    env = dict(os.environ)
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env["MPLBACKEND"] = "Agg"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory(prefix="snippets-") as tmp:
        out = Path(tmp) / "results.json"
        try:
            proc = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--out", str(out), *map(str, paths)],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            tail = f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        except subprocess.TimeoutExpired as e:
            tail = f"timed out after {timeout:.0f} s:\n{str(e.stdout)[-3000:]}\n{str(e.stderr)[-3000:]}"
        results = json.loads(out.read_text()) if out.exists() else {}
        for path in paths:  # a file the child never finished: one failure saying why
            results.setdefault(
                str(path),
                [{"line": 0, "status": "failed", "reason": f"the snippet runner stopped before this file ({tail})"}],
            )
        return results


if __name__ == "__main__":
    args = sys.argv[1:]
    out_path = Path(tempfile.mkdtemp()) / "results.json"
    if args[:1] == ["--out"]:
        out_path, args = Path(args[1]), args[2:]
    run_files([Path(a).resolve() for a in args], out_path)
    for name, res in json.loads(out_path.read_text()).items():
        for r in res:
            print(f"{Path(name).name}:{r['line']}: {r['status']} {r['reason']}")
    sys.exit(0)

import pytest  # noqa: E402  (the script mode above needs no pytest)

FILES = [p for p in markdown_files() if python_blocks(p)]
GROUPS = {"ray": [p for p in FILES if uses_ray(p)], "plain": [p for p in FILES if not uses_ray(p)]}


@pytest.fixture(scope="module")
def snippet_results() -> dict[str, list[dict]]:
    """Every file's results: two child processes (Ray files, other files), run once per module."""
    results: dict[str, list[dict]] = {}
    for paths in GROUPS.values():
        if paths:
            results.update(run_in_subprocess(paths, timeout=GROUP_TIMEOUT))
    return results


def test_collector_finds_blocks_and_markers(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text(
        "text\n```python\na = 1\n```\n<!-- no-run: needs a GPU -->\n```python\nb = 2\n```\n"
        "```bash\nls\n```\n- item:\n\n  ```python\n  c = a + 1\n  ```\n",
        encoding="utf-8",
    )
    blocks = python_blocks(md)
    assert [(b.line, b.no_run) for b in blocks] == [(2, None), (6, "needs a GPU"), (14, None)]
    assert blocks[2].code == "c = a + 1\n"
    bad = tmp_path / "y.md"
    bad.write_text("```python\nimport replaystore_no_such_module\n```\n```python\nx = 1\n```\n", encoding="utf-8")
    out = tmp_path / "r.json"
    run_files([md, bad], out)
    res = json.loads(out.read_text())
    assert [r["status"] for r in res[str(md)]] == ["passed", "skipped", "passed"]
    assert [r["status"] for r in res[str(bad)]] == ["failed", "passed"]  # a missing non-optional module fails


@pytest.mark.timeout(2 * GROUP_TIMEOUT + 60)  # the first test also runs the module fixture
@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_markdown_snippets_run(path: Path, snippet_results: dict[str, list[dict]]) -> None:
    results = snippet_results[str(path)]
    failed = [r for r in results if r["status"] == "failed"]
    counts = {s: sum(r["status"] == s for r in results) for s in ("passed", "skipped", "failed")}
    print(f"{path.relative_to(ROOT)}: {counts}")
    assert not failed, "\n\n".join(f"{path.relative_to(ROOT)}:{r['line']}:\n{r['reason']}" for r in failed)
    assert len(results) == len(python_blocks(path))
    if counts["passed"] == 0:
        pytest.skip("; ".join(sorted({r["reason"] for r in results})))
