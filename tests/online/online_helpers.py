"""Helpers shared by the tests of replaystore.online (a module, not a conftest)."""


class FakeClock:
    """A wall clock the test moves by hand (``clock.t += 6``)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def snapshot(buf):
    """Everything a refused call must leave as it was: stats, the budget's state, the table's size."""
    s = buf.stats()
    s.pop("budget", None)
    return s, (None if buf.budget is None else buf.budget.state()), len(buf.table)
