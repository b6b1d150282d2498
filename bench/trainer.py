"""The task trainer against Ray Train's one worker: the same heads, and the seconds each takes to train them.

The tests' synthetic problem (400 texts, d=16, 6 questions, 150 labelled texts each), 40 epochs at lr 1e-2 (the size of
a demo's or a test's training: the run is start-up, not epochs). A local Ray of 2 CPUs; the trainers alternate, three
runs each, the first of each warming its imports. Prints each run's seconds, whether every run gave the first run's
weights to the bit, the driver's and the largest worker's peak RSS, and last the median Ray Train seconds over the
median task seconds.

    python bench/trainer.py
"""

import os
import resource
import statistics
import sys
import tempfile
import time

import ray
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _common import cpu_line

from cqg_ray.config import TrainConfig
from cqg_ray.mbqa.toy import make_problem
from cqg_ray.mbqa.train import train_heads


def workers_peak_mb() -> float:
    """The largest peak RSS (VmHWM) of the processes this one's Ray started (its descendants), alive now."""
    import psutil  # Ray's own dependency

    peaks = []
    for pid in (p.pid for p in psutil.Process().children(recursive=True)):
        try:
            peaks += [int(ln.split()[1]) / 1024 for ln in open(f"/proc/{pid}/status") if ln.startswith("VmHWM")]
        except OSError:
            pass
    return max(peaks, default=0.0)


def main() -> None:
    print(cpu_line(), flush=True)
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    emb, dense = make_problem()
    seconds: dict[str, list[float]] = {"task": [], "ray": []}
    first, same = None, True
    with tempfile.TemporaryDirectory() as storage:
        for i in range(3):
            for kind in ("task", "ray"):
                cfg = TrainConfig(epochs=40, lr=1e-2, cpus_per_worker=0.5, checkpoint_every=40, trainer=kind)
                t0 = time.perf_counter()
                heads = train_heads(emb, dense, cfg, storage, f"{kind}-{i}").heads.state_dict()
                seconds[kind].append(time.perf_counter() - t0)
                first = first or heads
                same = same and all(torch.equal(heads[k], v) for k, v in first.items())
                print(f"run {i + 1} {kind}: {seconds[kind][-1]:.1f} s", flush=True)
    task, ray_train = (statistics.median(seconds[k]) for k in ("task", "ray"))
    print(f"median: task {task:.1f} s, Ray Train {ray_train:.1f} s; every run the same weights: {same}")
    print(f"peak RSS: driver {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB, largest process of its Ray {workers_peak_mb():.0f} MB")
    print(f"task_trainer_speedup: {ray_train / task:.2f}")


if __name__ == "__main__":
    main()
