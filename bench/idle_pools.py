"""Thread pools that spin against thread pools that sleep, where two processes share the cores (as the tests' two
pytest workers do): the bundled MiniLM on torch float32 with one thread per core encodes the same texts in two
processes side by side, first with OpenMP's and OpenBLAS's defaults (their idle threads spin), then with
``OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4`` (what tests/conftest.py sets), then one process alone under each.
Prints each side's seconds, the largest encoder process's peak RSS, and last the spinning pair's seconds over the passive pair's.

    python bench/idle_pools.py [--texts 3000]
"""

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _common import corpus_sample, cpu_line

PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"}
NAMES = {False: "spinning", True: "passive"}
ENCODE = """
import json, sys, time
import torch
from cqg_ray.encoder import load_encoder
texts = json.loads(sys.stdin.read())
enc = load_encoder("bundled:all-MiniLM-L6-v2", backend="torch-float32", device="cpu", threads=torch.get_num_threads())
enc.encode(texts[:64])
t0 = time.perf_counter()
enc.encode(texts, batch_size=32)
print(time.perf_counter() - t0)
"""


def pool_env(passive: bool) -> dict[str, str]:
    """This process's environment with the idle pools' settings: PASSIVE's, or neither (the libraries' defaults)."""
    return {k: v for k, v in os.environ.items() if k not in PASSIVE} | (PASSIVE if passive else {}) | {"HF_HUB_OFFLINE": "1"}


def encode_side_by_side(texts: list[str], processes: int, passive: bool) -> list[float]:
    """Seconds each of ``processes`` encoder processes took to encode ``texts``, started together."""
    env = pool_env(passive)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as files:
        logs = [files.enter_context(open(os.path.join(tmp, f"{i}.log"), "w+")) for i in range(processes)]  # the model loads' progress bars
        procs = [subprocess.Popen([sys.executable, "-c", ENCODE], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=log, text=True) for log in logs]
        for p in procs:
            files.enter_context(p.stdout)
            with p.stdin:
                p.stdin.write(json.dumps(texts))
        out = [p.stdout.read() for p in procs]
        for p, log in zip(procs, logs):
            if p.wait():
                log.seek(0)
                raise RuntimeError(f"an encoder process exited with {p.returncode}:\n{log.read()[-3000:]}")
    return [float(o.strip().splitlines()[-1]) for o in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=3000, help="texts each process encodes")
    args = ap.parse_args()
    print(cpu_line(), flush=True)
    texts = corpus_sample(args.texts)
    pairs = {}
    for passive, name in NAMES.items():
        t0 = time.perf_counter()
        each = encode_side_by_side(texts, 2, passive)
        pairs[name] = max(each)
        print(f"{name}, two side by side: {' and '.join(f'{s:.1f}' for s in each)} s ({time.perf_counter() - t0:.1f} s with start-up)", flush=True)
    for passive, name in NAMES.items():
        print(f"{name}, alone: {encode_side_by_side(texts, 1, passive)[0]:.1f} s", flush=True)
    print(f"peak RSS: largest encoder process {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MB")
    print(f"idle_pools_spinning_vs_passive: {pairs['spinning'] / pairs['passive']:.2f}")


if __name__ == "__main__":
    main()
