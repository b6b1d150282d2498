"""Live progress: counters the engines advance within a batch, the driver's view (log lines, the progress file), the
relay from workers, the time-left estimate, `cqg-ray status` of a run that is in a stage or was stopped in one, and
the bar a Jupyter notebook shows."""

import io
import json
import logging
import os
import re
import sys
import threading
import time
import types

import pytest

from cqg_ray import progress
from cqg_ray.config import LLMConfig
from cqg_ray.llm.base import Request
from cqg_ray.llm.engines.fake import FakeBackend
from cqg_ray.rundir import RunDir


class Lines(logging.Handler):
    """The cqg_ray logger's records, with the time each arrived."""

    def __init__(self):
        super().__init__()
        self.got: list[tuple[float, str]] = []

    def emit(self, record):
        self.got.append((time.time(), record.getMessage()))


@pytest.fixture
def lines(monkeypatch):
    monkeypatch.setenv("CQG_RAY_PROGRESS", "1")  # the view shows (the suite turns bars off)
    monkeypatch.setenv("CQG_RAY_PROGRESS_EVERY_S", "0.5")
    logger = logging.getLogger("cqg_ray")
    h, level = Lines(), logger.level
    logger.addHandler(h)
    logger.setLevel(logging.INFO)
    yield h
    logger.removeHandler(h)
    logger.setLevel(level)


def numbers(line: str, what: str) -> int:
    m = re.search(rf"([\d,]+) {what}", line)
    return int(m.group(1).replace(",", "")) if m else 0


def test_a_batch_of_several_seconds_shows_tokens_advancing_before_it_ends(tmp_path, lines):
    """One fake batch of 8 requests taking 4 s: the log (what a job's log shows; stderr is no terminal here) has lines
    with 0 requests finished and more prompt tokens read each time, before the batch's replies arrive."""
    from cqg_ray.llm.runner import run_requests

    llm = LLMConfig(backend="fake")
    reqs = [Request([{"role": "user", "content": f"text {i}: " + "word " * 80}], max_tokens=10) for i in range(8)]
    backend = FakeBackend(llm, delay_s=0.5, batch_size=8)
    t0 = time.time()
    out = run_requests(reqs, llm, RunDir(str(tmp_path / "run")), "labels", backend=backend)
    assert all(r.ok for r in out)
    during = [(t, m) for t, m in lines.got if m.startswith("llm labels: 0/8 req") and t < t0 + 3.8]
    read = [numbers(m, "prompt tokens read") for _, m in during]
    assert len(read) >= 4 and read == sorted(read) and read[-1] > read[1] > 0, during  # the first line: at the start
    assert all(re.search(r"~\d+s left", m) for _, m in during[1:]), during
    last = [m for _, m in lines.got if m.startswith("llm labels:") and " req, " in m][-1]
    assert last.startswith("llm labels: 8/8 req") and last.endswith("~0s left")
    assert numbers(last, "prompt tokens read") == sum(len(r.messages[0]["content"]) // 4 + 1 for r in reqs)
    record = json.loads((tmp_path / "run" / "_progress.json").read_text())
    assert record["stage"] == "labels" and record["done"] == record["total"] == 8 and record["final"]


def test_the_time_left_from_the_counters():
    c = dict.fromkeys(progress.NAMES, 0.0)
    assert progress.llm_eta(c, 10, 0.0, 5.0) is None  # nothing advanced yet
    # 4 of 10 requests handed with 400 prompt tokens planned, 100 read in 10 s: 300 + 6 x 100 left at 0.1 s each
    c.update(handed=4, planned=400, read=100, read_s=10.0)
    assert progress.llm_eta(c, 10, 0.0, 10.0) == pytest.approx(90.0)
    # 50 tokens to generate a request, none generated yet: each at 4 prompt tokens' time (0.4 s)
    assert progress.llm_eta(c, 10, 50.0, 10.0) == pytest.approx(90.0 + 500 * 0.4)
    # generation: 50 tokens expected a request before any finishes; 20 generated in 4 s: 480 more at 0.2 s
    c.update(generated=20, generate_s=4.0)
    assert progress.llm_eta(c, 10, 50.0, 14.0) == pytest.approx(90.0 + 96.0)
    # two engines side by side: 28 s of engine time in 14 s of wall time halve it
    assert progress.llm_eta(c, 10, 50.0, 7.0) == pytest.approx((90.0 + 96.0) / 2)
    # once requests finish, their mean generated tokens replaces the prior: 20 tokens for the 2 finished and half of
    # the 2 still running, 20 / 3 a request
    c.update(finished=2)
    assert progress.llm_eta(c, 10, 50.0, 14.0) == pytest.approx(90.0 + (10 * 20 / 3 - 20) * 0.2)
    c.update(finished=4)  # every handed request finished: their own mean, 5 a request
    assert progress.llm_eta(c, 10, 50.0, 14.0) == pytest.approx(90.0 + 30 * 0.2)
    # a batch of 16 whose first reply ended (the demo's, 2026-12-07): 1,094 tokens over 1 + 15 / 2 requests, ~129 a
    # request, not 1,094
    e = dict.fromkeys(progress.NAMES, 0.0)
    e.update(handed=16, planned=16_900, read=16_900, read_s=150.0, finished=1, generated=1_094, generate_s=25.0)
    assert progress.llm_eta(e, 20, 130.0, 175.0) == pytest.approx((4 * 16_900 / 16 * 150 / 16_900 + (20 * 1_094 / 8.5 - 1_094) * 25 / 1_094) / 1)
    # a server that reports no tokens: by requests alone
    d = dict.fromkeys(progress.NAMES, 0.0)
    d.update(finished=2)
    assert progress.llm_eta(d, 10, 0.0, 6.0) == pytest.approx(24.0)


class FakeQueue:
    """What relay and View use of a ``ray.util.queue.Queue``."""

    def __init__(self):
        self.items = []
        self.lock = threading.Lock()

    def put_nowait(self, x):
        with self.lock:
            self.items.append(x)

    def qsize(self):
        return len(self.items)

    def get_nowait_batch(self, n):
        with self.lock:
            out, self.items = self.items[:n], self.items[n:]
        return out


def test_a_worker_relays_what_advanced_and_the_view_adds_it(monkeypatch):
    q = FakeQueue()
    progress.add(read=7)  # before the relay starts: not sent
    progress.relay(q)
    progress.add(read=100, read_s=2.0, finished=3)
    progress.flush_relay()
    assert q.items[-1]["read"] == 100 and q.items[-1]["finished"] == 3 and q.items[-1]["read_s"] == 2.0
    progress.flush_relay()  # nothing advanced: nothing sent
    assert len(q.items) == 1
    progress.relay(None)

    view = progress.View("llm x", "req", 10, show=False)
    view.queue = FakeQueue()
    view.queue.put_nowait({**dict.fromkeys(progress.NAMES, 0), "finished": 4, "read": 50})
    progress.add(finished=1)
    c = view.counts()
    assert c["finished"] == 5 and c["read"] == 50
    assert view.line(c)[0].startswith("5/10 req, 50 prompt tokens read")


def test_a_text_view_and_an_epoch_view_count_their_own_quantity(tmp_path):
    run = RunDir(str(tmp_path / "r"))
    with progress.View("encode", "text", 3000, kind="texts", run=run, stage="encode", show=False) as view:
        # written as the view opens (its first tick is seconds away): a stage killed at once still shows in status
        assert progress.read_progress(run)["line"].startswith("0/3,000 text") and progress.read_progress(run)["stage"] == "encode"
        progress.add(texts=1024)
        assert view.line()[0].startswith("1,024/3,000 text")
    assert progress.read_progress(run)["line"].startswith("1,024/3,000 text")
    with progress.View("train", "epoch", 200, kind="epochs", run=run, stage="train", show=False) as view:
        view.initial = 120  # a resumed run: shown, not in the rate
        progress.add(epochs=8)
        view.note = "loss 0.1234"
        text, eta = view.line()
    assert text.startswith("128/200 epoch") and "loss 0.1234" in text and eta is not None


def test_status_shows_the_stage_a_run_is_in_and_a_stopped_one_as_interrupted(tmp_path, monkeypatch):
    import subprocess
    import sys

    from cqg_ray.lease import LEASE, note_stage, take_lease
    from cqg_ray.pipeline import run_status

    root = str(tmp_path / "run")
    run = RunDir(root)
    with take_lease(root, "cqg-ray run"):
        note_stage(root, "questions")
        with progress.View("llm cqg-generate", "req", 16, run=run, stage="cqg-generate", show=False):
            progress.add(handed=16, planned=26_800, read=5_000, read_s=20.0)
            time.sleep(0.05)
        row = next(ln for ln in run_status(run).splitlines() if ln.startswith("questions"))
        assert row.split()[:3] == ["questions", "running", "-"]
        assert "llm cqg-generate: 0/16 req, 5,000 prompt tokens read" in row and "left" in row
        assert next(ln for ln in run_status(run).splitlines() if ln.startswith("labels")).split()[1] == "missing"
        # the table `cqg-ray run` prints as it stops (its own lease still held): the stage it failed in is not running
        assert next(ln for ln in run_status(run, live=False).splitlines() if ln.startswith("questions")).split()[:2] == ["questions", "missing"]
        lease = json.loads((tmp_path / "run" / LEASE).read_text())

    # the same lease left by a process that is gone (a kill -9): the stage shows as interrupted, with what it had done
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    lease["holder"]["pid"] = int(gone)
    (tmp_path / "run" / LEASE).write_text(json.dumps(lease))
    row = next(ln for ln in run_status(run).splitlines() if ln.startswith("questions"))
    assert row.split()[:2] == ["questions", "interrupted"] and "5,000 prompt tokens read" in row and "ago)" in row
    os.remove(tmp_path / "run" / LEASE)
    assert next(ln for ln in run_status(run).splitlines() if ln.startswith("questions")).split()[1] == "missing"


def fake_kernel(monkeypatch, kernel: object | None = object()) -> None:
    """What an IPython kernel leaves in sys.modules: ipykernel, and IPython whose shell has a kernel (None: a terminal
    IPython's shell)."""
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: types.SimpleNamespace(kernel=kernel)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    monkeypatch.setitem(sys.modules, "IPython", ipython)


def test_a_notebook_is_an_ipython_kernel_and_nothing_is_imported_to_tell(monkeypatch):
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert progress.in_notebook() is False
    assert "IPython" not in sys.modules and "ipykernel" not in sys.modules
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))  # ipykernel alone (no IPython)
    assert progress.in_notebook() is False
    fake_kernel(monkeypatch, kernel=None)  # a terminal IPython that imported ipykernel
    assert progress.in_notebook() is False
    fake_kernel(monkeypatch)
    assert progress.in_notebook() is True


def test_a_notebook_shows_tqdm_autos_bar_where_stderr_is_no_terminal(tmp_path, lines, monkeypatch):
    """stderr is no terminal in a notebook: the view draws tqdm.auto's bar (a widget where ipywidgets is installed),
    which the counters advance, and logs no lines; outside a notebook the same view logs lines and draws no bar."""
    import tqdm.auto

    class Bar(tqdm.auto.tqdm):
        made: list = []

        def __init__(self, *args, **kwargs):
            super().__init__(*args, file=io.StringIO(), **kwargs)
            Bar.made.append(self)

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # as a kernel's: isatty() is False
    fake_kernel(monkeypatch)
    run = RunDir(str(tmp_path / "run"))
    with progress.View("encode", "text", 3000, kind="texts", run=run, stage="encode") as view:
        assert view.bar is Bar.made[0] and len(Bar.made) == 1
        assert (view.bar.total, view.bar.desc, view.bar.n) == (3000, "encode", 0)
        progress.add(texts=1024)
        deadline = time.time() + 5
        while view.bar.n != 1024 and time.time() < deadline:  # the view's thread refreshes the bar every second
            time.sleep(0.05)
        assert view.bar.n == 1024
        progress.add(texts=976)
    bar = Bar.made[0]
    assert bar.n == 2000 and re.fullmatch(r"[\d,.]+ text/s, \d+s elapsed, ~\d+s left", bar.postfix)
    assert [m for _, m in lines.got if m.startswith("encode:")] == []
    assert progress.read_progress(run)["line"].startswith("2,000/3,000 text") and progress.read_progress(run)["final"]

    fake_kernel(monkeypatch, kernel=None)  # not a notebook, stderr no terminal: log lines, no bar
    with progress.View("encode", "text", 10, kind="texts") as view:
        progress.add(texts=10)
    assert view.bar is None and len(Bar.made) == 1
    got = [m for _, m in lines.got if m.startswith("encode:")]
    assert got[0].startswith("encode: 0/10 text") and got[-1].startswith("encode: 10/10 text")
