"""The demo's figure: learning curve, priorities, times sampled, sample-to-insert ratio."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .config import DemoResult


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to ``window`` values (shorter at the start), same length as ``values``."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        return values
    c = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, len(values) + 1)
    lo = np.maximum(0, idx - window)
    return (c[idx] - c[lo]) / (idx - lo)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _priority_panel(ax, priorities: np.ndarray, when: str = "", xlabel: str = "priority") -> None:
    """Histogram of live priorities (log counts)."""
    if len(priorities):
        ax.hist(priorities, bins=60, color="tab:purple")
        ax.set_yscale("log")
    title = f"Priorities of the {len(priorities):,} live items" + (f" {when}" if when else "")
    ax.set(title=title, xlabel=xlabel, ylabel="items (log scale)")


def _times_sampled_panel(ax, times_sampled: np.ndarray) -> None:
    """Histogram of how often each live item was sampled (log counts)."""
    if len(times_sampled):
        hi = int(times_sampled.max())
        bins = np.arange(hi + 2) - 0.5 if hi < 60 else 60
        ax.hist(times_sampled, bins=bins, color="tab:red")
        ax.set_yscale("log")
        ax.axvline(times_sampled.mean(), color="k", ls="--", lw=1, label=f"mean {times_sampled.mean():.1f}")
        ax.legend(fontsize=8)
    ax.set(title="Times each live item was sampled", xlabel="times sampled", ylabel="items (log scale)")


def plot_checkpoint(
    priorities: np.ndarray, times_sampled: np.ndarray, path: str | os.PathLike, title: str = ""
) -> list[str]:
    """Write a two-panel PNG (priority distribution, times-sampled histogram); return the panel titles."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    if title:
        fig.suptitle(title, fontsize=11)
    _priority_panel(axes[0], np.asarray(priorities))
    _times_sampled_panel(axes[1], np.asarray(times_sampled))
    fig.tight_layout(rect=(0, 0, 1, 0.94) if title else None)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [ax.get_title() for ax in axes]


def plot_result(result: "DemoResult", path: str | os.PathLike, window: int = 20) -> list[str]:
    """Write the four-panel PNG of ``result`` to ``path`` (Matplotlib, Agg backend); return the panel titles."""
    plt = _pyplot()
    cfg = result.config
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    fig.suptitle(
        f"replaystore demo: {cfg.title} on {cfg.env_id} (seed {cfg.seed}): "
        f"final greedy return {result.final_return:.1f}, {result.steps:,} steps, "
        f"{result.wall_time:.0f} s",
        fontsize=11,
    )

    ax = axes[0, 0]
    steps = np.asarray(result.episode_end_steps)
    rets = np.asarray(result.episode_returns)
    if len(rets):
        ax.plot(steps, rets, ".", ms=3, alpha=0.4, color="tab:blue", label="episode return")
        ax.plot(
            steps, moving_average(rets, window), color="tab:blue", lw=2, label=f"moving average ({window} episodes)"
        )
    if result.evaluations:
        es, ev = zip(*result.evaluations)
        ax.plot(es, ev, "s", color="tab:orange", ms=5, label="greedy evaluation (selection)")
    ax.axhline(
        result.final_return,
        color="tab:green",
        ls="--",
        label=f"final evaluation: {result.final_return:.1f} ({len(result.final_returns)} episodes)",
    )
    ax.axhline(cfg.pass_return, color="black", ls=":", lw=1, label=f"solved: final evaluation >= {cfg.pass_return:.0f}")
    ax.axhline(
        cfg.solved_return,
        color="grey",
        ls=":",
        lw=0.8,
        alpha=0.6,
        label=f"training stops: evaluation >= {cfg.solved_return:.0f}",
    )
    top = max([cfg.solved_return, result.final_return, *rets.tolist()], default=1.0)
    ax.set_ylim(0, top * 1.28)  # room for the legend above the curves
    ax.set(title="Learning curve", xlabel="environment steps", ylabel="return")
    ax.legend(loc="upper center", fontsize=8, ncol=2)

    _priority_panel(
        axes[0, 1],
        np.asarray(result.priorities),
        "at the end",
        xlabel="priority: |TD error| + eps (new items enter at the largest seen)",
    )
    _times_sampled_panel(axes[1, 0], np.asarray(result.times_sampled))

    ax = axes[1, 1]
    if result.ratio_steps:
        ax.plot(result.ratio_steps, result.ratio_values, color="tab:brown")
    ax.axvline(cfg.learning_starts, color="grey", ls=":", lw=1, label="learning starts")
    ax.set(
        title="Sample-to-insert ratio (table.stats())",
        xlabel="environment steps",
        ylabel="items sampled / items inserted",
    )
    ax.legend(fontsize=8)

    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [ax.get_title() for ax in axes.ravel()]
