"""Run a learning example over several seeds and report the median and range of its result.

Each seed runs as its own process under ``nice`` (one after another, so the CPU time of each is
its own: ``resource.getrusage(RUSAGE_CHILDREN)`` before and after). The result is read from the
process's output with a regular expression whose first group is a number; a run that does not
print it counts as failed. The load average at the start and the end is printed with the table, so
a reader can tell a quiet run from a loaded one.

Examples (from the repository root)::

    python bench/learning_seeds.py --name demo --regex "final average return[^0-9]*([0-9.]+)" \
        --bar 475 -- replaystore demo --no-progress --out /tmp/demo-{seed}.png --seed {seed}
    python bench/learning_seeds.py --name r2d2 --regex "final greedy return[^0-9]*([0-9.]+)" \
        --bar 400 -- python examples/r2d2_cartpole_pomdp.py --seed {seed}

``{seed}`` in the command is replaced by each seed. ``--json PATH`` also writes every run's
figures, output tail included.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time


def run_seed(command: list[str], seed: int, regex: re.Pattern, nice: int, timeout: float) -> dict:
    """Run ``command`` for one seed; returns its result, CPU and wall seconds and output tail."""
    argv = [part.replace("{seed}", str(seed)) for part in command]
    if nice:
        argv = ["nice", "-n", str(nice), *argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        out, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, code = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), -1
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = regex.findall(out)
    value = float(found[-1]) if found else None
    return {"seed": seed, "result": value, "exit": code, "cpu_s": round(cpu, 1), "wall_s": round(wall, 1),
            "tail": out[-1500:]}


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run every seed, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True, help="a label for the table")
    ap.add_argument("--regex", required=True, help="regular expression whose first group is the result")
    ap.add_argument("--bar", type=float, default=None, help="count the seeds whose result reaches this")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per seed")
    ap.add_argument("--json", default=None)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command, with {seed}")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given (put it after --)")
    regex = re.compile(args.regex)
    load0 = os.getloadavg()[0]
    runs = []
    for seed in args.seeds:
        r = run_seed(command, seed, regex, args.nice, args.timeout)
        runs.append(r)
        print(f"{args.name} seed {seed}: result {r['result']}, exit {r['exit']}, CPU {r['cpu_s']} s, "
              f"wall {r['wall_s']} s", flush=True)
    load1 = os.getloadavg()[0]
    values = [r["result"] for r in runs if r["result"] is not None]
    print(f"\n| {args.name} | median | range | reached {args.bar} | CPU s (median) | wall s (median) |")
    print("| --- | --- | --- | --- | --- | --- |")
    med = statistics.median(values) if values else float("nan")
    rng = f"{min(values):.1f}-{max(values):.1f}" if values else "-"
    reached = sum(v >= args.bar for v in values) if args.bar is not None else "-"
    print(f"| {len(runs)} seeds | {med:.1f} | {rng} | {reached}/{len(runs)} | "
          f"{statistics.median(r['cpu_s'] for r in runs):.0f} | {statistics.median(r['wall_s'] for r in runs):.0f} |")
    print(f"\nload average (1 min): {load0:.1f} at the start, {load1:.1f} at the end; command: {' '.join(command)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"name": args.name, "command": command, "load": [load0, load1], "runs": runs}, f, indent=1)
    return 0 if len(values) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
