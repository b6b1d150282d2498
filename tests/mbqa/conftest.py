"""The MBQA tests' synthetic problem (``cqg_ray.mbqa.toy.make_problem``), heads trained on it in this process, one torch
thread, and the processes a test's Ray started."""

import pytest

from cqg_ray.mbqa.toy import make_problem


@pytest.fixture
def problem():
    return make_problem


def local_shard(emb, pairs, cfg):
    """One shard of all ``pairs`` with its texts' embeddings, and the steps of an epoch over it."""
    from cqg_ray.mbqa.loop import make_shards, steps_per_epoch

    shard = make_shards(pairs, 1, cfg.seed)[0]
    shard["emb"] = emb[shard.pop("docs")]
    return shard, steps_per_epoch([shard], pairs.n_questions, cfg.pairs_per_head)


def train_locally(emb, pairs, cfg, heads=None, opt=None, start_epoch=0, directions=None):
    """Heads trained on ``pairs`` by the training loop in this process: (heads, optimizer, each epoch's metrics). With
    ``directions`` (m, d), the question prior is fitted on the shard, trained beside the heads and folded into them."""
    import torch

    from cqg_ray.mbqa.heads import StackedHeads
    from cqg_ray.mbqa.loop import make_optimizer, run_epochs
    from cqg_ray.mbqa.prior import PriorHeads, fit_prior, fold_prior, pair_cosines

    torch.manual_seed(cfg.seed)
    heads = heads or StackedHeads(emb.shape[1], pairs.n_questions, cfg.hidden)
    opt = opt or make_optimizer(heads, cfg)
    shard, n_steps = local_shard(emb, pairs, cfg)
    model = heads
    if directions is not None:
        alpha, beta = fit_prior(pair_cosines(shard["emb"], shard["row"], shard["question"], directions), shard["answer"])
        model = PriorHeads(heads, directions, alpha, beta)
    history = []
    run_epochs(heads, opt, shard, n_steps, cfg, pairs.auto_pos_weight(), start_epoch, lambda e, mt: history.append(mt), model=model)
    if directions is not None:
        heads = fold_prior(heads, directions, alpha, beta)
    return heads, opt, history


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
    import psutil  # Ray's own dependency

    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            out[p.pid] = " ".join(p.cmdline())
        except psutil.Error:  # ended meanwhile
            pass
    return out
