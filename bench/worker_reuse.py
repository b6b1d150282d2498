"""Ray's idle workers killed against kept, for many small Ray Data jobs in one Ray (a test session's pattern): a driver
starts a local Ray of 2 CPUs and runs ``--jobs`` small jobs one after another, a pause between them (the rest of a
test): tasks every time, an actor stage every third job, a sort (the shuffle's workers, which run in their own runtime
environment) every fourth. Once with Ray's default (idle workers beyond the CPUs free at that moment are killed after
1 s), once with ``RAY_num_workers_soft_limit=4`` (what tests/conftest.py sets). Prints each side's seconds, the Ray
worker processes it started, the machine's busy CPU-seconds (read from /proc/stat: run it on a quiet machine) and the
driver's peak RSS; last the default's seconds over the kept side's.

    python bench/worker_reuse.py [--jobs 12] [--pause 2]
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _common import cpu_line

KEEP = {"RAY_num_workers_soft_limit": "4"}
NAMES = {False: "default", True: "kept"}
DRIVER = """
import json, os, resource, sys, threading, time
import psutil, ray, ray.data

jobs, pause = int(sys.argv[1]), float(sys.argv[2])
workers, done = set(), threading.Event()

def watch():  # every Ray worker process this Ray starts (a worker's start takes well over the interval)
    while not done.is_set():
        for p in psutil.process_iter(["pid", "cmdline"]):
            if "default_worker.py" in " ".join(p.info["cmdline"] or []):
                workers.add(p.info["pid"])
        time.sleep(0.2)

class Double:
    def __call__(self, batch):
        return {"x": batch["x"] * 2}

threading.Thread(target=watch, daemon=True).start()
t0 = time.perf_counter()
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
ctx = ray.data.DataContext.get_current()
ctx.enable_progress_bars = False
ctx.print_on_execution_start = False
for i in range(jobs):
    ds = ray.data.range(2000, override_num_blocks=8).map_batches(lambda b: {"x": b["id"] * 1.0})
    if i % 3 == 0:
        ds = ds.map_batches(Double, concurrency=1)
    if i % 4 == 1:
        ds = ds.sort("x")
    assert ds.count() == 2000
    time.sleep(pause)
seconds = time.perf_counter() - t0
ray.shutdown()
done.set()
print(json.dumps({"seconds": seconds, "workers": len(workers), "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def busy_cpu_seconds() -> float:
    """The machine's busy CPU-seconds since boot (user, nice, system, irq, softirq of every CPU)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def reuse_env(kept: bool) -> dict[str, str]:
    """This process's environment with Ray's idle workers kept (``KEEP``) or Ray's default (the variable removed)."""
    return {k: v for k, v in os.environ.items() if k not in KEEP} | (KEEP if kept else {}) | {"RAY_AUTH_MODE": "disabled"}


def run_driver(jobs: int, pause: float, kept: bool) -> dict:
    """One driver's run: its seconds, the Ray workers it started, its peak RSS (MB) and the machine's busy CPU-seconds."""
    before = busy_cpu_seconds()
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(jobs), str(pause)], env=reuse_env(kept), capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"the driver exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]) | {"busy_cpu_s": busy_cpu_seconds() - before}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=12, help="small Ray Data jobs the driver runs")
    ap.add_argument("--pause", type=float, default=2.0, help="seconds between jobs (over Ray's 1 s before it kills an idle worker)")
    args = ap.parse_args()
    print(cpu_line(), flush=True)
    sides = {}
    for kept, name in NAMES.items():
        r = sides[name] = run_driver(args.jobs, args.pause, kept)
        print(f"{name}: {r['seconds']:.1f} s, {r['workers']} Ray worker processes, {r['busy_cpu_s']:.0f} busy CPU-seconds, "
              f"driver peak RSS {r['rss_mb']:.0f} MB", flush=True)
    print(f"worker_reuse_default_vs_kept: {sides['default']['seconds'] / sides['kept']['seconds']:.2f}")


if __name__ == "__main__":
    main()
