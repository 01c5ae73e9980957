"""Regenerate the example figures the docs state, from the current code, and print them labelled.

Each *figure* is one command (an example script, a seed) plus the regular expressions that read
its stated numbers from its output. Every run is its own process under ``nice -n 10`` (one after
another, never in parallel), timed two ways: **wall** seconds (``time.perf_counter``) and **CPU**
seconds of the whole process tree (``getrusage(RUSAGE_CHILDREN)``: the script and every process it
started and reaped: Ray's local processes, workers, actors). Each line says whether the machine was
**quiet** or **loaded**: the 1-minute load average at the start and at the end, against the number
of cores (quiet: at most half of them busy at both ends, i.e. a load of at most ``0.5 * cores``).

Usage (from the repository root)::

    python tools/figures.py --list                      # the figures and their commands
    python tools/figures.py r2d2-seed0 grpo-seed0       # some figures
    python tools/figures.py --smoke                     # every example's --smoke (duration only)
    python tools/figures.py --all --json figures.json   # everything (an hour or more, loaded)

A figure's claim (``claim``) is what the docs say; the script prints the measurement beside it and
never edits the docs: copy what it prints, with its label.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


@dataclass
class Figure:
    """One command and the numbers read from its output (``name: regex`` whose group 1 is the value)."""

    name: str
    argv: list[str]
    claim: str
    read: dict[str, str] = field(default_factory=dict)
    timeout: float = 3600.0


def _grpo_reads() -> dict[str, str]:
    """The counts of ``grpo_dapo_overprovision.py``'s table (``| mode | completed | trained | ...``)."""
    out = {}
    for mode in ("base", "dapo", "dapo+over"):
        m = re.escape(mode)
        out[f"{mode} completed"] = rf"\| {m} \| (\d+) \|"
        out[f"{mode} rejected"] = rf"\| {m} \| \d+ \| \d+ \| (\d+) \|"
        out[f"{mode} cancelled"] = rf"\| {m} \| \d+ \| \d+ \| \d+ \| (\d+) \("
        out[f"{mode} zero-advantage trained"] = rf"\| {m} \| \d+ \| \d+ \| \d+ \| \d+ \(\d+ long\) \| (\d+) \|"
    return out


def _pg_reads() -> dict[str, str]:
    """The counts of ``async_pg_pacing.py``'s table (``mode | generated | trained | dropped | ...``)."""
    out = {}
    for mode in ("drop", "pace"):
        out[f"{mode} generated"] = rf"(?m)^{mode} \| (\d+) \|"
        out[f"{mode} trained"] = rf"(?m)^{mode} \| \d+ \| (\d+) \|"
        out[f"{mode} dropped"] = rf"(?m)^{mode} \| \d+ \| \d+ \| (\d+) \|"
    return out


FIGURES = [
    Figure(
        "r2d2-seed0",
        [PY, "examples/r2d2_cartpole_pomdp.py", "--seed", "0"],
        "docs/sequences.md: seed 0 stops at 10,000 env steps, final greedy return 480.6 (>= 475), 20 CPU s",
        {
            "final greedy return": r"final greedy return over 20 episodes ([0-9.]+)",
            "env steps": r"seed 0: ([0-9,]+) env steps",
        },
    ),
    Figure(
        "grpo-seed0",
        [PY, "examples/grpo_dapo_overprovision.py", "--seed", "0"],
        "docs/online.md: groups completed base 246, dapo 316-383, dapo+over 354-398 (seeds 0-2)",
        _grpo_reads(),
    ),
    Figure(
        "async-pg-seed0",
        [PY, "examples/async_pg_pacing.py", "--seed", "0"],
        "docs/online.md: seed 0 drop generates 2290-2328, trains 1920; pace generates 1935-1942",
        _pg_reads(),
    ),
    Figure(
        "demo-seed0",
        [PY, "-m", "replaystore.cli", "demo", "--no-progress", "--seed", "0", "--out", "/tmp/figures-demo-0.png"],
        "README: greedy return 500.0 (seeds 0-4: 499.2-500.0); 37-80 CPU s",
        {
            "final greedy return": r"final average return over \d+ greedy evaluation episodes: ([0-9.]+)",
            "solved at step": r"solved at step ([0-9,]+)",
            "training CPU s": r"s wall, ([0-9.]+) s CPU",
        },
    ),
]


def smoke_figures() -> list[Figure]:
    """Every example with a ``--smoke`` mode (as tests/test_examples_smoke.py finds them)."""
    found = sorted(
        p
        for p in (ROOT / "examples").glob("*.py")
        if not p.name.startswith("_") and "--smoke" in p.read_text(encoding="utf-8")
    )
    return [
        Figure(f"smoke:{p.stem}", [PY, f"examples/{p.name}", "--smoke"], "README: runs in seconds", timeout=900)
        for p in found
    ]


def _load() -> float:
    return os.getloadavg()[0]


TICK = os.sysconf("SC_CLK_TCK")


def _descendants_cpu(root: int, seen: dict[int, float]) -> None:
    """Note the CPU seconds so far of ``root`` and of every process under it (``seen``: pid -> s).

    Ray's processes (raylet, workers, actors) are descendants of the script while it runs, but are
    not always reaped into its ``RUSAGE_CHILDREN``: sampling ``/proc`` catches them (less their
    last sampling period).
    """
    parent, cpu = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(d)] = int(fields[1])
        cpu[int(d)] = (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    for pid in cpu:
        p, hops = pid, 0
        while p not in (0, 1, root) and hops < 64:
            p, hops = parent.get(p, 0), hops + 1
        if p == root:
            seen[pid] = max(seen.get(pid, 0.0), cpu[pid])


def run(fig: Figure, nice: int = 10, sample_every: float = 0.5) -> dict:
    """Run one figure; returns its numbers, wall and CPU seconds, loads and label.

    CPU: the larger of the reaped children's ``getrusage`` and the sum over the sampled process
    tree (:func:`_descendants_cpu`).
    """
    argv = (["nice", "-n", str(nice)] if nice else []) + fig.argv
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), MPLBACKEND="Agg")
    load0, before, t0 = _load(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    seen: dict[int, float] = {}
    with (
        open(os.devnull, "rb") as stdin,
        subprocess.Popen(
            argv, cwd=ROOT, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        ) as proc,
    ):
        chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)
        reader.start()
        while proc.poll() is None and time.perf_counter() - t0 < fig.timeout:
            _descendants_cpu(proc.pid, seen)
            time.sleep(sample_every)
        timed_out = proc.poll() is None
        if timed_out:
            proc.kill()
        code = -1 if timed_out else proc.wait()
        reader.join(30)
        out = b"".join(chunks).decode(errors="replace")
    wall = time.perf_counter() - t0
    after, load1 = resource.getrusage(resource.RUSAGE_CHILDREN), _load()
    reaped = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cpu = max(reaped, sum(seen.values()))
    values = {}
    for what, regex in fig.read.items():
        found = re.findall(regex, out)
        values[what] = found[-1] if found else None
    quiet = max(load0, load1) <= 0.5 * (os.cpu_count() or 1)
    return {
        "name": fig.name,
        "command": " ".join(fig.argv[1:] if fig.argv[0] == PY else fig.argv),
        "claim": fig.claim,
        "exit": code,
        "values": values,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "load": [round(load0, 1), round(load1, 1)],
        "label": "quiet" if quiet else "loaded",
        "tail": out[-1200:],
    }


def show(r: dict) -> None:
    """Print one result as a block of labelled lines."""
    vals = ", ".join(f"{k} {v}" for k, v in r["values"].items()) or "-"
    print(f"{r['name']}: exit {r['exit']}; {vals}", flush=True)
    print(
        f"    wall {r['wall_s']} s, CPU {r['cpu_s']} s (process tree), {r['label']} "
        f"(load average {r['load'][0]}-{r['load'][1]} on {os.cpu_count()} cores)",
        flush=True,
    )
    print(f"    claim: {r['claim']}", flush=True)
    if r["exit"] != 0:
        print("    output tail: " + r["tail"][-600:].replace("\n", "\n    "), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the figures one after another, print each as it ends."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="figures to run (see --list)")
    ap.add_argument("--list", action="store_true", help="list the figures and their commands")
    ap.add_argument("--smoke", action="store_true", help="every example's --smoke")
    ap.add_argument("--all", action="store_true", help="every figure and every --smoke")
    ap.add_argument("--nice", type=int, default=10)
    ap.add_argument("--json", help="also write the results (output tails included) here")
    args = ap.parse_args(argv)
    every = FIGURES + smoke_figures()
    if args.list:
        for f in every:
            print(f"{f.name:32s} {' '.join(f.argv[1:])}\n{'':32s} claim: {f.claim}")
        return 0
    chosen = [f for f in every if f.name in args.names]
    if args.smoke or args.all:
        chosen += [f for f in every if (args.all or f.name.startswith("smoke:")) and f not in chosen]
    unknown = set(args.names) - {f.name for f in every}
    if unknown or not chosen:
        ap.error(f"unknown figures {sorted(unknown)}; see --list" if unknown else "name a figure, or --smoke/--all")
    results = []
    for fig in chosen:
        results.append(run(fig, args.nice))
        show(results[-1])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
