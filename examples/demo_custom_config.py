"""Run the `replaystore demo` training loop from Python with your own hyperparameters.

Run: ``pip install 'replaystore[demo]'``, then ``python examples/demo_custom_config.py``.
"""

from replaystore.demo import DemoConfig
from replaystore.demo.plot import plot_result
from replaystore.demo.train import train

config = DemoConfig(seed=1, alpha=0.5, beta_start=0.5, batch_size=128, total_steps=60_000)
result = train(config, progress=True)
print(f"final greedy return over {len(result.final_returns)} episodes: {result.final_return:.1f} "
      f"after {result.steps:,} steps ({result.wall_time:.0f} s)")
print("buffer:", {k: result.stats[k] for k in ("size", "priority_max", "sample_to_insert_ratio")})
plot_result(result, "demo_custom.png")
print("figure: demo_custom.png")
