"""Run TorchRL's own replay-buffer tests against replaystore's TorchRL samplers.

TorchRL publishes no source distribution on PyPI (its wheels hold no tests), so the tests are
taken from a git checkout or mirror of pytorch/rl at a pinned commit: ``git archive`` of
``test/rb`` and ``test/conftest.py`` into a cache directory (outside the repository), checked
against pinned SHA-256 sums of the files run. Nothing of TorchRL's is copied into this repository.
The pinned commit is the newest the session could fetch; its replay-buffer package matches the
installed torchrl 0.14.1 in layout (``replay_buffers/``, ``samplers/``, ``storages/``, ``writers/``)
and its tests run against 0.14.1 (the baseline's failures are listed in docs/compat/torchrl.md).

Usage::

    python tests/torchrl_suite/run_torchrl_suite.py                    # the default files (FILES)
    python tests/torchrl_suite/run_torchrl_suite.py test_samplers.py   # some files
    python tests/torchrl_suite/run_torchrl_suite.py --baseline         # TorchRL's own samplers
    python tests/torchrl_suite/run_torchrl_suite.py -- -x -k slice     # pytest arguments after --

Environment: ``TORCHRL_GIT`` (a git directory of pytorch/rl holding ``COMMIT``; default: the
session mirror ``/work/.mirror/pytorch+rl/repo``), ``TORCHRL_TESTS`` (a directory already holding
``test/rb``), ``REPLAYSTORE_TORCHRL_CACHE`` (default ``~/.cache/replaystore``),
``REPLAYSTORE_TORCHRL_REDIRECT`` (see the plugin). Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

#: pytorch/rl commit of the tests (main, 2026-08-22)
COMMIT = "ae9719f17b1517af5c2523a36c4616f003ee55cf"
DEFAULT_GIT = "/work/.mirror/pytorch+rl/repo"
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
#: TorchRL's test files about the classes replaystore replaces (samplers, prioritized buffers)
FILES = ("test_prioritized.py", "test_samplers.py", "test_rb_core.py", "test_composable.py")
#: SHA-256 of the files run, as extracted from COMMIT
SHA256 = {
    "test_prioritized.py": "f7ffbb59a59f7f1bcedbaa921b344195840bb5237a5a472b9db96b2decc89864",
    "test_samplers.py": "668c04d8168ae7f9f31fe4a97f61aee24db9381c528098ff00615965106a88cf",
    "test_rb_core.py": "ba6d5b7dabca7e14b095f6438593e0f634c19e1337c4abafc5a59b21342a6382",
    "test_composable.py": "152b59bf743864169b0881ec51cad22a4e8f699ad8039b99ab7cf610b1f18e4d",
    # (not in FILES: about storages; run it by name for replaystore's LazyTensorStorage)
    "test_storages.py": "3cd746f3a34005d7e8d2111613699180ea6e1f0f4e3c7bf6d333f536807d1eac",
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_tests(cache: Path) -> Path:
    """Extract (once) TorchRL's tests at ``COMMIT``; return the directory holding ``test/rb``.

    Raises:
        FileNotFoundError: no cached copy, no ``TORCHRL_TESTS`` and no git directory to read.
        SystemExit: a file's SHA-256 is not the pinned one.
    """
    given = os.environ.get("TORCHRL_TESTS")
    root = Path(given) if given else cache / f"torchrl-tests-{COMMIT[:12]}"
    if not (root / "test" / "rb" / "test_samplers.py").exists():
        if given:
            raise FileNotFoundError(f"TORCHRL_TESTS={given} holds no test/rb/test_samplers.py")
        git_dir = os.environ.get("TORCHRL_GIT", DEFAULT_GIT)
        if not Path(git_dir).exists():
            raise FileNotFoundError(f"no pytorch/rl git directory at {git_dir} (set TORCHRL_GIT)")
        out = subprocess.run(
            ["git", f"--git-dir={git_dir}", "archive", "--format=tar", COMMIT, "test/rb", "test/conftest.py"],
            check=True,
            capture_output=True,
        )
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".unpack-torchrl-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        os.replace(tmp, root)
    for name, digest in SHA256.items():
        if _sha256(root / "test" / "rb" / name) != digest:
            raise SystemExit(f"{root}/test/rb/{name}: SHA-256 is not the pinned {digest}")
    return root


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, fetch TorchRL's tests, run pytest on them; return pytest's exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help=f"TorchRL test files under test/rb (default: {' '.join(FILES)})")
    parser.add_argument("--baseline", action="store_true", help="run with TorchRL's own samplers")
    parser.add_argument(
        "--cache",
        default=os.environ.get("REPLAYSTORE_TORCHRL_CACHE", str(Path.home() / ".cache" / "replaystore")),
    )
    args = parser.parse_args(argv)
    root = fetch_tests(Path(args.cache))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO / "src"), env.get("PYTHONPATH", "")])
    env.setdefault("RL_WARNINGS", "0")
    if args.baseline:
        env["REPLAYSTORE_TORCHRL_REDIRECT"] = "none"
    files = [f"rb/{f}" for f in (args.files or FILES)]
    cmd = [sys.executable, "-m", "pytest", "-p", "torchrl_redirect", "-p", "no:cacheprovider", *files, *extra]
    print("+", " ".join(cmd), f"(cwd {root / 'test'})", flush=True)
    return subprocess.call(cmd, cwd=root / "test", env=env)


if __name__ == "__main__":
    sys.exit(main())
