"""Multi-agent replay (issue #33) against RLlib's ``MultiAgentEpisodeReplayBuffer``, in one process.

RLlib (``ray[rllib]``) downgrades gymnasium, so it lives in a venv of its own; this script runs in
that venv with replaystore on ``PYTHONPATH`` (replaystore needs only NumPy there)::

    python3 -m venv /work/venv-rllib
    /work/venv-rllib/bin/pip install torch==2.13.0         # the CPU wheel first (pip's local file)
    /work/venv-rllib/bin/pip install "ray[rllib]==2.60.0" numpy
    PYTHONPATH=src nice -n 10 /work/venv-rllib/bin/python bench/bench_multiagent_rllib.py --steps 100000

The same environment steps as ``bench_multiagent.py`` (8 agents x (obs float32[16], action int64,
reward float32, terminated, truncated), episodes of 1,000 steps): RLlib gets them as
``MultiAgentEpisode`` objects (built with ``add_env_reset``/``add_env_step`` and ``to_numpy()``, as
its env runners hand them over: not timed), replaystore as rows (``bench_multiagent``'s
``MultiAgentTable``, which also keeps ``next_obs`` per agent, the ``alive`` mask and a global
state float32[32] per step: more payload). Timed (CPU time per call, median of ``--repeats`` runs of
``--seconds``): a synchronized sample of 256 environment steps (RLlib ``replay_mode="synchronized"``
vs ``sample_joint(256)``), an independent sample of 256 (step, agent) pairs (RLlib
``replay_mode="independent"``, every agent mapped to one shared module, vs ``sample(256)``),
and the write of the steps (RLlib's ``add`` of the episodes vs ``Table.extend_steps``
of the rows, per environment step). Memory: RSS growth per environment step.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_multiagent import PAYLOAD, A, B, build_replaystore, chunks, cpu_per_call, rss  # noqa: E402

EPISODE = 1000
RLLIB_PAYLOAD = A * (16 * 4 + 8 + 4 + 2)  # obs once per step (RLlib keeps o_t+1 as the next step's obs)


def rllib_episodes(n: int) -> list:
    """The steps of ``chunks(n)`` as RLlib ``MultiAgentEpisode`` objects of ``EPISODE`` steps each."""
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode

    names = [f"agent_{i}" for i in range(A)]
    out = []
    for agents, _state, _ends in chunks(n):
        for s in range(0, len(agents["obs"]), EPISODE):
            ep = MultiAgentEpisode()
            ep.add_env_reset(observations={a: agents["obs"][s, i] for i, a in enumerate(names)}, infos={})
            for t in range(s, min(s + EPISODE, len(agents["obs"]))):
                last = t == s + EPISODE - 1
                ep.add_env_step(
                    observations={a: agents["next_obs"][t, i] for i, a in enumerate(names)},
                    actions={a: int(agents["action"][t, i]) for i, a in enumerate(names)},
                    rewards={a: float(agents["reward"][t, i]) for i, a in enumerate(names)},
                    infos={},
                    terminateds={"__all__": last, **{a: last for a in names}},
                    truncateds={"__all__": False, **{a: False for a in names}},
                )
            out.append(ep.to_numpy())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0)
    args = p.parse_args()
    from ray.rllib.utils.replay_buffers import MultiAgentEpisodeReplayBuffer

    n = args.steps
    out: dict = {"steps": n, "agents": A, "batch": B, "payload_replaystore": PAYLOAD, "payload_rllib": RLLIB_PAYLOAD}
    gc.collect()
    r0 = rss()
    c0 = time.process_time()
    ma = build_replaystore(n)
    out["replaystore_write_us_per_step"] = 1e6 * (time.process_time() - c0) / n
    out["replaystore_bytes_per_step"] = (rss() - r0) / n
    out["replaystore_sync_us"] = 1e6 * cpu_per_call(lambda: ma.sample_joint(B), args.seconds, args.repeats)
    out["replaystore_independent_us"] = 1e6 * cpu_per_call(lambda: ma.sample(B), args.seconds, args.repeats)
    ma = None
    gc.collect()
    r0 = rss()
    c0 = time.process_time()
    episodes = rllib_episodes(n)
    out["rllib_build_episodes_us_per_step"] = 1e6 * (time.process_time() - c0) / n
    buf = MultiAgentEpisodeReplayBuffer(capacity=2 * n * A, batch_size_B=B)
    c0 = time.process_time()
    for i in range(0, len(episodes), 10):
        buf.add(episodes[i : i + 10])
    out["rllib_add_us_per_step"] = 1e6 * (time.process_time() - c0) / n
    episodes = None
    gc.collect()
    out["rllib_bytes_per_step"] = (rss() - r0) / n
    out["rllib_env_steps_stored"] = buf.get_num_timesteps()
    sync = buf.sample(batch_size_B=B, replay_mode="synchronized")
    out["rllib_sync_rows"] = {str(k): len(v) for k, v in sync.items()} if isinstance(sync, dict) else len(sync)
    ind = buf.sample(batch_size_B=B, replay_mode="independent")
    out["rllib_independent_rows"] = sum(len(e) for e in ind) if isinstance(ind, list) else str(type(ind))
    out["rllib_sync_us"] = 1e6 * cpu_per_call(
        lambda: buf.sample(batch_size_B=B, replay_mode="synchronized"), args.seconds, args.repeats
    )
    out["rllib_independent_us"] = 1e6 * cpu_per_call(
        lambda: buf.sample(batch_size_B=B, replay_mode="independent"), args.seconds, args.repeats
    )
    out["sync_speedup"] = out["rllib_sync_us"] / out["replaystore_sync_us"]
    out["independent_speedup"] = out["rllib_independent_us"] / out["replaystore_independent_us"]
    with open("/proc/loadavg") as f:
        out["loadavg"] = f.read().split()[:3]
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
