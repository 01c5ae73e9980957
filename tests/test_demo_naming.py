"""``replaystore demo --n-step 3`` names its own figure and says 3-step; "solved" uses the figure's bar."""

from replaystore.demo.config import DemoConfig


def test_figure_name_and_title_follow_n_step():
    assert DemoConfig().figure_name == "replaystore-demo.png"
    assert DemoConfig(n_step=3).figure_name == "replaystore-demo-nstep3.png"
    assert "3-step" in DemoConfig(n_step=3).title and "step" not in DemoConfig().title


def test_the_solved_bar_is_below_the_stopping_bar():
    c = DemoConfig()
    assert c.pass_return == 450 and c.pass_return <= c.solved_return
