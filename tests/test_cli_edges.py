"""Small edges of the command line and of folders (issue 38 item 9, issue 37 item 4).

``replaystore --version``; ``shm rm`` with no name is an error; ``shm rm --force NAME`` works as
``rm NAME --force``; ``inspect --plot`` and ``SharedTable.create(directory=...)`` make no folders
(a typo must not start a new tree); ``examples/demo_custom_config.py`` writes nothing into the
working directory (the source tree, when run from it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import replaystore as rs
from replaystore import cli
from replaystore.shared import SharedTable

ROOT = Path(__file__).resolve().parents[1]
SPEC = {"x": ((2,), np.float32)}


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"replaystore {rs.__version__}"


def test_shm_rm_without_a_name_is_an_error(tmp_path, capsys):
    assert cli.main(["shm", "rm", "--dir", str(tmp_path)]) == 2
    assert "name the tables to remove, or pass --all" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["shm", "rm", "--force", "t", "--dir", "{d}"],
        ["shm", "rm", "t", "--force", "--dir", "{d}"],
        ["shm", "--dir", "{d}", "rm", "--force", "t"],
    ],
    ids=["force-first", "force-last", "dir-before-rm"],
)
def test_shm_rm_force_anywhere_removes_an_open_table(tmp_path, capsys, argv):
    t = SharedTable.create("t", 8, SPEC, directory=tmp_path)
    try:
        assert cli.main([a.format(d=tmp_path) for a in argv]) == 0
        assert "removed t" in capsys.readouterr().out
        assert list(tmp_path.iterdir()) == []
    finally:
        t.close()


def test_shm_list_with_dir_before_or_after(tmp_path, capsys):
    t = SharedTable.create("listed", 8, SPEC, directory=tmp_path)
    try:
        for argv in (["shm", "--dir", str(tmp_path), "list"], ["shm", "list", "--dir", str(tmp_path)]):
            assert cli.main(argv) == 0
            assert "listed" in capsys.readouterr().out
    finally:
        t.close()
        t.unlink()


def test_inspect_plot_into_a_missing_folder_is_an_error_and_makes_none(tmp_path, capsys):
    table = rs.Table(10)
    table.extend({"x": np.zeros((4, 2), np.float32)})
    table.save(tmp_path / "ckpt")
    out = tmp_path / "typo" / "fig.png"
    assert cli.main(["inspect", str(tmp_path / "ckpt"), "--plot", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()


def test_shared_table_create_in_a_missing_directory_is_named_and_makes_none(tmp_path):
    with pytest.raises(rs.InvalidArgument, match="does not exist: create it first"):
        SharedTable.create("t", 8, SPEC, directory=tmp_path / "typo" / "shm")
    assert list(tmp_path.iterdir()) == []


def test_demo_custom_config_writes_its_figure_outside_the_working_directory(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    pytest.importorskip("matplotlib")
    cwd, tmp = tmp_path / "checkout", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    env = dict(os.environ, MPLBACKEND="Agg", TMPDIR=str(tmp), PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo_custom_config.py"), "--smoke"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert list(cwd.iterdir()) == []  # nothing written where it was run from
    assert (tmp / "demo_custom.png").read_bytes()[:4] == b"\x89PNG"
