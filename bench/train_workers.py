"""2 Ray Train workers against 1, the data through Ray Data: do they give the same heads within noise?

The synthetic problem of the tests (400 texts, d=16, 6 questions, 150 labelled texts each), 40 epochs at lr 1e-2,
10% of the texts held out. Trains 1 worker with seed 0 and seed 1 (the noise: only the seed differs) and 2 workers
with seed 0, then prints each run's held-out accuracy and wall time, and for each pair of runs the mean |P(yes)
difference| over all texts x questions and the share of the same answers at tau 0.5. Local Ray of 2 CPUs.

    python bench/train_workers.py
"""

import os
import sys
import tempfile
import time

import numpy as np
import ray
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from cqg_ray.config import TrainConfig
from cqg_ray.mbqa.toy import make_problem
from cqg_ray.mbqa.train import train_and_evaluate


def main() -> None:
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    emb, dense = make_problem()
    probs = {}
    with tempfile.TemporaryDirectory() as storage:
        for name, seed, workers in (("1 worker, seed 0", 0, 1), ("1 worker, seed 1", 1, 1), ("2 workers, seed 0", 0, 2)):
            cfg = TrainConfig(epochs=40, lr=1e-2, num_workers=workers, cpus_per_worker=0.5, checkpoint_every=40, seed=seed)
            t0 = time.time()
            result, report = train_and_evaluate(emb, dense, cfg, storage, name.replace(" ", "-").replace(",", ""))
            probs[name] = torch.sigmoid(result.heads.forward_all(torch.tensor(emb))).detach().numpy()
            print(f"{name}: held-out accuracy {report['accuracy']:.3f}, {time.time() - t0:.1f} s", flush=True)
    names = list(probs)
    for a, b in ((names[0], names[1]), (names[0], names[2]), (names[1], names[2])):
        p, q = probs[a], probs[b]
        print(f"{a} vs {b}: mean |dP| {np.abs(p - q).mean():.3f}, same answer {((p > 0.5) == (q > 0.5)).mean():.1%}")


if __name__ == "__main__":
    main()
