"""The ``replaystore`` command: inspect (+ --plot), tour, demo options, bench pass-through."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import replaystore as rs
from replaystore import cli
from replaystore.demo import command as demo_command


@pytest.fixture
def checkpoint(tmp_path):
    t = rs.Table(
        100,
        sampler=rs.Prioritized(alpha=0.6, beta=0.4),
        remover=rs.Fifo(),
        rate_limiter=rs.SampleToInsertRatio(4.0, min_size_to_sample=10, error_buffer=1000.0),
        seed=1,
        name="small",
    )
    n = 60
    t.extend(
        {
            "obs": np.zeros((n, 4), np.float32),
            "action": np.arange(n, dtype=np.int64),
            "reward": np.ones(n, np.float32),
            "img": {"pixels": np.zeros((n, 2, 3), np.uint8)},
        }
    )
    for _ in range(5):
        s = t.sample(8)
        t.update_priorities(s.keys, np.linspace(0.1, 3.0, 8))
    path = tmp_path / "ckpt"
    t.save(path)
    return path


def test_inspect_prints_summary(checkpoint, capsys):
    assert cli.main(["inspect", str(checkpoint)]) == 0
    out = capsys.readouterr().out
    assert "table 'small', 60 / 100 items" in out
    assert "storage: columns" in out
    assert "obs" in out and "(4,)" in out and "float32" in out
    assert "action" in out and "int64" in out
    assert "img/pixels" in out and "(2, 3)" in out and "uint8" in out
    assert "sampler:" in out and "Prioritized" in out and "0.6" in out
    assert "remover:" in out and "Fifo" in out
    assert "rate limiter:" in out and "SampleToInsertRatio" in out
    assert "inserts=60" in out and "samples=40" in out


def test_inspect_missing_checkpoint(tmp_path, capsys):
    assert cli.main(["inspect", str(tmp_path / "nope")]) == 2
    assert "error:" in capsys.readouterr().err


def test_inspect_plot_writes_png(checkpoint, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "figs" / "ckpt.png"
    out.parent.mkdir()  # (inspect makes no folders: tests/test_cli_edges.py)
    assert cli.main(["inspect", str(checkpoint), "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    assert "priorities: min" in text and "times sampled: mean" in text and str(out) in text


def test_plot_checkpoint_panels(tmp_path):
    pytest.importorskip("matplotlib")
    from replaystore.demo.plot import plot_checkpoint

    titles = plot_checkpoint(np.array([1.0, 2.0, 2.0]), np.array([0, 3, 1]), tmp_path / "x.png", title="t")
    assert len(titles) == 2 and "Priorities" in titles[0] and "sampled" in titles[1]


def test_tour_runs_with_tiny_sizes(tmp_path, capsys):
    args = ["tour", "--capacity", "3000", "--inserts", "2000", "--iterations", "5", "--checkpoint", str(tmp_path)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "inserted 2,000 transitions" in out
    assert "keys identical: True" in out
    assert '"sample_to_insert_ratio"' in out
    assert (tmp_path / "demo-checkpoint" / "manifest.json").exists()


def test_top_level_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for command in ("demo", "tour", "inspect", "bench"):
        assert command in out


def test_demo_help_lists_options(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for option in (
        "--seed",
        "--steps",
        "--out",
        "--device",
        "--threads",
        "--eval-episodes",
        "--no-progress",
        "--distributed",
        "CartPole-v1",
        "[demo]",
    ):
        assert option in out


@pytest.mark.parametrize("option", ["--steps", "--threads", "--eval-episodes"])
def test_demo_rejects_non_positive_counts(option, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", option, "0"])
    assert e.value.code == 2
    assert "positive integer" in capsys.readouterr().err


def test_demo_without_the_extra_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setattr(demo_command, "missing_demo_dependencies", lambda: ["torch", "gymnasium"])
    assert cli.main(["demo", "--steps", "10"]) == 2
    err = capsys.readouterr().err
    assert "torch, gymnasium" in err and "replaystore[demo]" in err


def test_missing_demo_dependencies_is_a_list():
    missing = demo_command.missing_demo_dependencies()
    assert set(missing) <= {"torch", "gymnasium", "tqdm", "matplotlib"}


def test_bench_without_harness(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "bench_script", lambda: tmp_path / "bench" / "run.py")
    assert cli.main(["bench", "per"]) == 2
    err = capsys.readouterr().err
    assert "no benchmark harness" in err and "source repository" in err


def test_bench_passes_arguments_through(monkeypatch, tmp_path, capfd):
    script = tmp_path / "bench" / "run.py"
    script.parent.mkdir()
    script.write_text("import sys\nprint('ARGS', sys.argv[1:], sys.executable)\nsys.exit(3)\n")
    monkeypatch.setattr(cli, "bench_script", lambda: script)
    assert cli.main(["bench", "per_256", "--repeats", "2", "--quick"]) == 3
    out = capfd.readouterr().out
    assert "ARGS ['per_256', '--repeats', '2', '--quick']" in out
    assert sys.executable in out


def test_bench_script_points_at_the_checkout():
    path = cli.bench_script()
    assert path.parts[-2:] == ("bench", "run.py")
    assert path.parent.parent == Path(cli.__file__).resolve().parents[2]
    repo_bench = Path(__file__).resolve().parents[1] / "bench" / "run.py"
    if repo_bench.exists():  # editable install from this checkout
        assert path == repo_bench


def test_module_entry_point(checkpoint):
    r = subprocess.run(
        [sys.executable, "-m", "replaystore.cli", "inspect", str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "60 / 100 items" in r.stdout
