"""Run the `replaystore demo` training loop from Python with your own hyperparameters.

Run: ``pip install 'replaystore[demo]'``, then ``python examples/demo_custom_config.py``
(``--smoke``: a few seconds, 600 steps). Prints a line per greedy evaluation (every 2,500 steps),
then the final greedy return, and writes the figure to ``--out`` (default: ``demo_custom.png`` in
the system's temporary directory, never into the source tree).
"""

import argparse
import os
import tempfile

from replaystore.demo import DemoConfig
from replaystore.demo.plot import plot_result
from replaystore.demo.train import train

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--smoke", action="store_true", help="a few seconds: 600 steps, 2 evaluation episodes")
parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "demo_custom.png"), help="the figure (PNG)")
args = parser.parse_args()
smoke = {"total_steps": 600, "learning_starts": 200, "eval_every": 300, "eval_episodes": 2} if args.smoke else {}
config = DemoConfig(**{"seed": 1, "alpha": 0.5, "beta_start": 0.5, "batch_size": 128, "total_steps": 60_000,
                       **smoke})
result = train(config, progress=False)   # progress=True: a tqdm bar instead of the evaluation lines
print(f"final greedy return over {len(result.final_returns)} episodes: {result.final_return:.1f} "
      f"after {result.steps:,} steps ({result.wall_time:.0f} s)")
print("buffer:", {k: result.stats[k] for k in ("size", "priority_max", "sample_to_insert_ratio")})
plot_result(result, args.out)
print("figure:", args.out)
