"""Run Tianshou 2.0.1's own buffer tests (``test/base/test_buffer.py``) against replaystore's Tianshou buffers.

Tianshou's PyPI sdist has no tests, so they come from a copy of Tianshou's git repository at tag
``v2.0.1``: ``--repo DIR`` (or ``$TIANSHOU_REPO``), a clone or bare git directory; its ``test/``
tree at the tag is extracted with ``git archive`` into a cache directory (``$REPLAYSTORE_TIANSHOU_CACHE``,
default ``~/.cache/replaystore``) and run there, unmodified, with the plugin
``tianshou_redirect.py``. Nothing of Tianshou's is copied into this repository. Without a
repository and without a cached copy the run stops with exit status 4 ("not available").

Usage::

    python tests/tianshou_suite/run_tianshou_suite.py --repo /path/to/tianshou        # all of test_buffer.py
    python tests/tianshou_suite/run_tianshou_suite.py --baseline                      # Tianshou's own buffers
    python tests/tianshou_suite/run_tianshou_suite.py -- -x -k prioritized            # pytest arguments after --

Exit status: pytest's (4 when the tests are not available).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

TAG = "v2.0.1"
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FILES = ("test/base/test_buffer.py",)
NOT_AVAILABLE = 4


def fetch_tests(cache: Path, repo: str | None) -> Path | None:
    """The directory holding Tianshou's ``test/`` at the tag (extracted once from ``repo``), or None."""
    root = cache / f"tianshou-tests-{TAG}"
    if (root / "test" / "base" / "test_buffer.py").exists():
        return root
    if not repo:
        return None
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".unpack-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    archive = tmp / "test.tar"
    subprocess.run(["git", "--git-dir", _git_dir(repo), "archive", "-o", str(archive), TAG, "test"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp / "tree", filter="data")
    os.replace(tmp / "tree", root)
    shutil.rmtree(tmp, ignore_errors=True)
    return root


def _git_dir(repo: str) -> str:
    p = Path(repo)
    return str(p / ".git") if (p / ".git").exists() else str(p)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, fetch Tianshou's tests, run pytest on them; return pytest's exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help=f"test files (default: {' '.join(FILES)})")
    parser.add_argument("--repo", default=os.environ.get("TIANSHOU_REPO"), help="Tianshou git repository")
    parser.add_argument("--baseline", action="store_true", help="run with Tianshou's own buffers")
    parser.add_argument(
        "--cache", default=os.environ.get("REPLAYSTORE_TIANSHOU_CACHE", str(Path.home() / ".cache" / "replaystore"))
    )
    args = parser.parse_args(argv)
    root = fetch_tests(Path(args.cache), args.repo)
    if root is None:
        print(f"Tianshou's tests are not available: pass --repo (a Tianshou git repository with tag {TAG})")
        return NOT_AVAILABLE
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO / "src"), str(root), env.get("PYTHONPATH", "")])
    if args.baseline:
        env["REPLAYSTORE_TIANSHOU_REDIRECT"] = "none"
    cmd = [sys.executable, "-m", "pytest", "-p", "tianshou_redirect", "-p", "no:cacheprovider"]
    cmd += ["-o", "addopts=", *(args.files or FILES), *extra]
    print("+", " ".join(cmd), f"(cwd {root})", flush=True)
    return subprocess.call(cmd, cwd=root, env=env)


if __name__ == "__main__":
    sys.exit(main())
