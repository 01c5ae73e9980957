"""Benchmark replaystore against its peers and print one Markdown table per workload.

Usage::

    bench/.venv/bin/python bench/run.py [WORKLOAD ...] [--repeats 3] [--seconds 1.0]
                                        [--quick] [--peers a,b] [--json out.json]

Workloads: uniform_add_one, uniform_add_batch, uniform_sample, per_256, per_4096,
rows_1, rows_8, rows_64, rows_256, rows_1000 (one vectorised-env step of that many rows per call,
uniform), per_rows_1 ... per_rows_1000 (the same into a prioritized buffer). Aliases: ``per``
(per_256, per_4096), ``uniform``, ``rows`` (all rows_* and per_rows_*), ``per_rows``; no name
means all. Every table also shows the memory each filled buffer holds, measured in a fresh
subprocess per (peer, capacity, prioritized) (``--no-memory`` skips it). Set up the environment
first with ``bash bench/setup_env.sh``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:  # replaystore installed (pip install -e .) or, failing that, straight from src/
    import replaystore  # noqa: F401
except Exception:  # not installed (or broken mid-edit: the peer check then says why)
    sys.path.insert(1, str(HERE.parent / "src"))

import numpy as np  # noqa: E402
from peers import (  # noqa: E402
    ALL_PEERS,
    PAYLOAD_BYTES,
    MemoryCache,
    MemoryResult,
    Peer,
    PeerResult,
    Workload,
    WorkloadParams,
    WorkloadResult,
    run_workload,
    wait_for_idle_others,
    wait_for_quiet,
)

CAP_UNIFORM = 1_000_000
CAP_PER = 2**20
#: Rows per call of the small-batch workloads: one step of a vectorised env with that many envs.
ROWS_PER_CALL = (1, 8, 64, 256, 1000)

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "uniform_add_one",
            "add_one",
            WorkloadParams(capacity=CAP_UNIFORM, batch_size=1, prefill=CAP_UNIFORM),
            "add one transition per call; capacity 1M, pre-filled (adds overwrite the oldest)",
        ),
        Workload(
            "uniform_add_batch",
            "add_batch",
            WorkloadParams(capacity=CAP_UNIFORM, batch_size=1000, prefill=CAP_UNIFORM),
            "add 1000 transitions per call; capacity 1M, pre-filled (adds overwrite the oldest)",
        ),
        Workload(
            "uniform_sample",
            "sample",
            WorkloadParams(capacity=CAP_UNIFORM, batch_size=256, prefill=CAP_UNIFORM),
            "sample 256 uniformly (data gathered); 1M items stored",
            ops_per_chunk=20,
        ),
        Workload(
            "per_256",
            "per",
            WorkloadParams(capacity=CAP_PER, batch_size=256, prioritized=True, prefill=CAP_PER),
            "PER iteration at batch 256: sample with IS weights + data, update priorities; "
            "2**20 items, alpha 0.6, beta 0.4",
            ops_per_chunk=10,
        ),
        Workload(
            "per_4096",
            "per",
            WorkloadParams(capacity=CAP_PER, batch_size=4096, prioritized=True, prefill=CAP_PER),
            "PER iteration at batch 4096: sample with IS weights + data, update priorities; "
            "2**20 items, alpha 0.6, beta 0.4",
            ops_per_chunk=1,
        ),
    )
}
for _n in ROWS_PER_CALL:
    WORKLOADS[f"rows_{_n}"] = Workload(
        f"rows_{_n}",
        "add_rows",
        WorkloadParams(capacity=CAP_UNIFORM, batch_size=_n, prefill=CAP_UNIFORM, n_envs=_n),
        f"add {_n} row{'s' if _n > 1 else ''} per call (one step of {_n} env{'s' if _n > 1 else ''}), "
        "uniform; capacity 1M, pre-filled (adds overwrite the oldest)",
    )
for _n in ROWS_PER_CALL:
    WORKLOADS[f"per_rows_{_n}"] = Workload(
        f"per_rows_{_n}",
        "per_add_rows",
        WorkloadParams(capacity=CAP_PER, batch_size=_n, prioritized=True, prefill=CAP_PER, n_envs=_n),
        f"add {_n} row{'s' if _n > 1 else ''} per call (one step of {_n} env{'s' if _n > 1 else ''}) "
        "into a prioritized buffer, each library's default priority for new rows; capacity 2**20, "
        "pre-filled with random priorities, alpha 0.6",
    )
ALIASES = {
    "per": ["per_256", "per_4096"],
    "uniform": [k for k in WORKLOADS if "uniform" in k],
    "rows": [f"rows_{n}" for n in ROWS_PER_CALL] + [f"per_rows_{n}" for n in ROWS_PER_CALL],
    "per_rows": [f"per_rows_{n}" for n in ROWS_PER_CALL],
}
#: The "NumPy limit" each workload's peers are compared against.
REFERENCE = {
    "add_one": "numpy",
    "add_batch": "numpy",
    "sample": "numpy",
    "per": "numpy-sumtree",
    "add_rows": "numpy",
    "per_add_rows": "numpy-sumtree",
}
#: Workloads whose tables also compare every peer to Stable-Baselines3's rate.
VS_SB3 = {"add_rows", "per_add_rows"}
SUBJECT = "replaystore"
PEER_NAMES = [p.name for p in ALL_PEERS]


def _fmt_rate(x: float) -> str:
    if not math.isfinite(x):
        return "-"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _fmt_us(ops_per_s: float) -> str:
    if not math.isfinite(ops_per_s) or ops_per_s <= 0:
        return "-"
    us = 1e6 / ops_per_s
    return f"{us:.3g}" if us < 1000 else f"{us:,.0f}"


def _fmt_ratio(x: float) -> str:
    return f"{x:.2f}x" if math.isfinite(x) else "-"


def markdown_table(wr: WorkloadResult) -> str:
    """The Markdown report of one workload: rates, spreads and the two ratio columns."""
    w = wr.workload
    ref_name = REFERENCE[w.op]
    ref = wr.get(ref_name)
    subj = wr.get(SUBJECT)
    ref_rate = ref.median_ops if ref and ref.status == "ok" else float("nan")
    subj_rate = subj.median_ops if subj and subj.status == "ok" else float("nan")

    sb3 = wr.get("sb3")
    sb3_rate = sb3.median_ops if w.op in VS_SB3 and sb3 and sb3.status == "ok" else float("nan")
    vs_sb3 = w.op in VS_SB3
    if w.op in ("add_one", "add_batch"):
        head = ["transitions/s", "µs/call"]
    elif w.op in ("add_rows", "per_add_rows"):
        head = ["µs/call", "rows/s"]
    elif w.op == "sample":
        head = ["µs/call", "samples/s"]
    else:
        head = ["iterations/s", "µs/iteration"]
    head.append("CPU µs/iteration" if w.op == "per" else "CPU µs/call")
    mem_head = ["MB", "B/item", "x payload"]
    lines = [
        f"### {w.name}",
        "",
        f"{w.description}. Median of {wr.repeats} interleaved runs of {wr.seconds:g}s each; "
        f"Other processes kept {wr.other_cpu:.2f} CPUs busy meanwhile; "
        f"1-min load {wr.load_before:.2f} before, {wr.load_after:.2f} after (includes this run).",
        "",
        "| implementation | version | "
        + " | ".join(head)
        + f" | min-max of runs | {SUBJECT} / this | this / {ref_name} | "
        + ("this / sb3 | " if vs_sb3 else "")
        + " | ".join(mem_head)
        + " | notes |",
        "|---|---|" + "---:|" * (len(head) + 3 + int(vs_sb3) + len(mem_head)) + "---|",
    ]
    for r in wr.results:
        if r.status != "ok":
            what = r.status if not r.reason else f"{r.status}: {r.reason}"
            if r.status == "unsupported" and not r.reason:
                continue  # e.g. SB3 has no PER: leave it out rather than clutter
            n_dash = len(head) + 3 + int(vs_sb3) + len(mem_head)
            lines.append(f"| {r.peer} | {r.version} | " + " | ".join("-" for _ in range(n_dash)) + f" | {what} |")
            continue
        ops = r.median_ops
        items = ops * w.items_per_op
        if w.op in ("add_one", "add_batch"):
            cells = [_fmt_rate(items), _fmt_us(ops)]
            lo, hi = min(r.ops_per_s) * w.items_per_op, max(r.ops_per_s) * w.items_per_op
            spread = f"{_fmt_rate(lo)}-{_fmt_rate(hi)}"
        elif w.op in ("add_rows", "per_add_rows", "sample"):
            cells = [_fmt_us(ops), _fmt_rate(items)]
            spread = f"{_fmt_us(max(r.ops_per_s))}-{_fmt_us(min(r.ops_per_s))} µs"
        else:
            cells = [_fmt_rate(ops), _fmt_us(ops)]
            spread = f"{_fmt_rate(min(r.ops_per_s))}-{_fmt_rate(max(r.ops_per_s))}"
        cells.append(_fmt_us(r.median_cpu_ops))
        vs_subject = "" if r.peer == SUBJECT else _fmt_ratio(subj_rate / ops)
        vs_ref = _fmt_ratio(ops / ref_rate)
        extra = [_fmt_ratio(ops / sb3_rate)] if vs_sb3 else []
        lines.append(
            f"| {r.peer} | {r.version} | " + " | ".join(cells) + f" | {spread} | {vs_subject} | {vs_ref} | "
            + " | ".join(extra + _mem_cells(r)) + f" | {r.note} |"
        )
    lines.append("")
    lines.append(
        f"`{SUBJECT} / this` > 1: replaystore is faster than that peer; "
        f"`this / {ref_name}` is the share of the plain-NumPy rate each reaches"
        + ("; `this / sb3` > 1: faster than Stable-Baselines3" if vs_sb3 else "")
        + ". Memory: resident bytes of the buffer once filled with "
        f"{w.params.prefill:,} items (RSS after build + fill minus RSS after imports, in a fresh process), "
        f"per item, and as a multiple of the {PAYLOAD_BYTES} B payload of one transition."
    )
    return "\n".join(lines)


def _mem_cells(r: Any) -> list[str]:
    """MB, bytes per item and multiple of the payload for one peer's result ("-" if unknown)."""
    m = r.memory
    if m is None or not m.ok:
        return ["-", "-", "-"]
    per = m.bytes_per_item
    return [f"{m.rss_bytes / 1e6:.0f}", f"{per:.0f}", f"{per / PAYLOAD_BYTES:.2f}x"]


def _rate(wr: WorkloadResult, peer: str, cpu: bool = False) -> float:
    r = wr.get(peer)
    if r is None or r.status != "ok" or not r.ops_per_s:
        return float("nan")
    return r.median_cpu_ops if cpu else r.median_ops


def rows_summary(results: list[WorkloadResult]) -> str:
    """One table per small-batch family: µs per call of every peer at each rows-per-call size,
    and replaystore's speed relative to SB3, rlox and the NumPy reference ("" if none ran).

    Uses this process's CPU time per call (steadier on a shared machine) when the results
    carry it, else wall time; the heading says which.
    """
    out: list[str] = []
    cpu = all(r.cpu_ops_per_s for wr in results for r in wr.results if r.status == "ok" and r.ops_per_s)
    clock = "CPU" if cpu else "wall"
    for op, title in (("add_rows", "uniform"), ("per_add_rows", "prioritized")):
        wrs = sorted((wr for wr in results if wr.workload.op == op), key=lambda wr: wr.workload.params.batch_size)
        if not wrs:
            continue
        ref = REFERENCE[op]
        names = [p for p in PEER_NAMES if any(math.isfinite(_rate(wr, p, cpu)) for wr in wrs)]
        head = [f"{n} µs" for n in names] + [f"{SUBJECT} / sb3", f"{SUBJECT} / rlox", f"{SUBJECT} / {ref}"]
        out += [
            f"### Small batches, {title}: {clock} µs per call and {SUBJECT}'s speed relative to each",
            "",
            "| rows/call | " + " | ".join(head) + " |",
            "|---:|" + "---:|" * len(head),
        ]
        for wr in wrs:
            subj = _rate(wr, SUBJECT, cpu)
            cells = [_fmt_us(_rate(wr, n, cpu)) for n in names]
            cells += [_fmt_ratio(subj / _rate(wr, other, cpu)) for other in ("sb3", "rlox", ref)]
            out.append(f"| {wr.workload.params.batch_size} | " + " | ".join(cells) + " |")
        out += ["", f"Ratios > 1: {SUBJECT} is faster."
                + (" sb3 is its uniform buffer (SB3 has no PER)." if op == "per_add_rows" else ""), "", ""]
    return "\n".join(out)


#: Peers that are references, not libraries (left out of "the fastest peer").
NOT_PEERS = {SUBJECT, "replaystore-numpy", "numpy", "numpy-sumtree"}


def core_summary(results: list[WorkloadResult]) -> str:
    """The other workloads side by side: µs per call of every peer, and replaystore's speed
    relative to rlox, the fastest library peer and the NumPy reference ("" if none ran)."""
    wrs = [wr for wr in results if wr.workload.op not in ("add_rows", "per_add_rows")]
    if not wrs:
        return ""
    cpu = all(r.cpu_ops_per_s for wr in wrs for r in wr.results if r.status == "ok" and r.ops_per_s)
    names = [p for p in PEER_NAMES if any(math.isfinite(_rate(wr, p, cpu)) for wr in wrs)]
    head = [f"{n} µs" for n in names] + [f"{SUBJECT} / rlox", f"{SUBJECT} / fastest peer", f"{SUBJECT} / NumPy ref"]
    lines = [
        f"### Single adds, batch adds, samples, PER: {'CPU' if cpu else 'wall'} µs per call (PER: per iteration)",
        "",
        "| workload | " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(head),
    ]
    for wr in wrs:
        subj = _rate(wr, SUBJECT, cpu)
        peers = {n: _rate(wr, n, cpu) for n in names if n not in NOT_PEERS}
        peers = {n: v for n, v in peers.items() if math.isfinite(v)}
        best = max(peers, key=peers.__getitem__) if peers else None
        cells = [_fmt_us(_rate(wr, n, cpu)) for n in names]
        cells += [
            _fmt_ratio(subj / _rate(wr, "rlox", cpu)),
            f"{_fmt_ratio(subj / peers[best])} ({best})" if best else "-",
            _fmt_ratio(subj / _rate(wr, REFERENCE[wr.workload.op], cpu)),
        ]
        lines.append(f"| {wr.workload.name} | " + " | ".join(cells) + " |")
    lines += ["", f"Ratios > 1: {SUBJECT} is faster. The NumPy reference is `numpy` (uniform) or "
              "`numpy-sumtree` (PER).", "", ""]
    return "\n".join(lines)


def memory_summary(results: list[WorkloadResult]) -> str:
    """Per peer: resident memory of the filled uniform (1M) and prioritized (2**20) buffers."""
    seen: dict[tuple[str, bool], Any] = {}
    caps: dict[bool, int] = {}
    for wr in results:
        for r in wr.results:
            if r.memory is not None and r.memory.ok:
                seen.setdefault((r.peer, wr.workload.params.prioritized), r.memory)
                caps[wr.workload.params.prioritized] = wr.workload.params.capacity
    if not seen:
        return ""
    kinds = [k for k in (False, True) if k in caps]
    head = []
    for k in kinds:
        what = "prioritized" if k else "uniform"
        head += [f"{what} {caps[k]:,}: MB", "B/item", "x payload", "bookkeeping"]
    lines = [
        f"### Memory of the filled buffers (payload {PAYLOAD_BYTES} B per transition)",
        "",
        "| implementation | " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(head),
    ]
    for name in PEER_NAMES:
        if not any((name, k) in seen for k in kinds):
            continue
        cells: list[str] = []
        for k in kinds:
            m = seen.get((name, k))
            if m is None:
                cells += ["-"] * 4
                continue
            per = m.bytes_per_item
            cells += [f"{m.rss_bytes / 1e6:.0f}", f"{per:.0f}", f"{per / PAYLOAD_BYTES:.2f}x",
                      f"{(per - PAYLOAD_BYTES) / PAYLOAD_BYTES:+.0%}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "bookkeeping: bytes per item beyond the payload, as a share of the payload "
              "(sb3 under prioritized: its uniform buffer at that capacity).", ""]
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    """Versions and machine facts recorded beside the results."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "loadavg": open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else None,
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return env


def to_json(results: list[WorkloadResult], args: argparse.Namespace) -> dict[str, Any]:
    """Plain-data form of all results (for --json)."""
    return {
        "environment": environment(),
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "workloads": [
            {
                "name": wr.workload.name,
                "op": wr.workload.op,
                "description": wr.workload.description,
                "params": asdict(wr.workload.params),
                "items_per_op": wr.workload.items_per_op,
                "repeats": wr.repeats,
                "seconds": wr.seconds,
                "load_before": wr.load_before,
                "load_after": wr.load_after,
                "other_cpu": wr.other_cpu,
                "results": [
                    {
                        "peer": r.peer,
                        "status": r.status,
                        "version": r.version,
                        "reason": r.reason,
                        "note": r.note,
                        "setup_s": r.setup_s,
                        "ops_per_s": r.ops_per_s,
                        "cpu_ops_per_s": r.cpu_ops_per_s,
                        "median_ops_per_s": r.median_ops if r.ops_per_s else None,
                        "median_items_per_s": (r.median_ops * wr.workload.items_per_op if r.ops_per_s else None),
                        "memory": (
                            None if r.memory is None
                            else {"rss_bytes": r.memory.rss_bytes, "items": r.memory.items,
                                  "bytes_per_item": r.memory.bytes_per_item if r.memory.ok else None,
                                  "reason": r.memory.reason}
                        ),
                    }
                    for r in wr.results
                ],
            }
            for wr in results
        ],
    }


def from_json(doc: dict[str, Any]) -> list[WorkloadResult]:
    """The results :func:`to_json` wrote, rebuilt (workloads looked up by name in ``WORKLOADS``)."""
    out: list[WorkloadResult] = []
    for w in doc["workloads"]:
        results = []
        for r in w["results"]:
            m = r.get("memory")
            results.append(PeerResult(
                peer=r["peer"], status=r["status"], version=r["version"], reason=r["reason"], note=r["note"],
                ops_per_s=list(r["ops_per_s"]), cpu_ops_per_s=list(r.get("cpu_ops_per_s", [])),
                setup_s=r["setup_s"],
                memory=None if m is None else MemoryResult(rss_bytes=m["rss_bytes"], items=m["items"],
                                                          reason=m["reason"]),
            ))
        out.append(WorkloadResult(
            workload=WORKLOADS[w["name"]], results=results, repeats=w["repeats"], seconds=w["seconds"],
            load_before=w["load_before"], load_after=w["load_after"], other_cpu=w["other_cpu"],
        ))
    return out


def report(results: list[WorkloadResult], header: str) -> str:
    """The whole Markdown report: header, one table per workload, then the summaries."""
    parts = [header]
    parts += [markdown_table(wr) + "\n" for wr in results]
    summary = core_summary(results) + rows_summary(results) + memory_summary(results)
    if summary:
        parts += ["## Summary\n", summary]
    return "\n".join(parts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("workloads", nargs="*", help=f"subset of {list(WORKLOADS)} (or 'per', 'uniform')")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved timing rounds (default 3)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per peer per round (1.0; 0.25 with --quick)")
    ap.add_argument("--quick", action="store_true", help="short rounds (0.25s) and a short quiet-wait")
    ap.add_argument("--peers", default="", help="comma-separated subset of " + ",".join(PEER_NAMES))
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        help="max seconds to wait for a quiet machine, at the start (1-min load < --quiet-load) "
        "and before each workload (other processes < 0.3 CPUs); 60, or 5 with --quick",
    )
    ap.add_argument("--quiet-load", type=float, default=1.0, help="1-min load counted as quiet (1.0)")
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads for the torch-based peers (1, like the others; 0 = torch default)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write all results as JSON")
    ap.add_argument("--render", metavar="PATH", help="print the tables of a --json file; run nothing")
    ap.add_argument(
        "--no-memory",
        action="store_true",
        help="skip the memory columns (each (peer, capacity, prioritized) otherwise costs one "
        "subprocess that builds and fills the buffer, a few seconds each)",
    )
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    names: list[str] = []
    for w in args.workloads or list(WORKLOADS):
        for n in ALIASES.get(w, [w]):
            if n not in WORKLOADS:
                ap.error(f"unknown workload {n!r}; choose from {list(WORKLOADS)} or {list(ALIASES)}")
            if n not in names:
                names.append(n)
    args.workloads = names
    if args.seconds is None:
        args.seconds = 0.25 if args.quick else 1.0
    if args.quiet_wait is None:
        args.quiet_wait = 5.0 if args.quick else 60.0
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the chosen workloads and print their tables."""
    args = parse_args(argv)
    if args.render:
        doc = json.loads(Path(args.render).read_text())
        env = doc["environment"]
        print(report(from_json(doc), f"## replaystore benchmark (from {args.render})\n\nPython {env['python']}, "
                     f"NumPy {env['numpy']}, torch {env.get('torch', '-')}, {env['cpus']} CPUs; "
                     f"1-min load at the end {', '.join(env.get('loadavg') or ['-'])} (1/5/15 min).\n"))
        return 0
    peers: list[Peer] = list(ALL_PEERS)
    if args.peers:
        wanted = {s.strip() for s in args.peers.split(",") if s.strip()}
        unknown = wanted - {p.name for p in peers}
        if unknown:
            print(f"unknown peers: {sorted(unknown)}", file=sys.stderr)
            return 2
        peers = [p for p in peers if p.name in wanted]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.torch_threads > 0:
        try:
            import torch

            torch.set_num_threads(args.torch_threads)
        except ImportError:
            pass

    for p in peers:
        reason = p.check()
        log(f"{p.name:14s} {'ok ' + p.version() if reason is None else reason}")
    load, waited = wait_for_quiet(args.quiet_wait, args.quiet_load, log=log)
    log(f"1-min load {load:.2f} (waited {waited:.0f}s); env: {environment()}")

    t_start = time.perf_counter()
    memory = None if args.no_memory else MemoryCache(log=log)
    results: list[WorkloadResult] = []
    for name in args.workloads:
        log(f"== {name}")
        if name != args.workloads[0]:
            wait_for_idle_others(args.quiet_wait, log=log)
        results.append(run_workload(WORKLOADS[name], peers, args.repeats, args.seconds, log=log, memory=memory))

    env = environment()
    print(report(results, (
        f"## replaystore benchmark\n\nPython {env['python']}, NumPy {env['numpy']}, "
        f"torch {env.get('torch', '-')} ({env.get('torch_threads', '-')} threads), "
        f"{env['cpus']} CPUs; 1-min load at start {load:.2f}; total {time.perf_counter() - t_start:.0f}s.\n"
    )))
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(results, args), indent=2))
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
