"""Progress lines for the examples: at least one every ``every`` seconds, so no run is silent.

Imported by the example scripts (run as ``python examples/NAME.py``, this directory is on the path).
"""

from __future__ import annotations

import time
from typing import Any


class Ticker:
    """``tick(message_fn)`` prints ``message_fn()`` when ``every`` seconds passed since the last line."""

    def __init__(self, every: float = 20.0) -> None:
        self.every = every
        self.start = self.last = time.monotonic()

    def due(self) -> bool:
        """Whether a line is due now (and, if so, restart the clock)."""
        now = time.monotonic()
        if now - self.last < self.every:
            return False
        self.last = now
        return True

    def tick(self, message: Any) -> None:
        """Print ``message()`` (a callable, evaluated only when due) with the elapsed time."""
        if self.due():
            print(f"[{time.monotonic() - self.start:6.0f} s] {message()}", flush=True)


def sb3_progress(every: float = 20.0) -> Any:
    """An SB3 callback printing the step count and recent episode return / success every ``every`` s."""
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    class _Progress(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.ticker = Ticker(every)

        def _line(self) -> str:
            eps = list(self.model.ep_info_buffer or [])
            ret = f", mean return of the last {len(eps)} episodes {np.mean([e['r'] for e in eps]):.1f}" if eps else ""
            succ = list(self.model.ep_success_buffer or [])
            rate = f", success rate {np.mean(succ):.2f}" if succ else ""
            return f"step {self.num_timesteps:,}{ret}{rate}"

        def _on_step(self) -> bool:
            self.ticker.tick(self._line)
            return True

    return _Progress()
