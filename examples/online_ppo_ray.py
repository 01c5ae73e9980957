"""Online PPO on Ray with replaystore's fragment service (MineStudio's system, on CartPole).

Rollout actors play CartPole-v1 with the latest policy they were sent and write fragments of
``--fragment-length`` steps to the replay service (payload to the LMDB store, metadata to the
service). The learner fetches whole fragments, recomputes values and advantages with its current
critic (GAE, bootstrapping from each fragment's ``next_obs``), runs clipped PPO updates, bumps the
model version and broadcasts the weights. ``max_staleness`` keeps fragments from old policies out of
the batches, ``max_reuse`` bounds how often a fragment is trained on; the importance ratio uses the
behaviour policy's log-probabilities stored in each fragment.

    nice python examples/online_ppo_ray.py            # ~1-2 minutes on 2 cores; prints progress

Ends with ``ray.shutdown()``. Needs ``replaystore[ray,lmdb,torch]`` and gymnasium.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid

import numpy as np

import replaystore as rs
from replaystore import ray as rsr

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on loopback
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def make_policy():
    """Actor-critic MLP for CartPole: 4 observations, 2 actions."""
    import torch
    from torch import nn

    class Policy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pi = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
            self.v = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))

        def dist(self, obs):
            return torch.distributions.Categorical(logits=self.pi(obs))

    torch.set_num_threads(1)
    return Policy()


class RolloutWorker:
    """One CartPole environment stream; writes fragments to the replay service."""

    def __init__(self, service: str, fragment_length: int, seed: int) -> None:
        import gymnasium as gym
        import torch

        self.torch = torch
        self.env = gym.make("CartPole-v1")
        self.obs, _ = self.env.reset(seed=seed)
        self.policy = make_policy()
        self.fragments = rsr.connect(service).fragments
        self.stream = f"cartpole-{uuid.uuid4().hex[:8]}"
        self.seq = 0
        self.T = fragment_length
        self.version, self.session = -1, ""
        self.episode_return, self.returns = 0.0, []
        self.rng = np.random.default_rng(seed)
        torch.manual_seed(seed)

    def set_weights(self, state_dict, version: int, session: str) -> None:
        """Use these weights (model ``version`` of ``session``) from the next fragment on."""
        self.policy.load_state_dict(state_dict)
        self.version, self.session = version, session

    def collect(self, n_fragments: int) -> list[float]:
        """Play ``n_fragments`` fragments; return the returns of the episodes that ended."""
        torch = self.torch
        for _ in range(n_fragments):
            obs = np.zeros((self.T, 4), np.float32)
            act = np.zeros(self.T, np.int64)
            logp = np.zeros(self.T, np.float32)
            rew = np.zeros(self.T, np.float32)
            term = np.zeros(self.T, bool)  # episode ended by failure: no bootstrap
            done = np.zeros(self.T, bool)  # episode ended (failure or time limit)
            version = self.version
            for t in range(self.T):
                obs[t] = self.obs
                with torch.no_grad():
                    d = self.policy.dist(torch.as_tensor(self.obs, dtype=torch.float32))
                    a = d.sample()
                act[t], logp[t] = int(a), float(d.log_prob(a))
                self.obs, r, terminated, truncated, _ = self.env.step(int(a))
                rew[t], term[t], done[t] = r, terminated, terminated or truncated
                self.episode_return += r
                if done[t]:
                    self.returns.append(self.episode_return)
                    self.episode_return = 0.0
                    self.obs, _ = self.env.reset()
            payload = {"obs": obs, "action": act, "logp": logp, "reward": rew, "terminated": term,
                       "done": done, "next_obs": np.asarray(self.obs, np.float32)}
            self.fragments.write(payload, self.stream, self.seq, version, self.session)
            self.seq += 1
        out, self.returns = self.returns, []
        return out


def gae(policy, batch, gamma: float, lam: float):
    """Advantages and returns for a list of fragments, with the learner's current critic."""
    import torch

    obs = torch.as_tensor(np.stack([f["obs"] for f in batch]))
    nxt = torch.as_tensor(np.stack([f["next_obs"] for f in batch]))
    with torch.no_grad():
        v = policy.v(obs).squeeze(-1).numpy()
        v_last = policy.v(nxt).squeeze(-1).numpy()
    B, T = v.shape
    adv = np.zeros((B, T), np.float32)
    last = np.zeros(B, np.float32)
    for t in reversed(range(T)):
        v_next = v_last if t == T - 1 else v[:, t + 1]
        done = np.stack([f["done"][t] for f in batch])
        term = np.stack([f["terminated"][t] for f in batch])
        rew = np.stack([f["reward"][t] for f in batch])
        # after a time-limit cut the next state belongs to a new episode: use the current value
        # as an approximate bootstrap; after a failure there is none
        v_boot = np.where(term, 0.0, np.where(done, v[:, t], v_next))
        delta = rew + gamma * v_boot - v[:, t]
        last = delta + gamma * lam * np.where(done, 0.0, last)
        adv[:, t] = last
    return obs, adv, adv + v


def main(argv=None) -> int:
    """Run the online PPO loop; print progress every 5 iterations."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--fragment-length", type=int, default=128)
    p.add_argument("--fragments-per-worker", type=int, default=4, help="per iteration")
    p.add_argument("--fetch", type=int, default=8, help="fragments per PPO batch")
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--max-reuse", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="a few seconds: 2 iterations of short fragments")
    args = p.parse_args(argv)
    if args.smoke:
        args.iterations, args.fragment_length, args.fragments_per_worker, args.fetch = 2, 32, 2, 2

    import torch

    ray = rsr.init_local(num_cpus=2, log_to_driver=True)
    torch.manual_seed(args.seed)
    path = tempfile.mkdtemp(prefix="ppo-fragments-")
    client = rsr.serve(
        name="ppo-replay",
        fragments=rsr.FragmentBufferConfig(max_chunks=64, max_staleness=args.max_staleness, max_reuse=args.max_reuse,
                                           fragments_per_chunk=1, path=path, num_shards=1, seed=args.seed),
    )
    fc = client.fragments
    session = uuid.uuid4().hex
    policy = make_policy()
    opt = torch.optim.Adam(policy.parameters(), lr=2.5e-3)
    # max_concurrency=2: new weights arrive while a worker is collecting
    workers = [ray.remote(num_cpus=0, max_concurrency=2)(RolloutWorker)
               .remote("ppo-replay", args.fragment_length, args.seed + i) for i in range(args.workers)]

    def broadcast(version: int) -> None:
        fc.update_model_version(session, version)
        weights = ray.put({k: v.clone() for k, v in policy.state_dict().items()})
        ray.get([w.set_weights.remote(weights, version, session) for w in workers], timeout=60)

    version = 0
    broadcast(version)
    collecting = {i: w.collect.remote(args.fragments_per_worker) for i, w in enumerate(workers)}
    recent: list[float] = []
    t_start = t_last = time.time()
    try:
        def refill() -> None:
            """Collect the episode returns of idle workers and start their next rollouts."""
            nonlocal recent
            for i, ref in list(collecting.items()):
                if ray.wait([ref], timeout=0)[0]:
                    recent += ray.get(ref, timeout=60)
                    collecting[i] = workers[i].collect.remote(args.fragments_per_worker)

        for it in range(1, args.iterations + 1):
            deadline = time.monotonic() + 300
            while True:  # keep the workers busy while waiting for enough fresh fragments
                refill()
                try:
                    fetch = fc.fetch(args.fetch, timeout=1.0)
                    break
                except rs.Timeout:
                    if time.monotonic() > deadline:
                        raise
            batch = [fc.load(r.fragment_id) for r in fetch.records]
            staleness = [version - r.version for r in fetch.records]
            fc.release(fetch)
            obs, adv, ret = gae(policy, batch, gamma=0.99, lam=0.95)
            act = torch.as_tensor(np.stack([f["action"] for f in batch]))
            old_logp = torch.as_tensor(np.stack([f["logp"] for f in batch]))
            adv_t = torch.as_tensor(adv)
            adv_t = (adv_t - adv_t.mean()) / (adv_t.std() + 1e-8)
            ret_t = torch.as_tensor(ret)
            for _ in range(args.epochs):
                d = policy.dist(obs)
                ratio = torch.exp(d.log_prob(act) - old_logp)
                pg = -torch.min(ratio * adv_t, ratio.clamp(0.8, 1.2) * adv_t).mean()
                vf = (policy.v(obs).squeeze(-1) - ret_t).pow(2).mean()
                loss = pg + 0.5 * vf - 0.01 * d.entropy().mean()
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
                opt.step()
            version += 1
            # collect the finished rollouts' episode returns, send new weights, start the next rollouts
            broadcast(version)
            refill()
            recent = recent[-20:]
            if it % 5 == 0 or it == 1 or time.time() - t_last > 20:
                t_last = time.time()
                st = fc.stats()
                mean_ret = np.mean(recent) if recent else float("nan")
                print(f"iter {it:3d}  version {version:3d}  return(last 20 ep) {mean_ret:6.1f}  "
                      f"batch staleness {np.mean(staleness):.2f}  chunks {st['replay_buffer_size_chunks']:2d}  "
                      f"retired {st['chunks_retired']:3d}  stale-dropped {st['chunks_dropped_stale']:3d}  "
                      f"{time.time() - t_start:5.1f}s", flush=True)
        print(f"final mean return over the last 20 episodes: {np.mean(recent) if recent else float('nan'):.1f}")
    finally:
        client.shutdown()
        ray.shutdown()
        shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
