"""A small synthetic MBQA problem: answers that a head can learn from the embeddings."""

import os
import subprocess

import numpy as np
import pytest


def make_problem(n_docs=400, d=16, m=6, per_question=150, seed=0):
    """Unit embeddings; question i is 'yes' when the projection on a random direction exceeds a threshold
    (25% yes over the corpus); each question is labelled on `per_question` random texts. Returns (embeddings, dense int8 labels)."""
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n_docs, d)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    directions = rng.standard_normal((m, d))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    proj = emb @ directions.T
    truth = (proj > np.quantile(proj, 0.75, axis=0)).astype(np.int8)
    labels = np.full((n_docs, m), -1, dtype=np.int8)
    for q in range(m):
        docs = rng.choice(n_docs, per_question, replace=False)
        labels[docs, q] = truth[docs, q]
    return emb, labels


@pytest.fixture
def problem():
    return make_problem


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Two torch threads collapse when the other core is busy (shared 2-core machines): use one in these tests."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def descendant_processes() -> dict[int, str]:
    """pid -> command line of every process alive now that descends from this one (the local Ray it started, its
    workers); another Ray on the machine is not among them."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines()]
    parent = {int(r[0]): int(r[1]) for r in rows}

    def ours(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    return {int(r[0]): r[2] if len(r) == 3 else "" for r in rows if ours(int(r[0]))}
