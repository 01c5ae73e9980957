"""Asynchronous policy gradient on Ray: dropping stale rollouts vs pacing producers (replaystore.online).

A toy token-generation task with variable rollout lengths. Each prompt ``p`` asks for a sequence
of ``L_p`` tokens (``(p + t) % V`` at position ``t``; reward: the fraction right); half of the
prompts are short (2-8 tokens), half long (40-56). Producers (Ray actors) decode the ``--group``
completions of a prompt as one batch (a GRPO group) with the latest weights they have, at a fixed
cost per token (``--token-ms``, a stand-in for an LLM's decode step), and pull new weights every 8
tokens: a rollout can span a weight update and carries its version range. The trainer samples
``--batch`` whole groups per step, runs one clipped importance-weighted policy-gradient step
(per-token rewards, the group's mean as baseline) and publishes the new weights.

Two modes, same everything else (``max_staleness``, pick ``fifo``):

- ``drop``: producers run freely; groups more than ``max_staleness`` versions behind (by their
  oldest token) are dropped - long rollouts go stale far more often, so training sees fewer of them;
- ``pace``: producers take a ticket per group from the version budget (AReaL's rule) and wait when
  it is spent; nothing is dropped.

It prints rollouts dropped, the length distribution of generated vs trained data, throughput and
the learning curve (greedy reward on short and long prompts) for each mode.

    nice python examples/async_pg_pacing.py                 # both modes, ~2-3 minutes on 2 cores
    nice python examples/async_pg_pacing.py --modes pace --steps 100
    python examples/async_pg_pacing.py --smoke                # seconds once Ray is up

Needs ``replaystore[ray,lmdb,torch]``. Ends with ``ray.shutdown()``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on loopback
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

VOCAB = 8
MAX_LEN = 64


def prompt_lengths(num_prompts: int, seed: int = 0) -> np.ndarray:
    """Half short (2-8), half long (40-56) target lengths."""
    rng = np.random.default_rng(seed)
    half = num_prompts // 2
    return np.concatenate([rng.integers(2, 9, half), rng.integers(40, 57, num_prompts - half)])


def make_policy(num_prompts: int):
    """Logits over ``VOCAB`` tokens from (prompt, position): an MLP on one-hot inputs."""
    import torch
    from torch import nn

    torch.set_num_threads(1)

    class Policy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(num_prompts + MAX_LEN, 128), nn.Tanh(), nn.Linear(128, VOCAB))

        def logits(self, prompts, positions):
            x = torch.cat([nn.functional.one_hot(prompts, num_prompts).float(),
                           nn.functional.one_hot(positions, MAX_LEN).float()], -1)
            return self.net(x)

    return Policy()


def reward(prompt: int, tokens: np.ndarray) -> float:
    """The fraction of tokens equal to ``(prompt + t) % VOCAB``."""
    return float(np.mean(tokens == (prompt + np.arange(len(tokens))) % VOCAB))


class WeightStore:
    """The latest policy weights and their version (a Ray actor in the examples)."""

    def __init__(self) -> None:
        self.version, self.state = 0, None

    def set(self, version: int, state: dict) -> None:
        """Publish ``state`` as ``version``."""
        self.version, self.state = version, state

    def get(self, have: int) -> tuple:
        """``(version, state)`` if newer than ``have``, else ``(have, None)``."""
        return (self.version, self.state) if self.version > have else (have, None)


def clipped_pg_step(policy, opt, rollouts: list) -> float:
    """One clipped importance-weighted policy-gradient step over tokens (PPO's clip at 0.2); the loss.

    ``rollouts``: ``(payload, advantages)`` pairs; a payload has ``prompt``, ``tokens`` and the
    behaviour ``logp``; advantages are per token (an array) or one number for every token.
    """
    import torch

    prompts, positions, tokens, old_logp, adv = [], [], [], [], []
    for data, a in rollouts:
        n = len(data["tokens"])
        prompts += [data["prompt"]] * n
        positions += list(range(n))
        tokens += data["tokens"].tolist()
        old_logp += data["logp"].tolist()
        adv += np.broadcast_to(np.asarray(a, dtype=np.float32), (n,)).tolist()

    logits = policy.logits(torch.tensor(prompts), torch.tensor(positions))
    logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
    ratio = torch.exp(logp - torch.tensor(old_logp))
    adv_t = torch.tensor(adv, dtype=torch.float32)
    loss = -torch.min(ratio * adv_t, torch.clamp(ratio, 0.8, 1.2) * adv_t).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def decode(policy, prompt: int, length: int, n: int, greedy: bool, rng: np.random.Generator,
           refresh=None, token_s: float = 0.0):
    """``n`` completions of ``length`` tokens decoded as one batch: tokens and behaviour log-probs.

    ``refresh()`` is called every 8 tokens and returns the (possibly updated) policy: an in-flight
    weight update, the rollout continues under the new version. Each step costs at least ``token_s``.
    """
    import torch

    tokens = np.zeros((n, length), dtype=np.int64)
    logps = np.zeros((n, length), dtype=np.float32)
    for t in range(length):
        t0 = time.perf_counter()
        if refresh is not None and t % 8 == 0 and t:
            policy = refresh()
        with torch.no_grad():
            p = torch.softmax(policy.logits(torch.full((n,), prompt), torch.full((n,), t)), -1).numpy()
        if greedy:
            tok = p.argmax(1)
        else:
            tok = (p.cumsum(1) > rng.random((n, 1))).argmax(1)
        tokens[:, t] = tok
        logps[:, t] = np.log(p[np.arange(n), tok] + 1e-12)
        time.sleep(max(0.0, token_s - (time.perf_counter() - t0)))
    return tokens, logps


def main() -> None:
    """Run each mode, then print the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="drop,pace")
    ap.add_argument("--steps", type=int, default=120, help="trainer steps (= policy versions) per mode")
    ap.add_argument("--batch", type=int, default=4, help="groups per step")
    ap.add_argument("--group", type=int, default=4, help="completions per prompt")
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--token-ms", type=float, default=4.0, help="decode cost per token (ms)")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="a few steps of both modes, to check that it runs")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.producers, args.token_ms = 4, 2, 0.5

    import ray
    import torch

    from replaystore import ray as rsr
    from replaystore.online import RolloutBufferConfig, VersionRange

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    lengths = prompt_lengths(args.prompts, args.seed)
    short = lengths < 20

    Weights = ray.remote(num_cpus=0)(WeightStore)

    @ray.remote(num_cpus=0)
    class Producer:
        def __init__(self, oc, weights, pace: bool, idx: int) -> None:
            self.oc, self.weights, self.pace, self.idx = oc, weights, pace, idx
            self.policy = make_policy(args.prompts)
            self.version = -1
            self.rng = np.random.default_rng(args.seed * 1000 + idx)
            self.stop = False

        def _refresh(self):
            v, state = ray.get(self.weights.get.remote(self.version))
            if state is not None:
                self.policy.load_state_dict({k: torch.as_tensor(a) for k, a in state.items()})
                self.version = v
            return self.policy

        def run(self) -> int:
            n = 0
            gid_base = self.idx * 10**9
            while True:
                if self.pace:
                    try:
                        [gid] = self.oc.acquire(1, timeout=1.0, holder=f"p{self.idx}")
                    except Exception as e:  # noqa: BLE001 - Timeout: retry; Closed: the run is over
                        if type(e).__name__ == "Timeout":
                            continue
                        return n
                else:
                    gid, gid_base = gid_base, gid_base + 1
                prompt = int(self.rng.integers(args.prompts))
                self._refresh()
                rng = VersionRange.start(self.version)
                tokens, logps = decode(self.policy, prompt, int(lengths[prompt]), args.group, False, self.rng,
                                       refresh=self._refresh, token_s=args.token_ms / 1000)
                rng = rng.observe(self.version)
                for tok, lp in zip(tokens, logps):
                    item = {"prompt": prompt, "tokens": tok, "logp": lp, "reward": reward(prompt, tok)}
                    try:
                        self.oc.add(item, group=gid, versions=rng, length=len(tok), group_size=args.group)
                    except Exception:  # noqa: BLE001 - Closed at the end of the run
                        return n
                    n += 1

    def train_step(policy, opt, batch) -> float:
        rollouts = []
        for g in batch.groups:
            # per-token rewards (a token is right or wrong), baseline: the group's mean at that position
            right = np.stack([m.data["tokens"] == (m.data["prompt"] + np.arange(len(m.data["tokens"]))) % VOCAB
                              for m in g.members]).astype(np.float32)
            a = (right - right.mean(0)) / (right.std(0) + 0.1)
            rollouts += [(m.data, am) for m, am in zip(g.members, a)]
        return clipped_pg_step(policy, opt, rollouts)

    def evaluate(policy) -> tuple[float, float]:
        rng = np.random.default_rng(0)
        r = np.array([reward(p, decode(policy, p, int(lengths[p]), 1, True, rng)[0][0]) for p in range(args.prompts)])
        return float(r[short].mean()), float(r[~short].mean())

    results = {}
    for mode in args.modes.split(","):
        pace = mode == "pace"
        cfg = RolloutBufferConfig(capacity=4096, batch_size=args.batch, max_staleness=args.max_staleness,
                                  pacing=pace, drop_stale=True, group_size=args.group, pick="fifo",
                                  ticket_ttl=30.0, length_buckets=(20,))
        svc = rsr.serve(name=f"pg-{mode}", online={"rollouts": cfg}, sinks=lambda: [])
        oc = svc.online("rollouts")
        torch.manual_seed(args.seed)
        policy = make_policy(args.prompts)
        opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
        weights = Weights.remote()
        ray.get(weights.set.remote(0, {k: v.detach().numpy() for k, v in policy.state_dict().items()}))
        producers = [Producer.remote(oc, weights, pace, i) for i in range(args.producers)]
        runs = [p.run.remote() for p in producers]
        curve = [(0, *evaluate(policy))]
        t0 = last = time.perf_counter()
        trained = 0
        for step in range(1, args.steps + 1):
            batch = oc.sample(args.batch, timeout=120)
            trained += len(batch.rollouts)
            assert (batch.staleness() <= args.max_staleness).all()
            train_step(policy, opt, batch)
            ray.get(weights.set.remote(step, {k: v.detach().numpy() for k, v in policy.state_dict().items()}))
            oc.set_version(step)
            if step % 20 == 0 or step == args.steps or time.perf_counter() - last > 20:
                last = time.perf_counter()
                curve.append((step, *evaluate(policy)))
                print(f"[{mode}] step {step:4d}  greedy reward short {curve[-1][1]:.3f} long {curve[-1][2]:.3f}",
                      flush=True)
        wall = time.perf_counter() - t0
        s = oc.stats()
        svc.close()
        generated = ray.get(runs, timeout=60)
        for p in producers:
            ray.kill(p)
        svc.shutdown()
        results[mode] = (s, wall, trained, sum(generated), curve)

    print()
    print(f"steps {args.steps}, batch {args.batch} groups x {args.group}, max_staleness {args.max_staleness}, "
          f"{args.producers} producers, {args.token_ms} ms/token, pick fifo")
    hdr = ("mode", "generated", "trained", "dropped", "dropped short", "dropped long", "trained long share",
           "generated long share", "generated/s", "trained/s", "wall s")
    print(" | ".join(hdr))
    for mode, (s, wall, trained, gen, _) in results.items():
        g, t, d = s["generated_by_length"], s["trained_by_length"], s["dropped_by_length"]
        glong, tlong = g.get(">=20", 0), t.get(">=20", 0)
        print(" | ".join(str(x) for x in (
            mode, s["rollouts_added"], s["rollouts_sampled"], s["rollouts_dropped"], d.get("0-19", 0),
            d.get(">=20", 0), f"{tlong / max(1, sum(t.values())):.2f}", f"{glong / max(1, sum(g.values())):.2f}",
            f"{gen / wall:.1f}", f"{trained / wall:.1f}", f"{wall:.1f}")))
    print()
    print("trained staleness histograms:", {m: r[0]["trained_staleness"] for m, r in results.items()})
    for mode, r in results.items():
        if "budget" in r[0]:
            b = r[0]["budget"]
            print(f"[{mode}] producers waited {b['producer_wait_s']:.1f} s in total for admission "
                  f"({b['acquired']} tickets)")
    print("learning curves (step, greedy reward short, long):")
    for mode, r in results.items():
        print(f"  {mode}: " + ", ".join(f"({st}, {a:.2f}, {b:.2f})" for st, a, b in r[4]))
    ray.shutdown()


if __name__ == "__main__":
    main()
