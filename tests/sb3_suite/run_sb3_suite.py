"""Run Stable-Baselines3 2.9.2's own test files against replaystore's SB3 buffer classes.

The SB3 source distribution (which contains ``tests/``) is fetched from PyPI at run time with
``pip download`` into a cache directory, checked against a pinned SHA-256 and unpacked there;
SB3's test files are run unmodified, with the plugin ``sb3_redirect.py`` making replaystore's
classes SB3's default ``ReplayBuffer`` / ``DictReplayBuffer`` / ``NStepReplayBuffer``.
Nothing of SB3's is copied into this repository.

Usage::

    python tests/sb3_suite/run_sb3_suite.py                      # the default files (see FILES)
    python tests/sb3_suite/run_sb3_suite.py test_buffers.py      # some files
    python tests/sb3_suite/run_sb3_suite.py --baseline           # SB3's own buffers, for comparison
    python tests/sb3_suite/run_sb3_suite.py -- -x -k dqn         # extra pytest arguments after --

Environment: ``SB3_SDIST`` (path of an already downloaded sdist), ``REPLAYSTORE_SB3_CACHE``
(cache directory, default ``~/.cache/replaystore``), ``REPLAYSTORE_SB3_REDIRECT`` (see the plugin).
Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "2.9.2"
SDIST = f"stable_baselines3-{VERSION}.tar.gz"
SHA256 = "8af267e9513343f481b3f0680b7740ad79a746873db24f18a9fb2edcbd9a2df7"
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
#: SB3's buffer and off-policy algorithm test files
FILES = (
    "test_buffers.py",
    "test_run.py",
    "test_save_load.py",
    "test_sde.py",
    "test_dict_env.py",
    "test_n_step_replay.py",
    "test_her.py",
    "test_cnn.py",
    "test_callbacks.py",
    "test_custom_policy.py",
    "test_deterministic.py",
    "test_identity.py",
    "test_predict.py",
    "test_train_eval_mode.py",
    "test_vec_normalize.py",
    "test_tensorboard.py",
    "test_spaces.py",
)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_tests(cache: Path) -> Path:
    """Download (once) and unpack SB3's sdist; return the directory holding its ``tests/``."""
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / f"stable_baselines3-{VERSION}"
    if (root / "tests" / "test_buffers.py").exists():
        return root
    given = os.environ.get("SB3_SDIST")
    sdist = Path(given) if given else cache / SDIST
    if not sdist.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"stable-baselines3=={VERSION}",
                "-d",
                str(cache),
            ],
            check=True,
        )
    digest = _sha256(sdist)
    if digest != SHA256:
        raise SystemExit(f"{sdist}: SHA-256 {digest} is not the pinned {SHA256}")
    tmp = cache / f".unpack-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp, filter="data")
    os.replace(tmp / root.name, root)
    shutil.rmtree(tmp, ignore_errors=True)
    return root


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, fetch SB3's tests, run pytest on them; return pytest's exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help=f"SB3 test files (default: {' '.join(FILES)})")
    parser.add_argument("--baseline", action="store_true", help="run with SB3's own buffers")
    parser.add_argument(
        "--cache", default=os.environ.get("REPLAYSTORE_SB3_CACHE", str(Path.home() / ".cache" / "replaystore"))
    )
    args = parser.parse_args(argv)
    root = fetch_tests(Path(args.cache))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO / "src"), env.get("PYTHONPATH", "")])
    if args.baseline:
        env["REPLAYSTORE_SB3_REDIRECT"] = "none"
    files = [f"tests/{f}" for f in (args.files or FILES)]
    cmd = [sys.executable, "-m", "pytest", "-p", "sb3_redirect", "-p", "no:cacheprovider", *files, *extra]
    print("+", " ".join(cmd), f"(cwd {root})", flush=True)
    return subprocess.call(cmd, cwd=root, env=env)


if __name__ == "__main__":
    sys.exit(main())
