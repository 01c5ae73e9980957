"""The demo: figure name and title per n-step, the "solved" bar, and progress lines without a bar."""

from replaystore.demo.config import DemoConfig


def test_figure_name_and_title_follow_n_step():
    assert DemoConfig().figure_name == "replaystore-demo.png"
    assert DemoConfig(n_step=3).figure_name == "replaystore-demo-nstep3.png"
    assert "3-step" in DemoConfig(n_step=3).title and "step" not in DemoConfig().title


def test_the_solved_bar_is_below_the_stopping_bar():
    c = DemoConfig()
    assert c.pass_return == 450 and c.pass_return <= c.solved_return


def test_without_a_bar_the_demo_prints_a_line_at_least_every_period():
    import io
    import time

    from replaystore.demo.train import Reporter

    out = io.StringIO()
    r = Reporter(100, progress=False, out=out, every=60.0)  # a period no loaded machine reaches
    r.advance(10, ret="9")
    assert out.getvalue() == ""  # not due yet
    r.last = time.monotonic() - 61.0  # the period has passed
    r.advance(5, ret="12")
    assert out.getvalue() == "step      15: ret 12\n"
    r.last = time.monotonic() - 61.0
    r.message("evaluation")  # any line restarts the period
    r.advance(1, ret="13")
    assert out.getvalue().splitlines()[-1] == "evaluation"
