"""The MBQA tests' synthetic problem (``cqg_ray.mbqa.toy.make_problem``), one torch thread, and the processes a test's Ray started."""

import pytest

from cqg_ray.mbqa.toy import make_problem


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
    import psutil  # Ray's own dependency

    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            out[p.pid] = " ".join(p.cmdline())
        except psutil.Error:  # ended meanwhile
            pass
    return out
