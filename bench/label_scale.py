"""The label stage alone at 100k and 1M (text, question) pairs: does the driver stay flat?

    python bench/label_scale.py [--sizes 100000 1000000] [--texts 50000]

Each size runs in a fresh process of its own (so its peak RSS is its own): a local Ray with every CPU and the real
stage (`cqg_ray.mbqa.label.run_labels`: plan -> plan Parquet -> count, answer and assemble passes over Ray Data ->
labels.parquet), with the FAKE engine (`llm.backend: fake`, `cqg_ray.llm.engines.fake.FakeBackend`: hashed answers, no model)
behind the real engine interface, in the real engine actor pool. So it measures the orchestration, not an LLM.
The run directory is synthetic and the same for both sizes: the first --texts sentences of
../shared/data/corpus/sentences.jsonl.gz in 100 clusters; the sizes differ only in the number of questions
(pairs / 1000: the paper's 500 own-cluster + 300 neighbour + 200 random texts per question), single-pass answers.

Printed per size: wall time of the stage, peak driver RSS (VmHWM of the driver process), peak worker RSS (the largest
VmHWM of the Ray worker processes, polled every 0.5 s), ledger objects written (Parquet shards; journals left: 0),
and resume: the same stage again (force) sends nothing. Then, at the largest size, a kill -9: the stage runs in a
process of its own, which is killed with its whole tree (driver, Ray, workers) once about a third of the answers are
journalled; the rerun's count of answers taken from the ledger must equal those finished before the kill (nothing
finished is sent again), and the time from its start to its "to send" line is the time to resume (target < 60 s).
Last line: `label_driver_rss_growth_1M_over_100k: X` (driver VmHWM at the largest size over the smallest; target <= 1.3).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("CQG_RAY_PROGRESS", "0")

from _common import DATA, cpu_line, read_texts

CLUSTERS = 100
PER_QUESTION = 1000  # 500 + 300 + 200


def vm_hwm_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def build_run(run_dir: str, n_texts: int, n_questions: int) -> None:
    """prepare/, cluster/ and questions/ of a synthetic run, with manifests, as the stages would leave them."""
    import numpy as np
    import pyarrow as pa

    from cqg_ray.rundir import RunDir, run_stage

    run = RunDir(run_dir)
    texts = read_texts(DATA, n_texts, min_chars=40)
    ids = np.array([f"doc{i:07d}" for i in range(len(texts))], dtype=object)
    rng = np.random.default_rng(0)
    cluster = rng.integers(0, CLUSTERS, len(texts)).astype(np.int32)

    def prepare(ctx):
        for s, start in enumerate(range(0, len(texts), 50_000)):
            run.write_table(f"prepare/part-{s:05d}.parquet", pa.table({"doc_id": ids[start:start + 50_000], "text": texts[start:start + 50_000]}))

    def clusters(ctx):
        run.write_table("cluster/assignments.parquet", pa.table({"doc_id": ids, "cluster": cluster}))
        nb = [[(c + j) % CLUSTERS for j in range(1, 6)] for c in range(CLUSTERS)]
        run.write_table("cluster/neighbors.parquet", pa.table({"cluster": np.arange(CLUSTERS, dtype=np.int32), "neighbors": nb,
                                                               "size": np.bincount(cluster, minlength=CLUSTERS)}))

    def questions(ctx):
        q = [f"Does the text mention topic number {i} of the synthetic set?" for i in range(n_questions)]
        run.write_table("questions/questions.parquet", pa.table({"question_id": np.arange(n_questions, dtype=np.int32), "text": q,
                                                                 "cluster": (np.arange(n_questions) % CLUSTERS).astype(np.int32)}))

    for stage, fn in (("prepare", prepare), ("cluster", clusters), ("questions", questions)):
        run_stage(run, stage, "bench", fn, deps=[])


def one(run_dir: str) -> dict:
    """The stage in this process (the driver) on a local Ray; returns the measures."""
    import psutil

    from cqg_ray.config import PipelineConfig
    from cqg_ray.llm.ledger import Ledger
    from cqg_ray.mbqa.label import run_labels
    from cqg_ray.pipeline import init_ray
    from cqg_ray.rundir import RunDir, run_stage

    cfg = PipelineConfig(run_dir=run_dir, llm={"backend": "fake"})
    init_ray(cfg.ray)
    worker_peak = {"mb": 0.0}
    stop = threading.Event()

    def poll():
        me = psutil.Process()
        while not stop.is_set():
            for p in me.children(recursive=True):
                try:
                    if p.name().startswith("ray::") or "default_worker" in " ".join(p.cmdline()[:3]):
                        worker_peak["mb"] = max(worker_peak["mb"], vm_hwm_mb(p.pid))
                except (psutil.Error, OSError):
                    pass
            stop.wait(0.5)

    threading.Thread(target=poll, daemon=True).start()
    run = RunDir(run_dir)
    t0 = time.time()
    m = run_stage(run, "labels", "bench", lambda ctx: run_labels(cfg, ctx, progress=False), deps=[])
    wall = time.time() - t0
    ledger = Ledger(run, "labels")
    shards, journals = len(ledger.shards()), len(ledger.journals())
    t1 = time.time()
    run_stage(run, "labels", "bench", lambda ctx: run_labels(cfg, ctx, progress=False), deps=[], force=True)
    resume = time.time() - t1
    stop.set()
    last = ledger.read_stats()["runs"][-1]
    return {"pairs": m["counts"]["pairs_labelled"], "planned": m["counts"]["pairs_planned"], "wall_s": round(wall, 1),
            "driver_rss_mb": round(vm_hwm_mb(), 1), "worker_rss_mb": round(worker_peak["mb"], 1), "ledger_objects": shards,
            "journals_left": journals, "rerun_sent": last["sent"], "rerun_from_ledger": last["from_ledger"], "rerun_s": round(resume, 1)}


def once(run_dir: str) -> dict:
    """The stage once in this process (forced); the seconds from start to its "to send" log line, and its run stats."""
    import logging

    from cqg_ray.config import PipelineConfig
    from cqg_ray.llm.ledger import Ledger
    from cqg_ray.mbqa.label import run_labels
    from cqg_ray.pipeline import init_ray
    from cqg_ray.rundir import RunDir, run_stage

    t0 = time.time()
    seen = {}

    class ToSend(logging.Handler):
        def emit(self, record):
            if "to send" in record.getMessage() and "s" not in seen:
                seen["s"] = time.time() - t0

    logging.getLogger("cqg_ray").addHandler(ToSend())
    logging.getLogger("cqg_ray").setLevel(logging.INFO)
    cfg = PipelineConfig(run_dir=run_dir, llm={"backend": "fake"})
    init_ray(cfg.ray)
    run = RunDir(run_dir)
    run_stage(run, "labels", "bench", lambda ctx: run_labels(cfg, ctx, progress=False), deps=[], force=True)
    last = Ledger(run, "labels").read_stats()["runs"][-1]
    return {"to_send_line_s": round(seen.get("s", float("nan")), 1), "wall_s": round(time.time() - t0, 1), "sent": last["sent"],
            "from_ledger": last["from_ledger"], "requests": last["requests"]}


def finished_rows(run_dir: str) -> int:
    """Answers in the labels ledger: shard rows plus whole journal lines."""
    import glob

    import pyarrow.parquet as pq

    folder = os.path.join(run_dir, "llm", "ledger", "labels")
    rows = sum(pq.read_metadata(f).num_rows for f in glob.glob(os.path.join(folder, "*.parquet")))
    for f in glob.glob(os.path.join(folder, "*.jsonl")):
        with open(f, "rb") as fh:
            for line in fh:
                try:
                    rows += isinstance(json.loads(line), dict)
                except ValueError:
                    pass
    return rows


def kill_and_resume(run_dir: str, planned: int) -> dict:
    """kill -9 the stage's whole process tree once ~1/3 of ``planned`` answers are in the ledger, then rerun it."""
    import signal

    import psutil

    p = subprocess.Popen([sys.executable, __file__, "--once", run_dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    while p.poll() is None and finished_rows(run_dir) < planned // 3:
        time.sleep(0.5)
    tree = [p.pid] + [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()
    time.sleep(2)
    before = finished_rows(run_dir)
    out = subprocess.run([sys.executable, __file__, "--once", run_dir], capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        sys.exit(f"the rerun after the kill failed:\n{out.stderr[-4000:]}")
    return {"finished_before_rerun": before, **json.loads(lines[-1][len("RESULT "):])}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="(text, question) pairs per run")
    ap.add_argument("--texts", type=int, default=50_000, help="corpus texts (the same corpus for every size)")
    ap.add_argument("--no-kill", action="store_true", help="skip the kill -9 and resume at the largest size")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run the stage in this process
    ap.add_argument("--once", default=None, help=argparse.SUPPRESS)  # internal: the stage once, forced, for kill/resume
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(one(a.one)), flush=True)
        return
    if a.once:
        print("RESULT " + json.dumps(once(a.once)), flush=True)
        return

    print(cpu_line())
    print("engine: the fake engine (llm.backend: fake, FakeBackend) behind the real engine interface and actor pool: no LLM")
    results = {}
    with tempfile.TemporaryDirectory(prefix="label-scale-") as tmp:
        for n in a.sizes:
            run_dir = os.path.join(tmp, f"run-{n}")
            build_run(run_dir, a.texts, n // PER_QUESTION)
            out = subprocess.run([sys.executable, __file__, "--one", run_dir], capture_output=True, text=True)
            lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
            if out.returncode or not lines:
                sys.exit(f"size {n} failed:\n{out.stderr[-4000:]}")
            r = results[n] = json.loads(lines[-1][len("RESULT "):])
            print(f"{n:>9,} pairs ({r['pairs']:,} labelled of {r['planned']:,}): {r['wall_s']:.1f} s, driver peak RSS {r['driver_rss_mb']:.0f} MB, "
                  f"worker peak RSS {r['worker_rss_mb']:.0f} MB, ledger objects {r['ledger_objects']} (journals left {r['journals_left']}); "
                  f"rerun: {r['rerun_sent']} sent, {r['rerun_from_ledger']:,} from the ledger, {r['rerun_s']:.1f} s", flush=True)
        small, large = min(results), max(results)
        if not a.no_kill:
            run_dir = os.path.join(tmp, f"kill-{large}")
            build_run(run_dir, a.texts, large // PER_QUESTION)
            k = kill_and_resume(run_dir, results[large]["planned"])
            exact = k["from_ledger"] == k["finished_before_rerun"] and k["sent"] == k["requests"] - k["from_ledger"]
            print(f"kill -9 at {large:,} pairs after {k['finished_before_rerun']:,} answers: the rerun took {k['from_ledger']:,} from the "
                  f"ledger and sent {k['sent']:,} ({'nothing finished sent again' if exact else 'NOT EXACT'}); its 'to send' line "
                  f"after {k['to_send_line_s']:.1f} s (time to resume), the whole rerun {k['wall_s']:.1f} s", flush=True)
    print(f"label_driver_rss_growth_1M_over_100k: {results[large]['driver_rss_mb'] / results[small]['driver_rss_mb']:.3f}")


if __name__ == "__main__":
    main()
