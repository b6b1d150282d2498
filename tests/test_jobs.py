"""The pipeline as a Ray job, as users run it: `ray job submit ... -- python -m cqg_ray.cli run ...` against a real Ray
head started with `ray start --head`.

The head runs in its own temp dir and process group (`ray start --block`, started by this module and stopped by its
pid): `ray stop --force` would also kill every other Ray session on the machine.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.conftest import LLM_THREADS
from tests.ports import free_ports

ROOT = Path(__file__).resolve().parents[1]
RUN = ("python", "-m", "cqg_ray.cli", "run")  # the job entrypoint: the CLI itself
VENV_BIN = Path(sys.executable).parent
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "CQG_RAY_PROGRESS": "0", "TOKENIZERS_PARALLELISM": "false",
       "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0"}
ENV.pop("RAY_ADDRESS", None)
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def jobs_api(dashboard: str, path: str, timeout: float = 60):
    """GET the dashboard's Jobs REST API (what `ray job list/status/logs` call) over plain HTTP: the JSON answer."""
    import httpx

    r = httpx.get(f"{dashboard}/api/jobs/{path}", timeout=timeout)
    r.raise_for_status()
    return r.json()


def ray_cli(*args, timeout=120, check=True):
    r = subprocess.run([str(VENV_BIN / "ray"), *args], env=ENV, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"ray {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


PORT_CLASH = ("Address already in use", "Failed to start the grpc server", "is already in use")


class HeadStartError(RuntimeError):
    """`ray start` exited because a chosen port was taken."""


class Head:
    """A real single-node Ray head on 127.0.0.1 with the dashboard (the Jobs API) on a free port."""

    def __init__(self, tries: int = 3):
        for attempt in range(1, tries + 1):
            try:
                self._start()
                return
            except HeadStartError as e:  # a port taken between choosing and binding: fresh ports and a fresh temp dir
                if attempt == tries:
                    raise RuntimeError(f"ray start failed {tries} times; the last: {e}") from None

    def _start(self) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="rjt_", dir="/tmp")  # short: Ray's unix socket paths have a length limit
        gcs, dash, client, agent_http, agent_grpc, rt_agent, metrics, nm, om = free_ports(9)
        self.dashboard = f"http://127.0.0.1:{dash}"
        self.log = open(Path(self.temp_dir) / "ray_start.log", "w")
        cmd = [str(VENV_BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
               "--num-cpus", "2", "--num-gpus", "0", "--include-dashboard=true", "--dashboard-host", "127.0.0.1",
               "--dashboard-port", str(dash), "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent_http),
               "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(rt_agent),
               "--metrics-export-port", str(metrics), "--node-manager-port", str(nm), "--object-manager-port", str(om),
               "--temp-dir", self.temp_dir, "--disable-usage-stats"]
        self.proc = subprocess.Popen(cmd, env=ENV, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                log = self.start_log()
                self.stop()
                if any(m in log for m in PORT_CLASH):
                    raise HeadStartError(log)
                raise RuntimeError(f"ray start exited with {self.proc.returncode}: {log}")
            try:
                jobs_api(self.dashboard, "", timeout=10)
                return
            except Exception:  # the dashboard is not up yet
                time.sleep(1)
        log = self.start_log()
        self.stop()  # removes the temp dir with the log
        raise RuntimeError(f"the Ray head did not answer on {self.dashboard} within 180 s: {log}")

    def start_log(self) -> str:
        return (Path(self.temp_dir) / "ray_start.log").read_text()[-3000:]

    def submit(self, runtime_env: dict, *entrypoint: str) -> str:
        sid = f"cqg-test-{uuid.uuid4().hex[:8]}"
        ray_cli("job", "submit", "--address", self.dashboard, "--submission-id", sid, "--working-dir", str(ROOT),
                "--runtime-env-json", json.dumps(runtime_env), "--no-wait", "--", *entrypoint, timeout=300)
        return sid

    def wait(self, sid: str, timeout: float) -> str:
        """The job's terminal status, asked of the Jobs API over HTTP each second (a `ray job status` CLI process per
        poll cost ~1.5 s of CPU on the 2 cores the job runs on)."""
        deadline = time.time() + timeout
        status = "?"
        while time.time() < deadline:
            try:
                status = str(jobs_api(self.dashboard, sid)["status"])
            except Exception as e:  # the dashboard busy: ask again
                status = f"? ({type(e).__name__})"
            if status in TERMINAL:
                return status
            time.sleep(1)
        ray_cli("job", "stop", "--address", self.dashboard, sid, timeout=120, check=False)
        return f"TIMEOUT (last: {status})"

    def logs(self, sid: str) -> str:
        return jobs_api(self.dashboard, f"{sid}/logs", timeout=120)["logs"]

    def crashes(self) -> str:
        """Fatal errors of this head's Ray workers (a crashed actor's cause is only in its own log)."""
        out = []
        for f in sorted(Path(self.temp_dir).glob("session_*/logs/worker-*.err")):
            text = f.read_text(errors="replace")
            if "Fatal Python error" in text or "SIGSEGV" in text or "SIGILL" in text:
                out.append(f"{f.name}:\n{text[-2000:]}")
        return "\n".join(out)

    def stop(self) -> None:
        """Stop this head only: SIGTERM to the `ray start --block` process group (its Ray processes share its fate),
        SIGKILL to the group after 10 s (a graceful stop with Serve's actors up took 30 s), then SIGKILL to anything
        still running from this head's temp dir."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        time.sleep(2)
        for pid in _pids_using(self.temp_dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _pids_using(temp_dir: str) -> list[int]:
    """Processes whose command line names this head's temp dir (its raylet, GCS, dashboard, workers)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if temp_dir.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                continue
    return out


@pytest.fixture(scope="module")
def head():
    h = Head()
    try:
        yield h
    finally:
        h.stop()
        assert not _pids_using(h.temp_dir), "Ray processes of the test head survived its stop"


def runtime_env() -> dict:
    """jobs/runtime_env.yaml (its excludes keep .venv and runs/ out of the upload) with test env vars."""
    env = yaml.safe_load((ROOT / "jobs" / "runtime_env.yaml").read_text())
    env.pop("working_dir", None)  # --working-dir on the command line
    env["env_vars"] = {**env.get("env_vars", {}), "HF_HUB_OFFLINE": "1", "CQG_RAY_PROGRESS": "0", "RAY_AUTH_MODE": "disabled"}
    return env


def tiny_config(path: Path, run_dir: Path, corpus: Path, **sections) -> Path:
    cfg = {
        "run_dir": str(run_dir),
        "corpus": {"paths": [str(corpus)], "limit": 200, "rows_per_shard": 100},
        "encode": {"num_actors": 1, "batch_size": 32, "unit_rows": 50},
        "cluster": {"k": 8},
    }
    for k, v in sections.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    path.write_text(yaml.safe_dump(cfg))
    return path


def manifest(run_dir: Path, stage: str) -> dict:
    return json.loads((run_dir / stage / "_manifest.json").read_text())


# ------------------------------------------------------------------------------------------------ quick (no Ray)


def test_free_ports_are_distinct_bindable_and_below_the_kernels_ephemeral_range():
    ports = free_ports(9)
    assert len(set(ports)) == 9
    assert all(20000 <= p <= 32767 for p in ports)
    lo, _hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert max(ports) < lo
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def local_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *RUN[1:], *args], env=ENV, capture_output=True, text=True, timeout=60)


def test_help_names_the_options():
    r = local_run("--help")
    assert r.returncode == 0
    for word in ("--config", "--set", "--until", "--address", "ray job submit", "resume"):
        assert word in r.stdout


def test_bad_config_exits_2_with_the_key_named(tmp_path):
    cfgf = tmp_path / "bad.yaml"
    cfgf.write_text("cluster:\n  kk: 3\n")
    r = local_run("--config", str(cfgf))
    assert r.returncode == 2
    assert "cluster.kk: unknown key" in r.stderr
    r = local_run("--config", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "config file not found" in r.stderr
    r = local_run("--config", str(cfgf), "--until", "nothing")
    assert r.returncode == 2 and "invalid choice" in r.stderr


# ------------------------------------------------------------------------------------------------ real head


K = 6  # the clusters of the `--until cluster` job, which the full pipeline job resumes


@pytest.fixture(scope="module")
def until_cluster(head, tmp_path_factory, corpus_file):
    """One `--until cluster` job: (run dir, its config, the job's status and logs). test_submit_pipeline_until_cluster
    checks it; test_submit_full_pipeline_with_the_embedded_llm resumes a copy of its run (prepare, encode and cluster
    are not computed twice)."""
    tmp = tmp_path_factory.mktemp("until_cluster")
    run_dir = tmp / "run"
    cfgf = tiny_config(tmp / "tiny.yaml", run_dir, corpus_file, cluster={"k": K})
    sid = head.submit(runtime_env(), *RUN, "--config", str(cfgf), "--until", "cluster")
    status = head.wait(sid, timeout=900)
    return run_dir, cfgf, status, head.logs(sid)


@pytest.mark.slow
def test_submit_pipeline_until_cluster(head, until_cluster):
    run_dir, cfgf, status, logs = until_cluster
    assert status == "SUCCEEDED", logs[-5000:]
    # the job joined this head (not a Ray of its own) and ran the venv's python
    line = next(ln for ln in logs.splitlines() if ln.startswith("Ray: "))
    assert "1 node(s), 2 CPUs" in line and "local" not in line.split("(")[0]
    assert f"python {VENV_BIN / 'python'}" in line or str(VENV_BIN) in line
    assert "pipeline finished" in logs
    for stage in ("prepare", "encode", "cluster"):
        assert re_line(logs, stage, "done")
    # the artifacts
    assert manifest(run_dir, "prepare")["counts"]["documents"] == 200
    assert manifest(run_dir, "encode")["counts"]["documents"] == 200
    cl = manifest(run_dir, "cluster")
    assert cl["counts"]["clusters"] + cl["counts"]["empty_removed"] == K and cl["counts"]["documents"] == 200
    assert not (run_dir / "questions").exists()  # --until cluster
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["cluster"]["k"] == K and saved["corpus"]["limit"] == 200
    from cqg_ray.artifacts import Clusters
    from cqg_ray.rundir import RunDir

    c = Clusters.load(RunDir(str(run_dir)))
    assert c.k == cl["counts"]["clusters"] and len(c.labels) == 200 and set(c.labels.tolist()) == set(range(c.k))

    # resubmitting resumes: every stage is skipped
    sid2 = head.submit(runtime_env(), *RUN, "--config", str(cfgf), "--until", "cluster")
    assert head.wait(sid2, timeout=600) == "SUCCEEDED"
    logs2 = head.logs(sid2)
    for stage in ("prepare", "encode", "cluster"):
        assert f"{stage}: done (skipped; manifest matches)" in logs2
    assert manifest(run_dir, "cluster")["seconds"] == cl["seconds"]


@pytest.mark.slow
def test_submit_failing_stage_fails_the_job_with_a_clear_message(head, until_cluster, tmp_path, corpus_file):
    run_dir = tmp_path / "run"
    shutil.copytree(until_cluster[0] / "prepare", run_dir / "prepare")  # the same corpus section: prepare is skipped
    (tmp_path / "not-an-encoder").mkdir()  # a folder that holds no model: it passes the config's path check, the stage's actors fail
    cfgf = tiny_config(tmp_path / "tiny.yaml", run_dir, corpus_file, encode={"model": str(tmp_path / "not-an-encoder")})
    sid = head.submit(runtime_env(), *RUN, "--config", str(cfgf), "--until", "encode")
    status = head.wait(sid, timeout=600)
    logs = head.logs(sid)
    assert status == "FAILED", logs[-5000:]
    assert "error: the pipeline failed in stage encode" in logs
    assert "prepare: done (skipped; manifest matches)" in logs
    assert (run_dir / "prepare" / "_manifest.json").exists() and not (run_dir / "encode" / "_manifest.json").exists()


def re_line(logs: str, stage: str, state: str) -> bool:
    """The status table printed at the end has a row `<stage> <state> ...`."""
    return any(ln.split()[:2] == [stage, state] for ln in logs.splitlines() if ln.strip())


@pytest.mark.slow
def test_submit_full_pipeline_with_the_embedded_llm(head, until_cluster, tmp_path, corpus_file, shared_data):
    """Every stage through `ray job submit`: the bundled Qwen2.5-Coder-0.5B (llama.cpp) generates, probes and labels,
    Ray Train fits the heads, the evaluation runs on 150 STS-B test pairs. The job resumes a copy of the `--until
    cluster` job's run (same corpus, encode and cluster sections): its first three stages are skipped, the rest run."""
    run_dir = tmp_path / "run"
    shutil.copytree(until_cluster[0], run_dir)
    clustered = manifest(run_dir, "cluster")
    cfgf = tiny_config(
        tmp_path / "full.yaml", run_dir, corpus_file,
        cluster={"k": K},
        llm={"backend": "llamacpp", "flush_every": 1, "max_tokens_generate": 120,
             "llamacpp": {"n_ctx": 2048, "model": "bundled:qwen2.5-coder-0.5b", "n_threads": LLM_THREADS}},
        # own_cluster off: with 2 positive probes a question needs both to say yes, and on some CPUs (the AMX one's
        # bfloat16 engine, 2026-11-25) the 0.5B said yes to 1 of 2 for every candidate of these 3 clusters, leaving no
        # question for the stages after (the filters are tested in tests/cqg/test_stage.py). The property prompt with one
        # worked example (none: the 0.5B answers instead of asking) and no keywords: the prompt the 0.5B reads is most
        # of the job's time (the keywords are tested in tests/cqg/test_keywords.py)
        cqg={"n_p": 3, "n_h": 3, "n_e": 2, "questions_per_prompt": 5, "p_p": 2, "p_h": 1, "p_e": 1, "t": 2, "max_clusters": 3, "max_text_chars": 160,
             "examples": 1, "keywords": 0, "filters": ["copy", "example", "long", "cut_off", "opening"]},
        label={"n_cluster": 4, "n_neighbor": 2, "n_random": 2, "max_text_chars": 160},
        train={"epochs": 20, "lr": 0.003, "cpus_per_worker": 0.5, "checkpoint_every": 10},
        evaluate={"tasks": ["sts"], "sts": [str(shared_data / "sts" / "STSBenchmark.test.tsv")], "max_pairs": 150,
                  "baselines": ["dense"], "tau_sweep": [0.5], "m_sweep": [1]},
    )
    sid = head.submit(runtime_env(), *RUN, "--config", str(cfgf))
    status = head.wait(sid, timeout=2400)
    logs = head.logs(sid)
    assert status == "SUCCEEDED", logs[-6000:] + "\n" + head.crashes()
    for stage in ("prepare", "encode", "cluster", "questions", "labels", "model", "evaluation"):
        assert (run_dir / stage / "_manifest.json").exists(), stage
        assert re_line(logs, stage, "done"), stage
    for stage in ("prepare", "encode", "cluster"):  # from the copied run
        assert f"{stage}: done (skipped; manifest matches)" in logs, stage
    assert manifest(run_dir, "cluster") == clustered
    q = manifest(run_dir, "questions")["counts"]
    assert q["generation_prompts"] == 3 and q["questions"] >= 1
    lab = manifest(run_dir, "labels")["counts"]
    assert lab["pairs_planned"] == q["questions"] * 8 and lab["pairs_labelled"] > 0
    assert (run_dir / "model" / "heads.safetensors").exists()
    ev = json.loads((run_dir / "evaluation" / "results.json").read_text())
    assert "sts" in ev["scores"]
    # the model the LLM-labelled data trained loads through the public API and embeds
    from cqg_ray import InterpretableEmbedder

    model = InterpretableEmbedder.load(str(run_dir / "model"))
    kept = manifest(run_dir, "model")["counts"]  # the questions that cannot be learnt left the model (docs/mbqa.md)
    assert model.m == kept["questions"] == q["questions"] - kept["questions_dropped"] >= 1
    bits = model.encode(["A man is playing a guitar.", "Stocks fell sharply on Monday."], progress=False)
    assert bits.shape == (2, model.m) and set(bits.ravel().tolist()) <= {0, 1}
    ex = model.explain("A man is playing a guitar.", "A man plays the guitar.")
    assert ex.cognitive_load == len(ex.shared_yes)
    assert (run_dir / "model" / "eval_report.json").exists()



@pytest.mark.slow
def test_submit_serve_deploys_and_returns(head, tmp_path):
    """`ray job submit -- python -m cqg_ray.cli serve MODEL` on a cluster deploys the application and the job ends;
    the application keeps answering over HTTP after the job, until `serve shutdown`."""
    import httpx

    from cqg_ray.mbqa.toy import build_toy_model

    model = build_toy_model(str(tmp_path / "model"))
    port = free_ports(1)[0]
    sid = head.submit(runtime_env(), "python", "-m", "cqg_ray.cli", "serve", model, "--port", str(port),
                      "--set", "num_cpus_per_replica=0.5")
    status = head.wait(sid, timeout=600)
    logs = head.logs(sid)
    assert status == "SUCCEEDED", logs[-5000:]
    assert f"serving {model} at http://127.0.0.1:{port}/ui  (application 'cqg-mbqa'" in logs
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/explain", json={"text_a": "a film with good actors", "text_b": "a movie I liked"},
                       timeout=60)
        assert r.status_code == 200 and r.json()["m"] == 32
    finally:
        down = subprocess.run([str(VENV_BIN / "serve"), "shutdown", "--address", head.dashboard, "--yes"], env=ENV,
                              capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr[-3000:]
    deadline = time.time() + 60  # the proxy stops shortly after the shutdown returns
    while time.time() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        except httpx.TransportError:
            break
        time.sleep(1)
    else:
        raise AssertionError("the application still answers after `serve shutdown`")
