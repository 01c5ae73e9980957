"""GRPO on Ray with DAPO's dynamic sampling and over-provisioning (replaystore.online).

The toy token-generation task of ``examples/async_pg_pacing.py`` (prompt ``p`` asks for ``L_p``
tokens ``(p + t) % 8``; reward: the fraction right), with long-tailed lengths: three quarters of
the prompts are short (2-8 tokens), a quarter long (24-56). Producer actors take tickets from the
version budget (``max_staleness=1``, pick ``fifo``) and decode all their groups as one batch at a
fixed cost per decode step (``--token-ms``, a stand-in for an LLM's batched decode), pulling new
weights every 8 tokens (a rollout keeps its version range). A group (``--group`` completions of
one prompt) is written with one ``add_group`` call. The trainer samples ``--batch`` whole groups
per step and takes one clipped GRPO step (advantage: the completion's reward against its group's).

Three modes, same everything else:

- ``base``: every group is trained on, also those whose rewards are all equal (zero advantage:
  no gradient, wasted compute);
- ``dapo``: DAPO's dynamic sampling: a producer scores each finished group and ``reject``s it when
  every reward is equal; the budget comes back and the producer starts another;
- ``dapo+over``: the same plus over-provisioning: a producer asks for ``k`` groups and gets
  ``k + 1`` tickets (``acquire(k, overprovision=1)``); once ``k`` are written, the buffer cancels
  the last one (usually the longest) and the producer stops decoding it.

It prints, per mode: rollouts generated (completed), trained, rejected, cancelled; tokens decoded
and wasted; the long share of generated vs trained rollouts (the length bias of cancelling);
throughput; the learning curve (greedy reward on short and long prompts).

    nice python examples/grpo_dapo_overprovision.py               # three modes, a few minutes on 2 cores
    python examples/grpo_dapo_overprovision.py --smoke            # seconds: a check that it runs

Needs ``replaystore[ray,lmdb,torch]``. Ends with ``ray.shutdown()``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on loopback
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from async_pg_pacing import WeightStore, clipped_pg_step, make_policy, reward  # noqa: E402

LONG = 20  # prompts asking for at least this many tokens are "long"


def long_tailed_lengths(num_prompts: int, seed: int = 0) -> np.ndarray:
    """Three quarters short (2-8 tokens), a quarter long (24-56)."""
    rng = np.random.default_rng(seed)
    n_long = max(1, num_prompts // 4)
    return np.concatenate([rng.integers(2, 9, num_prompts - n_long), rng.integers(24, 57, n_long)])


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (``--smoke``: a run of seconds)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="base,dapo,dapo+over")
    ap.add_argument("--steps", type=int, default=60, help="trainer steps (= policy versions) per mode")
    ap.add_argument("--batch", type=int, default=4, help="groups per step")
    ap.add_argument("--group", type=int, default=4, help="completions per prompt (GRPO group)")
    ap.add_argument("--per-producer", type=int, default=2, help="groups a producer decodes at once (k)")
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--token-ms", type=float, default=4.0, help="cost of one batched decode step (ms)")
    ap.add_argument("--lr", type=float, default=0.03)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="a few steps of everything, in seconds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.producers, args.prompts, args.token_ms, args.eval_every = 4, 2, 8, 0.5, 4
    return args


def run(args: argparse.Namespace) -> dict:
    """Run every mode; return ``{mode: results}``."""
    import async_pg_pacing
    import ray
    import ray.cloudpickle
    import torch

    from replaystore import ray as rsr
    from replaystore.online import RolloutBufferConfig, VersionRange

    t_start = time.perf_counter()
    ray.cloudpickle.register_pickle_by_value(async_pg_pacing)  # workers need not find examples/
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # a new instance
    lengths = long_tailed_lengths(args.prompts, args.seed)
    short = lengths < LONG

    Weights = ray.remote(num_cpus=0)(WeightStore)

    @ray.remote(num_cpus=0)
    class Producer:
        """Decodes groups for one mode at a time (``run``); kept across modes (torch starts once)."""

        def __init__(self, idx: int) -> None:
            self.idx = idx
            self.policy = make_policy(args.prompts)

        def ready(self) -> bool:
            return True

        def run(self, oc, weights, dapo: bool, over: int) -> dict:
            self.oc, self.weights, self.dapo, self.over = oc, weights, dapo, over
            self.version = -1
            self.rng = np.random.default_rng(args.seed * 1000 + self.idx)
            self.stats = {"completed": 0, "completed_long": 0, "rejected": 0, "cancelled": 0, "cancelled_long": 0,
                          "tokens": 0, "tokens_wasted": 0}
            return self._loop()

        def _refresh(self) -> None:
            v, state = ray.get(self.weights.get.remote(self.version))
            if state is not None:
                self.policy.load_state_dict({k: torch.as_tensor(a) for k, a in state.items()})
                self.version = v

        def _loop(self) -> dict:
            from replaystore.errors import Closed, Timeout

            g_n = args.group
            while True:
                try:
                    tickets = self.oc.acquire(args.per_producer, timeout=1.0, holder=f"p{self.idx}",
                                              overprovision=self.over)
                except Timeout:
                    continue
                except Closed:
                    return self.stats
                self._refresh()
                prompt = {t: int(self.rng.integers(args.prompts)) for t in tickets}
                need = {t: int(lengths[prompt[t]]) for t in tickets}
                toks = {t: np.zeros((g_n, need[t]), dtype=np.int64) for t in tickets}
                logp = {t: np.zeros((g_n, need[t]), dtype=np.float32) for t in tickets}
                rng_v = {t: VersionRange.start(self.version) for t in tickets}
                live, written, step = list(tickets), 0, 0
                try:
                    while live:
                        t0 = time.perf_counter()
                        if step and step % 8 == 0:  # in-flight weight update; the rollouts keep their range
                            self._refresh()
                            for t in live:
                                rng_v[t] = rng_v[t].observe(self.version)
                            self.oc.renew(live)
                        ps = torch.tensor(np.repeat([prompt[t] for t in live], g_n))
                        with torch.no_grad():
                            p = torch.softmax(self.policy.logits(ps, torch.full((len(ps),), step)), -1).numpy()
                        tok = (p.cumsum(1) > self.rng.random((len(ps), 1))).argmax(1)
                        lp = np.log(p[np.arange(len(ps)), tok] + 1e-12)
                        for j, t in enumerate(live):
                            toks[t][:, step] = tok[j * g_n:(j + 1) * g_n]
                            logp[t][:, step] = lp[j * g_n:(j + 1) * g_n]
                        self.stats["tokens"] += len(ps)
                        time.sleep(max(0.0, args.token_ms / 1000 - (time.perf_counter() - t0)))
                        step += 1
                        for t in [t for t in live if need[t] == step]:
                            if self.over and written >= args.per_producer:
                                break  # the batch is full: this one was cancelled
                            live.remove(t)
                            written += self._finish(t, prompt[t], toks[t], logp[t], rng_v[t])
                        if self.over and written >= args.per_producer and live:
                            # the batch is full: the buffer cancelled the rest; stop decoding them
                            assert not any(self.oc.held(t) for t in live)
                            for t in live:
                                self.stats["cancelled"] += 1
                                self.stats["cancelled_long"] += int(need[t] >= LONG)
                                self.stats["tokens_wasted"] += step * g_n
                            live = []
                except Closed:
                    return self.stats
                except KeyError:  # UnknownTicket: expired or cancelled while the service was busy
                    continue

        def _finish(self, t, prompt: int, toks, logp, versions) -> int:
            rewards = [reward(prompt, row) for row in toks]
            self.stats["completed"] += 1
            self.stats["completed_long"] += int(toks.shape[1] >= LONG)
            if self.dapo and np.std(rewards) == 0:  # DAPO: no advantage, no gradient: reject, ask for more
                self.oc.reject(t, "zero_variance")
                self.stats["rejected"] += 1
                self.stats["tokens_wasted"] += toks.size
                return 0
            items = [{"prompt": prompt, "tokens": r, "logp": lp, "reward": rw}
                     for r, lp, rw in zip(toks, logp, rewards)]
            return int(self.oc.add_group(t, items, versions=versions, lengths=[toks.shape[1]] * len(items))
                       == "complete")

    def train_step(policy, opt, batch) -> float:
        rollouts = []
        for g in batch.groups:  # GRPO: each completion's reward against its group's
            r = np.array([m.data["reward"] for m in g.members], dtype=np.float32)
            rollouts += [(m.data, a) for m, a in zip(g.members, (r - r.mean()) / (r.std() + 1e-6))]
        return clipped_pg_step(policy, opt, rollouts)

    def evaluate(policy) -> tuple[float, float]:
        r = []
        for p in range(args.prompts):
            with torch.no_grad():
                pos = torch.arange(int(lengths[p]))
                tok = policy.logits(torch.full((len(pos),), p), pos).argmax(-1).numpy()
            r.append(reward(p, tok))
        r = np.array(r)
        return float(r[short].mean()), float(r[~short].mean())

    results = {}
    modes = args.modes.split(",")
    cfg = RolloutBufferConfig(capacity=4096, batch_size=args.batch, max_staleness=1, group_size=args.group,
                              pick="fifo", ticket_ttl=30.0, length_buckets=(LONG,))
    svc = rsr.serve(name=f"grpo-{os.getpid()}", online=dict.fromkeys(modes, cfg), sinks=lambda: [])
    print(f"ray up in {time.perf_counter() - t_start:.1f} s", flush=True)
    producers = [Producer.remote(i) for i in range(args.producers)]
    ray.get([p.ready.remote() for p in producers])  # started (torch imported) before any timing
    print(f"service and producers up at {time.perf_counter() - t_start:.1f} s", flush=True)
    for mode in modes:
        dapo, over = mode.startswith("dapo"), int(mode.endswith("+over"))
        oc = svc.online(mode)
        torch.manual_seed(args.seed)
        policy = make_policy(args.prompts)
        opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
        weights = Weights.remote()
        ray.get(weights.set.remote(0, {k: v.detach().numpy() for k, v in policy.state_dict().items()}))
        runs = [p.run.remote(oc, weights, dapo, over) for p in producers]
        curve = [(0, *evaluate(policy))]
        t0 = time.perf_counter()
        zero_adv = 0
        for step in range(1, args.steps + 1):
            batch = oc.sample(args.batch, timeout=120)
            assert (batch.staleness() <= 1).all()
            zero_adv += sum(int(np.std([m.data["reward"] for m in g.members]) == 0) for g in batch.groups)
            train_step(policy, opt, batch)
            ray.get(weights.set.remote(step, {k: v.detach().numpy() for k, v in policy.state_dict().items()}))
            oc.set_version(step)
            if step % args.eval_every == 0 or step == args.steps:
                curve.append((step, *evaluate(policy)))
        wall = time.perf_counter() - t0
        s = oc.stats()
        oc.close()  # this buffer only: its producers return
        prod = [ray.get(r, timeout=60) for r in runs]
        total = {k: sum(p[k] for p in prod) for k in prod[0]}
        results[mode] = {"stats": s, "wall": wall, "producers": total, "curve": curve, "zero_adv_trained": zero_adv}
    for p in producers:
        ray.kill(p)
    svc.shutdown()
    if started_ray:
        ray.shutdown()
    return results


def report(args: argparse.Namespace, results: dict) -> None:
    """Print the comparison table and the learning curves."""
    print(f"steps {args.steps}, batch {args.batch} groups x {args.group}, k={args.per_producer} per producer, "
          f"{args.producers} producers, {args.token_ms} ms per decode step, max_staleness 1, pick fifo")
    print("| mode | groups completed | trained | rejected (DAPO) | cancelled | zero-advantage trained | "
          "tokens decoded | wasted | long share completed / trained | trained groups/s | steps/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode, r in results.items():
        s, p = r["stats"], r["producers"]
        trained = s["groups_sampled"]
        t_long = s["trained_by_length"].get(f">={LONG}", 0) / max(1, sum(s["trained_by_length"].values()))
        c_long = p["completed_long"] / max(1, p["completed"])
        print(f"| {mode} | {p['completed']} | {trained} | {s['groups_rejected']} | {p['cancelled']} "
              f"({p['cancelled_long']} long) | {r['zero_adv_trained']} | {p['tokens']} | {p['tokens_wasted']} | "
              f"{c_long:.2f} / {t_long:.2f} | {trained / r['wall']:.1f} | {args.steps / r['wall']:.2f} |")
    print("learning curves (step, greedy reward short, long):")
    for mode, r in results.items():
        print(f"  {mode}: " + ", ".join(f"({st}, {a:.2f}, {b:.2f})" for st, a, b in r["curve"]))


def main(argv: list[str] | None = None) -> dict:
    """Run and report; returns the results (for tests)."""
    args = parse(argv)
    results = run(args)
    report(args, results)
    return results


if __name__ == "__main__":
    main()
