"""Where a command's CPU time goes, by kind of process: runs the command while sampling every process's CPU time.

    python scripts/cpu_map.py [--every 2] [--out samples.jsonl] -- bash scripts/test.sh -v --durations=0
    python scripts/cpu_map.py --read samples.jsonl          (the table again, from saved samples)

Every `--every` seconds it reads each process's user + system time (psutil, Ray's own dependency); at the end it
prints the CPU-seconds each kind of process used while the command ran (Ray's processes by title: ``ray::MapWorker``,
``ray::IDLE``, the raylet, the log monitor; the test workers; LLM servers), and the longest-lived Ray processes, where
upkeep that costs every second shows. Processes shorter than one interval are missed, and so is the last interval of
each process; a process alive before the command counts only what it used during it. Exits with the command's status.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import time

import psutil

KINDS = ("log_monitor", "dashboard/agent.py", "dashboard/dashboard.py", "runtime_env/agent", "monitor.py", "gcs_server", "raylet",
         "llama_cpp.server", "VLLM::", "cqg_ray.cli", "_job.py", "pip install", "ruff", "chrom")
# pytest and its xdist workers (`python -c ...sys.stdin.readline()...`); not any command naming a /tmp/pytest-of-* path
TEST_WORKER = ("sys.stdin.readline", "-m pytest", "bin/pytest", "execnet")


def kind(cmd: str) -> str:
    """A process's kind: Ray's title (``ray::Name``), else the first known name in its command line, else its program."""
    if m := re.match(r"ray::([A-Za-z_]+)", cmd):
        return f"ray::{m.group(1)}"
    if any(k in cmd for k in TEST_WORKER):
        return "pytest worker"
    for k in KINDS:
        if k in cmd:
            return k
    return (cmd.split() or ["?"])[0].rsplit("/", 1)[-1][:40]


def sample(seen: dict) -> None:
    for p in psutil.process_iter(["pid", "create_time", "cmdline", "name"]):
        try:
            t = p.cpu_times()
            cpu = t.user + t.system
            key = (p.info["pid"], p.info["create_time"])
            rec = seen.setdefault(key, {"pid": key[0], "start": key[1], "cpu0": cpu, "cmd": p.info["name"] or "?"})
            if p.info["cmdline"]:  # the title changes (Ray workers take tasks); an ended process not yet reaped has none
                rec["cmd"] = " ".join(p.info["cmdline"])[:300]
            rec.update(cpu=cpu, last=time.time())
        except psutil.Error:
            pass


def used(r: dict) -> float:
    """CPU-seconds a sampled process used while the command ran: all of its own, or, alive before the command began,
    what it used after the first sample."""
    return r["cpu"] - (r["cpu0"] if r["start"] < r.get("began", r["start"]) else 0.0)


def table(rows: list[dict], top: int = 30) -> str:
    by_kind = collections.Counter()
    count = collections.Counter()
    for r in rows:
        k = kind(r["cmd"])
        by_kind[k] += used(r)
        count[k] += 1
    total = sum(by_kind.values())
    lines = [f"{total:,.0f} CPU-seconds sampled in {len(rows)} processes", f"{'CPU-s':>8} {'share':>6} {'procs':>6}  kind"]
    lines += [f"{v:8.0f} {100 * v / total:5.1f}% {count[k]:6d}  {k}" for k, v in by_kind.most_common(top) if v >= 0.5]
    ray = sorted((r for r in rows if r["cmd"].startswith("ray::") or "raylet" in r["cmd"] or "log_monitor" in r["cmd"]),
                 key=lambda r: r["start"] - r["last"])[:10]
    lines.append("longest-lived Ray processes (alive s, CPU-s, kind):")
    lines += [f"{r['last'] - r['start']:8.0f} {used(r):8.1f}  {kind(r['cmd'])}" for r in ray]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--every", type=float, default=2.0, help="seconds between samples (default 2)")
    ap.add_argument("--out", help="save the samples as JSON lines")
    ap.add_argument("--read", help="print the table of saved samples instead of running a command")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    a = ap.parse_args()
    if a.read:
        print(table([json.loads(line) for line in open(a.read)]))
        return 0
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give a command after --")
    began, seen = time.time(), {}
    sample(seen)
    proc = subprocess.Popen(cmd)
    while proc.poll() is None:
        sample(seen)
        time.sleep(a.every)
    sample(seen)
    rows = [r for r in ({**r, "began": began} for r in seen.values()) if r["last"] >= began and used(r) > 0]
    if a.out:
        with open(a.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print(table(rows), file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
