"""Ray Train on a Ray of one machine: Ray's own settings against `pipeline.LOCAL_TRAIN_ENV` (no preemption watcher, the
controller polling its workers 4 times a second instead of every 2 s), what a local Ray started by cqg-ray runs with.

The tests' synthetic problem (400 texts, d=16, 6 questions), 2 data-parallel workers of 0.5 CPU, 2 epochs: a run of
that size is Ray Train's start and end, which these settings shorten. One local Ray of 2 CPUs; the sides alternate,
three runs each (Ray Train reads the settings from the driver's environment when a run starts, so both sides share
the Ray). Prints each run's seconds, whether both sides gave the same weights, the driver's and the largest worker's
peak RSS, and last the median seconds with Ray's settings over the median with cqg-ray's.

    python bench/train_local_env.py
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
from trainer import workers_peak_mb

from cqg_ray.config import TrainConfig
from cqg_ray.mbqa.toy import make_problem
from cqg_ray.mbqa.train import train_heads
from cqg_ray.pipeline import LOCAL_TRAIN_ENV

SIDES = ("ray", "local")  # Ray's own settings; LOCAL_TRAIN_ENV


def side_env(side: str, environ=os.environ) -> None:
    """The driver's environment for one side: LOCAL_TRAIN_ENV set ("local") or removed ("ray")."""
    for key, value in LOCAL_TRAIN_ENV.items():
        if side == "local":
            environ[key] = value
        else:
            environ.pop(key, None)


def main() -> None:
    print(cpu_line(), flush=True)
    torch.set_num_threads(1)
    side_env("ray")  # the Ray's own processes start without them: each run's driver environment decides
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    emb, dense = make_problem()
    seconds: dict[str, list[float]] = {s: [] for s in SIDES}
    weights: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as storage:
        for i in range(3):
            for side in SIDES:
                side_env(side)
                cfg = TrainConfig(epochs=2, lr=1e-2, num_workers=2, cpus_per_worker=0.5, checkpoint_every=1, seed=0, trainer="ray")
                t0 = time.perf_counter()
                heads = train_heads(emb, dense, cfg, storage, f"{side}-{i}").heads.state_dict()
                seconds[side].append(time.perf_counter() - t0)
                weights.setdefault(side, heads)
                print(f"run {i + 1} {side}: {seconds[side][-1]:.1f} s", flush=True)
    same = all(torch.equal(weights["ray"][k], v) for k, v in weights["local"].items())
    ray_s, local_s = (statistics.median(seconds[s]) for s in SIDES)
    print(f"median: Ray's settings {ray_s:.1f} s, LOCAL_TRAIN_ENV {local_s:.1f} s; the same weights: {same}")
    print(f"peak RSS: driver {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB, largest process of its Ray {workers_peak_mb():.0f} MB")
    print(f"train_local_env_speedup: {ray_s / local_s:.2f}")


if __name__ == "__main__":
    main()
