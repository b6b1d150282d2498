"""Run the stages of ``cqg_ray.stages`` in order from one config, skipping what is done and resuming what is not.

The CLI's stage commands and ``run_pipeline`` (``cqg-ray run``, also the `ray job submit` entrypoint) call the
same ``run_one``; a stage only knows its inputs through the run directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

from cqg_ray import stages
from cqg_ray.config import ConfigError, PipelineConfig, RayConfig, config_data, config_from_dict, dump_config, stage_hash
from cqg_ray.rundir import ArtifactError, RunDir, run_stage
from cqg_ray.status import format_status

log = logging.getLogger("cqg_ray")


MALLOC_ARENA_MAX = "2"  # glibc heaps per process for the Ray workers a local Ray starts (jobs/runtime_env.yaml: on a cluster)
# Ray Train on a Ray of one machine: no cloud drains its node, so no preemption watcher (an actor, a process start, a
# run), and the controller polls its workers 4 times a second instead of every 2 s (each phase of a run waits less).
# A 2-epoch run of 2 workers on 2 Zen 4 cores: 16.6 s with Ray's settings, 12.5 s with these (bench/train_local_env.py).
LOCAL_TRAIN_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25"}


def local_ray_env(environ=os.environ) -> None:
    """What a local Ray and its Ray Train runs start with, where the user did not set it: glibc's per-thread heaps
    (arenas) capped in its workers (Ray runs tasks on several threads, and each thread's arena kept what torch and
    Arrow freed: a model-stage stats worker of the 1M rehearsal grew to 1.66 GB over 80 files, 0.93 GB with 2 arenas,
    as fast), and `LOCAL_TRAIN_ENV` (Ray Train reads it from the driver's environment when a run starts)."""
    environ.setdefault("MALLOC_ARENA_MAX", MALLOC_ARENA_MAX)
    for key, value in LOCAL_TRAIN_ENV.items():
        environ.setdefault(key, value)


def started_ray() -> bool:
    """Whether this process started the Ray it is connected to (a local instance, which no autoscaler grows) rather than
    joined a cluster (`--address`, RAY_ADDRESS, `ray job submit`): Ray's own record, the driver's node being the head
    it started."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    return bool(ray.is_initialized() and getattr(node, "head", False))


def init_ray(cfg: RayConfig, quiet: bool = True) -> None:
    """Start or join Ray once per process."""
    import ray

    if ray.is_initialized():
        return
    if cfg.address in (None, "", "local"):  # Ray starts a local instance: its raylet and workers inherit our environment
        local_ray_env()
    kwargs = {"include_dashboard": cfg.include_dashboard, "log_to_driver": not quiet, "configure_logging": True,
              "logging_level": logging.WARNING if quiet else logging.INFO}
    joining = cfg.address or os.environ.get("RAY_ADDRESS")
    if joining and (why := head_unreachable(joining)) is not None:  # else ray.init retries for minutes, printing warnings
        raise ConfigError(why)
    sigterm = signal.getsignal(signal.SIGTERM)  # a command's own (cli.unwinds_on_sigterm), where it set one
    if quiet:
        logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(quiet_default_auth)
    try:
        if cfg.address:
            ray.init(address=cfg.address, **kwargs)
        elif os.environ.get("RAY_ADDRESS"):  # RAY_ADDRESS still decides
            ray.init(address=None, num_cpus=cfg.num_cpus, **kwargs)
        else:  # a new local Ray ("local": not a cluster that `ray start` left its address file for)
            start_local_ray(ray.init, address="local", num_cpus=cfg.num_cpus, **kwargs)
    except SystemExit as e:  # SIGTERM while Ray started: ray.init's own handler exits 15 without a word
        if callable(sigterm) and e.code == signal.SIGTERM:
            sigterm(signal.SIGTERM, None)  # the command's: it unwinds as it does once Ray runs
        raise
    finally:
        if callable(sigterm) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)  # in place of Ray's, which dumps a stack and aborts the process (exit 134)
    import ray.data

    if quiet:  # Ray Data's per-dataset progress log lines; our own bars and logs say what is happening
        for name in ("ray.data", "ray.data._internal", "ray.train", "ray.serve"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # its warnings that the progress bars we turn off below are off ("Progress bars for operators disabled. To enable...")
        logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = os.environ.get("CQG_RAY_PROGRESS", "1") != "0"
    ctx.print_on_execution_start = False
    try:
        ctx.enable_operator_progress_bars = False  # one overall bar is enough
    except AttributeError:
        pass


def quiet_default_auth(record: logging.LogRecord) -> bool:
    """A logging filter: Ray's line that a new local Ray has token authentication on (its default), which invites
    setting RAY_AUTH_MODE=disabled, is not shown; every other line is (docs/cluster.md: token authentication)."""
    return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster.")


JOIN_WAIT_S = 15.0  # how long a Ray head to join may take to accept a connection (one that is still starting)


def head_unreachable(address: str, wait_s: float | None = None) -> str | None:
    """Why nothing accepts a TCP connection at a Ray address (host:port, or ray://host:port for Ray Client) within
    `wait_s` (JOIN_WAIT_S), or None: it does, or the address is not a host and port ("auto", "local", a URL of another
    kind), which Ray resolves itself."""
    import socket
    from urllib.parse import urlsplit

    if "://" in address and not address.startswith("ray://"):
        return None
    try:
        parts = urlsplit(address if "://" in address else "ray://" + address)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host or port is None:
        return None
    wait_s = JOIN_WAIT_S if wait_s is None else wait_s
    deadline, error = time.monotonic() + wait_s, None
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, min(3.0, deadline - time.monotonic()))).close()
            return None
        except OSError as e:
            error = e.strerror or type(e).__name__
        if time.monotonic() >= deadline:
            return (f"no Ray head answers at {host}:{port} ({error}, for {wait_s:g} s): check the address given by --address, "
                    "RAY_ADDRESS or ray.address (`ray status` on the head prints it)")
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


RAY_START_TRIES = 3  # Ray gives a new node's raylet 30 s (fixed) to register: a busy 2-core machine can take longer


def start_local_ray(init, tries: int = RAY_START_TRIES, **kwargs) -> None:
    """``init(**kwargs)``, started again where Ray's own start timed out ("timed out during startup"), after stopping
    the processes the failed start left; any other error is raised. A start stopped by SIGTERM (SystemExit) stops what
    it left too: Ray's own clean-up leaves the raylet's agents running for good where they were still starting."""
    for attempt in range(1, tries + 1):
        began = time.time() - 1  # create_time is rounded
        try:
            return init(**kwargs)
        except SystemExit:
            stop_children_since(began)
            raise
        except Exception as e:  # Ray raises a bare Exception for it
            if "timed out during startup" not in str(e) or attempt == tries:
                raise
            log.warning("Ray's local start timed out (%s); starting it again (%d of %d)", e, attempt + 1, tries)
            stop_children_since(began)


def stop_children_since(began: float) -> None:
    """Kill this process's children (and theirs) started since ``began`` (epoch seconds), and wait for them."""
    import psutil  # Ray's own dependency

    left = [p for p in psutil.Process().children(recursive=True) if p.create_time() >= began]
    for p in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(left, timeout=30)


def ray_address(cli_address: str | None, config_address: str | None) -> str | None:
    """The cluster to join: ``--address``, else the job's RAY_ADDRESS (`ray job submit` sets it for the entrypoint),
    else the config's ray.address (None: start a local Ray)."""
    if cli_address:
        return cli_address
    if os.environ.get("RAY_ADDRESS") or os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"):
        return os.environ.get("RAY_ADDRESS") or "auto"
    return config_address


def run_one(cfg: PipelineConfig, stage: str, force: bool = False) -> dict:
    """Run one stage (by name or command; if not done), after saving the config into the run directory (put back as it
    was where the stage refuses the new one before writing anything: `run_stage`)."""
    from cqg_ray.lease import note_stage

    s = stages.get(stage)
    run = RunDir(cfg.run_dir)
    saved = run.read_bytes("config.yaml") if run.exists("config.yaml") else None
    run.write_bytes("config.yaml", dump_config(cfg).encode())
    note_stage(cfg.run_dir, s.name)
    try:
        return run_stage(run, s.name, stage_hash(cfg, s.name), lambda ctx: s.run(cfg, ctx), s.reads, force=force)
    except ValueError:  # refused: where the finished stage kept its manifest (nothing written), the run keeps its config
        if saved is not None and run.manifest(s.name) is not None:
            run.write_bytes("config.yaml", saved)
        raise


def run_pipeline(cfg: PipelineConfig, until: str | None = None, force: list[str] | None = None, skip: list[str] | None = None) -> dict[str, dict]:
    """All stages in order (up to and including ``until``); done stages are skipped unless in ``force``.
    Stages by name or command; an unknown one is a ValueError."""
    until = stages.get(until).name if until else None
    force_names = {stages.get(f).name for f in force or []}
    skip_names = {stages.get(k).name for k in skip or []}
    init_ray(cfg.ray)
    out = {}
    for s in stages.STAGES:
        if s.name in skip_names:
            continue
        out[s.name] = run_one(cfg, s.name, force=s.name in force_names)
        release_memory()
        if s.name == until:
            break
    return out


def release_memory() -> None:
    """Give what a finished stage freed back to the OS (Python's garbage, Arrow's pool, glibc's heap), so that the
    driver's memory between stages is what it still holds, not what earlier stages once used."""
    import ctypes
    import gc

    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing more to give back
        pass


def saved_config(run: RunDir) -> PipelineConfig | None:
    """The config a run last used (its config.yaml); None when it has none or this version cannot read it."""
    if not run.exists("config.yaml"):
        return None
    from cqg_ray.artifacts import run_config_text

    try:
        text, uri = run_config_text(run)
        return config_from_dict(config_data(text, uri), uri)
    except (ConfigError, ArtifactError) as e:
        log.warning("%s cannot be read (%s): stages are judged by their manifests alone", run.uri("config.yaml"), e)
        return None


def run_status(run: RunDir, live: bool = True, every: bool = False) -> str:
    """The table `cqg-ray status` prints: each stage done / stale / missing, judged against the run's saved config;
    the stage a live run is in shows as running (interrupted once its lease is stale), with its last progress line.
    ``live=False``: no such row (the run printing its own table as it stops still holds the lease); ``every``: every
    count of each stage, not its headline ones."""
    cfg = saved_config(run)  # None: judge by manifests and inputs alone
    hashes = {s.name: stage_hash(cfg, s.name) for s in stages.STAGES} if cfg is not None else None
    return format_status(run, hashes, live_stage(run) if live else None, every)


def live_stage(run: RunDir) -> tuple[str, str, str] | None:
    """(stage, "running" or "interrupted", what it has done) for the stage the run directory's lease names, from the
    lease and ``_progress.json``; None when no lease names a stage."""
    from cqg_ray.lease import current, stale_reason
    from cqg_ray.progress import fmt_duration, read_progress

    lease = current(run.root_uri)
    if not lease or not lease.get("stage"):
        return None
    state = "interrupted" if stale_reason(lease) else "running"
    p = read_progress(run)
    if p and p.get("updated_at", 0) >= lease.get("stage_started_at", 0):
        age = f" ({fmt_duration(time.time() - p['updated_at'])} ago)" if state == "interrupted" else ""
        what = f"{p.get('desc', '')}: {p.get('line', '')}{age}"
    else:
        what = f"started {fmt_duration(time.time() - lease.get('stage_started_at', time.time()))} ago"
    return lease["stage"], state, what
