"""A rehearsal of `cqg-ray run` end to end on a local Ray at 100k, 300k and 1M synthetic texts (issue 31).

    python bench/scale.py [--sizes 100000 300000 1000000] [--out scale.json] [--work DIR] [--keep]

What runs is the real pipeline: for each size, `python -m cqg_ray.cli run -c <config>` in a subprocess of its own
(so the driver's VmHWM is that process's), which starts its own local Ray (RAY_ADDRESS=local) and runs every stage,
prepare -> encode -> cluster -> questions -> labels -> model -> evaluation, writing a run directory. The shapes are
realistic: d = 384, k = N/1000 clusters, two generation prompts a cluster and t = 2 questions kept of them (m = N/500;
the paper keeps ~1.9 a cluster), 300 + 180 + 120 texts a question (the paper's 500/300/200 proportions), so about
1.2 N labelled pairs (at least N).

Two things are cheap stand-ins, so that the three sizes fit in well under 45 minutes on 2 cores:
  * THE ENCODER IS A STATIC EMBEDDING: a sentence-transformers `StaticEmbedding` (mean of token vectors, no
    transformer) built from the bundled MiniLM's tokenizer and its 384-d word-embedding matrix, saved once as a
    sentence-transformers folder (under ~/.cache/cqg-ray/bench/, or $CQG_RAY_CACHE/bench/) and loaded by the real
    encoder interface (`cqg_ray.encoder.load_encoder`, backend torch-float32) in the real encode actor pool. Nothing
    loads from a model hub.
  * THE LLM IS FAKE: `llm.backend: fake` (`cqg_ray.llm.engines.fake.FakeBackend`: hashed answers, three questions a
    generation prompt, of which its parser keeps one, as they differ in a digit only; no model) behind the real
    engine interface; generation, probing and labelling stream
    through `cqg_ray/llm/stream.py` as they would with a real engine. The fake's questions all open alike, so
    the opening filter is lifted (`cqg.max_opening_share: 1.0`), the own-cluster filter is off (its random answers
    would drop most questions) and theta is 1.0 (its questions differ in one hashed tag only, which the static
    encoder cannot tell apart at 0.8). So this measures the orchestration and the data movement, not an encoder or
    an LLM.

Training is data-parallel and sized like its data: one Ray Train worker per 250k texts (1 at 100k, 2 at 300k, 4 at 1M;
`train.num_workers`), since each worker holds its shard's embeddings (about 68k labelled texts, 100 MB, a worker) and
the heads with Adam's state (99 MB at m = 2,000). With one worker at 1M that worker alone held 1,222 MB.

The texts are sentences of ../shared/data/corpus/sentences.jsonl.gz (340k), drawn seeded, each made unique by a
counter word ("... [w123]"), so dedup keeps all N; they are written as JSONL input files of --rows-per-file rows.

Printed per size and stage (a stage's figures are taken from when the stage's folder has no manifest yet to when
it has one; polled every 0.5 s, so a stage's first half second may count to the one before):
  wall       the stage's seconds from its manifest
  driver     peak RSS of the `cqg-ray run` process during the stage (its VmHWM, reset at each stage start by
             writing 5 to /proc/<pid>/clear_refs)
  worker     the largest peak RSS (VmHWM, reset likewise) of the Ray worker processes (`ray::...`) during the
             stage; VmHWM counts the object store pages a worker has mapped; beside it what that process ran
  anon       the largest private memory (RssAnon: without the object store's shared pages) of a worker, polled
  shm        the shared pages (RssShmem: the object store's) that the largest worker had mapped at its peak
  spilled    bytes of the spill files that appeared during the stage (Ray's spill directory, set to a folder of
             this bench by RAY_object_spilling_directory, listed every 0.5 s)
  files      files under the stage's folder of the run directory (+ its LLM ledger folder, for LLM stages)
The last two lines are `worker_rss_growth_1M_over_100k: Y` (for the stage with the largest worker peak at the
largest size: that stage's worker peak at the largest size over the smallest) and
`driver_rss_growth_1M_over_100k: X` (the process's peak at the largest size over the smallest); the targets are
<= 1.5 and <= 1.3. docs/scale.md has the figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import DATA, cpu_line, read_texts

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
STS = os.path.abspath(os.path.join(ROOT, "..", "shared", "data", "sts", "STSBenchmark.test.tsv"))
STAGES = ("prepare", "encode", "cluster", "questions", "labels", "model", "evaluation")  # cqg_ray.stages.NAMES
LEDGERS = {"questions": "questions", "labels": "labels"}  # stage -> its folder under llm/ledger/
ENCODER_DIR = "static-minilm-384"
NOTE = ("encoder: a STATIC EMBEDDING (sentence-transformers StaticEmbedding from the bundled MiniLM's tokenizer and "
        "384-d word embeddings, loaded by cqg_ray.encoder); LLM: the FAKE engine (llm.backend: fake) behind the real "
        "engine interface: this measures orchestration and data movement, not an encoder or an LLM")


# ---------------------------------------------------------------------------------------------- pure helpers
def cache_base() -> str:
    """The machine cache's bench/ (`cqg_ray.cache`), beside the encoders'."""
    from cqg_ray.cache import cache_root

    return str(cache_root() / "bench")


def static_encoder(folder: str | None = None) -> str:
    """The static-embedding encoder folder, built once: a sentence-transformers `StaticEmbedding` with the bundled
    MiniLM's tokenizer and word-embedding matrix (30,522 x 384), saved by `SentenceTransformer(modules=[...]).save`.
    Built into a temporary folder beside it and renamed, so a half-written folder is never used."""
    folder = folder or os.path.join(cache_base(), ENCODER_DIR)
    if os.path.exists(os.path.join(folder, "modules.json")):
        return folder
    from safetensors import safe_open
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    try:
        from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import StaticEmbedding

    from cqg_ray.encoder import resolve_encoder_path

    minilm = resolve_encoder_path("bundled:all-MiniLM-L6-v2")
    with safe_open(os.path.join(minilm, "model.safetensors"), "pt") as f:
        name = next(k for k in f.keys() if k.endswith("word_embeddings.weight"))
        weights = f.get_tensor(name).float()
    module = StaticEmbedding(Tokenizer.from_file(os.path.join(minilm, "tokenizer.json")), embedding_weights=weights)
    os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".building-", dir=os.path.dirname(os.path.abspath(folder)))
    try:
        SentenceTransformer(modules=[module], device="cpu").save(tmp)
        try:
            os.replace(tmp, folder)
        except OSError:  # built meanwhile by another process
            if not os.path.exists(os.path.join(folder, "modules.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def unique_text(sentence: str, i: int) -> str:
    """Row i's text: the sentence and a counter word, so that no two rows are equal."""
    return f"{sentence} [w{i}]"


def write_corpus(out_dir: str, n: int, sentences: list[str], rows_per_file: int = 100_000, seed: int = 0) -> list[str]:
    """n unique texts as JSONL files {"text", "source"} of rows_per_file rows: the sentences in a seeded order,
    cycled, each with its row's counter word. Returns the files' paths."""
    if not sentences:
        raise ValueError("no sentences to draw from")
    order = list(range(len(sentences)))
    random.Random(seed).shuffle(order)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for f, start in enumerate(range(0, n, rows_per_file)):
        path = os.path.join(out_dir, f"texts-{f:04d}.jsonl")
        with open(path, "w", encoding="utf-8") as fh:
            for i in range(start, min(n, start + rows_per_file)):
                fh.write(json.dumps({"text": unique_text(sentences[order[i % len(order)]], i), "source": "synthetic"}) + "\n")
        paths.append(path)
    return paths


TEXTS_PER_TRAIN_WORKER = 250_000  # corpus texts per Ray Train worker (about 68k labelled texts, 100 MB of embeddings)


def train_workers(n: int) -> int:
    """Ray Train workers for n texts: data-parallel training is sized by its data, each worker holding its shard."""
    return max(1, -(-n // TEXTS_PER_TRAIN_WORKER))


def scale_config(n: int, run_dir: str, inputs: list[str], encoder: str, sts: str = STS) -> dict:
    """The pipeline config of one size (a dict for `config_from_dict` / YAML)."""
    return {
        "run_dir": run_dir,
        "corpus": {"paths": list(inputs), "format": "jsonl"},
        "encode": {"model": encoder, "backend": "torch-float32", "batch_size": 256},
        "cluster": {"k": max(2, n // 1000)},
        "llm": {"backend": "fake"},
        "cqg": {"prompts_per_cluster": 2, "t": 2, "theta": 1.0, "max_opening_share": 1.0, "filters": ["copy", "example", "long", "cut_off", "opening"]},
        "label": {"n_cluster": 300, "n_neighbor": 180, "n_random": 120},
        "train": {"epochs": 1, "checkpoint_every": 1, "lr": 0.001, "num_workers": train_workers(n)},
        "evaluate": {"tasks": ["sts"], "sts": [sts], "baselines": ["dense"], "active_k": [16, 64], "tau_sweep": [0.5]},
    }


def code_line() -> str:
    """The commit the rehearsal ran, and whether cqg_ray/ had changes beside it (others work in the same checkout)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--short", "cqg_ray"], cwd=ROOT, capture_output=True, text=True).stdout.split("\n")
        dirty = [line[3:] for line in dirty if line.strip()]
    except OSError:
        return "unknown (no git)"
    return f"commit {head or 'unknown'}" + (f", uncommitted changes in {', '.join(dirty)}" if dirty else "")


def size_name(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def growth(results: dict[int, dict]) -> tuple[float, float, str]:
    """(worker growth, driver growth, the stage of the worker figure): the largest size over the smallest. The worker
    figure is for the stage whose worker peak is largest at the largest size; the driver's is the process's peak."""
    small, large = min(results), max(results)
    ls, ss = results[large]["stages"], results[small]["stages"]
    stage = max((s for s in ls if ls[s].get("worker_rss_mb")), key=lambda s: ls[s]["worker_rss_mb"])
    w = ls[stage]["worker_rss_mb"] / ss[stage]["worker_rss_mb"] if ss.get(stage, {}).get("worker_rss_mb") else float("nan")
    d = results[large]["driver_rss_mb"] / results[small]["driver_rss_mb"]
    return w, d, stage


def growth_lines(worker: float, driver: float) -> list[str]:
    """The bench's last two lines."""
    return [f"worker_rss_growth_1M_over_100k: {worker:.3f}", f"driver_rss_growth_1M_over_100k: {driver:.3f}"]


def current_stage(run_dir: str) -> str:
    """The stage running now: the first without a manifest ("startup" before prepare's folder exists, "done" after
    the last)."""
    if not os.path.isdir(os.path.join(run_dir, STAGES[0])):
        return "startup"
    for s in STAGES:
        if not os.path.exists(os.path.join(run_dir, s, "_manifest.json")):
            return s
    return "done"


def task_name(process_name: str) -> str:
    """A Ray worker's process title without its prefix and Ray Data's wrapping: "ray::MapWorker(MapBatches(X)).submit"
    -> "MapBatches(X)"."""
    name = process_name.removeprefix("ray::").removesuffix(".submit").removesuffix(".__init__")
    if name.startswith("MapWorker(") and name.endswith(")"):
        name = name[len("MapWorker("):-1]
    return name


def count_files(folder: str) -> int:
    return sum(len(files) for _, _, files in os.walk(folder)) if os.path.isdir(folder) else 0


def fmt_bytes(b: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{int(b)} B"


# ---------------------------------------------------------------------------------------------- measuring a process tree
def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _reset_hwm(pid: int) -> None:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS (Linux >= 4.0)
    except OSError:
        pass


class Monitor(threading.Thread):
    """Polls the `cqg-ray run` process tree every `interval` s and keeps, per stage, the driver's and the workers'
    peak RSS (VmHWM, reset at each stage start), the largest Ray system process (raylet, gcs), and the spill files."""

    def __init__(self, pid: int, run_dir: str, spill_dir: str, interval: float = 0.5):
        super().__init__(daemon=True)
        self.pid, self.run_dir, self.spill_dir, self.interval = pid, run_dir, spill_dir, interval
        self.stages: dict[str, dict] = {}
        self.stage, self.stop = None, threading.Event()
        self.spill_seen: dict[str, int] = {}
        self.spill_peak_disk = 0

    def _tree(self):
        import psutil

        workers, system = [], []
        try:
            for p in psutil.Process(self.pid).children(recursive=True):
                try:
                    name, cmd = p.name(), " ".join(p.cmdline()[:3])
                except psutil.Error:
                    continue
                (workers if name.startswith("ray::") or "default_worker" in cmd else system).append((p.pid, name))
        except psutil.Error:
            pass
        return workers, system

    def _rec(self, stage: str) -> dict:
        return self.stages.setdefault(stage, {"driver_rss_mb": 0.0, "worker_rss_mb": 0.0, "worker": "", "worker_anon_mb": 0.0, "worker_shm_mb": 0.0,
                                              "system_rss_mb": 0.0, "spilled_bytes": 0, "spill_files": 0, "t0": time.time(),
                                              "_tasks": {}, "_peak_pid": None})

    def poll(self) -> None:
        stage = current_stage(self.run_dir)
        workers, system = self._tree()
        if stage != self.stage:
            if self.stage is not None:
                self._sample(self.stage, workers, system)  # the stage that ended, up to now
                self._rec(self.stage)["t1"] = time.time()
            for pid in [self.pid] + [p for p, _ in workers + system]:
                _reset_hwm(pid)
            self.stage = stage
        self._sample(stage, workers, system)

    def _sample(self, stage: str, workers, system) -> None:
        r = self._rec(stage)
        r["driver_rss_mb"] = max(r["driver_rss_mb"], _status_kb(self.pid, "VmHWM") / 1024)
        for pid, name in workers:
            if name.startswith("ray::") and name != "ray::IDLE":  # what the process ran during the stage (its peak may come after, when it is idle)
                r["_tasks"].setdefault(pid, set()).add(task_name(name))
            mb = _status_kb(pid, "VmHWM") / 1024
            if mb > r["worker_rss_mb"]:
                r["worker_rss_mb"], r["_peak_pid"] = mb, pid
                r["worker_shm_mb"] = _status_kb(pid, "RssShmem") / 1024
            r["worker_anon_mb"] = max(r["worker_anon_mb"], _status_kb(pid, "RssAnon") / 1024)
        if r["_peak_pid"] is not None:
            r["worker"] = ", ".join(sorted(r["_tasks"].get(r["_peak_pid"], ()))) or "(idle: a task of an earlier stage)"
        for pid, _ in system:
            r["system_rss_mb"] = max(r["system_rss_mb"], _status_kb(pid, "VmHWM") / 1024)
        disk = 0
        for root, _, files in os.walk(self.spill_dir):
            for f in files:
                path = os.path.join(root, f)
                try:
                    size = os.path.getsize(path)
                except OSError:
                    continue
                disk += size
                if path not in self.spill_seen:
                    r["spilled_bytes"] += size
                    r["spill_files"] += 1
                elif size > self.spill_seen[path]:
                    r["spilled_bytes"] += size - self.spill_seen[path]
                self.spill_seen[path] = max(size, self.spill_seen.get(path, 0))
        self.spill_peak_disk = max(self.spill_peak_disk, disk)

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            self.stop.wait(self.interval)


# ---------------------------------------------------------------------------------------------- one size
def run_size(n: int, work: str, encoder: str, sentences: list[str], rows_per_file: int, log) -> dict:
    """Write the corpus and config of size n under work/, run `cqg-ray run` on it, return the figures."""
    import yaml

    folder = os.path.join(work, f"n{n}")
    shutil.rmtree(folder, ignore_errors=True)
    t0 = time.time()
    inputs = write_corpus(os.path.join(folder, "input"), n, sentences, rows_per_file)
    input_bytes = sum(os.path.getsize(p) for p in inputs)
    write_s = time.time() - t0
    run_dir, spill = os.path.join(folder, "run"), os.path.join(folder, "spill")
    os.makedirs(spill, exist_ok=True)
    cfg_path = os.path.join(folder, "config.yaml")
    with open(cfg_path, "w") as f:
        yaml.safe_dump(scale_config(n, run_dir, inputs, encoder), f)
    ray_tmp = tempfile.mkdtemp(prefix="cqgs-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**os.environ, "RAY_ADDRESS": "local", "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "CQG_RAY_PROGRESS": "0", "RAY_TMPDIR": ray_tmp, "RAY_object_spilling_directory": spill,
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log_path = os.path.join(folder, "run.log")
    t0 = time.time()
    with open(log_path, "w") as lf:
        p = subprocess.Popen([sys.executable, "-m", "cqg_ray.cli", "run", "-c", cfg_path], cwd=ROOT, env=env, stdout=lf, stderr=subprocess.STDOUT)
        mon = Monitor(p.pid, run_dir, spill)
        mon.start()
        rc = p.wait()
        mon.stop.set()
        mon.join()
    wall = time.time() - t0
    shutil.rmtree(ray_tmp, ignore_errors=True)
    stages = {}
    for s in STAGES:
        r = dict(mon.stages.get(s, {}))
        if not r:
            continue
        mpath = os.path.join(run_dir, s, "_manifest.json")
        manifest = json.load(open(mpath)) if os.path.exists(mpath) else None
        r["wall_s"] = round(manifest["seconds"], 1) if manifest else round(r.get("t1", time.time()) - r["t0"], 1)
        r["finished"] = manifest is not None
        r["counts"] = (manifest or {}).get("counts", {})
        r["files"] = count_files(os.path.join(run_dir, s))
        r["ledger_files"] = count_files(os.path.join(run_dir, "llm", "ledger", LEDGERS[s])) if s in LEDGERS else 0
        for k in ("driver_rss_mb", "worker_rss_mb", "worker_anon_mb", "worker_shm_mb", "system_rss_mb"):
            r[k] = round(r[k], 1)
        for k in ("t0", "t1", "_tasks", "_peak_pid"):
            r.pop(k, None)
        stages[s] = r
    with open(log_path) as f:
        tail = f.read()[-3000:]
    out = {"n": n, "rc": rc, "wall_s": round(wall, 1), "corpus_write_s": round(write_s, 1), "input_files": len(inputs), "input_bytes": input_bytes,
           "stages": stages, "driver_rss_mb": max((r["driver_rss_mb"] for r in stages.values()), default=0.0),
           "spill_peak_on_disk_bytes": mon.spill_peak_disk, "log": log_path}
    if rc != 0:
        failed = next((s for s in STAGES if s in stages and not stages[s]["finished"]), mon.stage)
        out["failed_stage"] = failed
        out["log_tail"] = tail
        log(f"size {n:,} FAILED (exit {rc}) in stage {failed}: driver peak {stages.get(failed, {}).get('driver_rss_mb')} MB, "
            f"worker peak {stages.get(failed, {}).get('worker_rss_mb')} MB ({stages.get(failed, {}).get('worker')}); log {log_path}:\n{tail}")
    return out


def print_size(r: dict, log) -> None:
    n = r["n"]
    st = r["stages"]
    pairs = st.get("labels", {}).get("counts", {}).get("pairs_labelled")
    m = st.get("questions", {}).get("counts", {}).get("questions")
    log(f"--- {n:,} texts ({size_name(n)}): {r['wall_s']:.0f} s in all (exit {r['rc']}); {r['input_files']} JSONL inputs, {fmt_bytes(r['input_bytes'])}; "
        f"k = {max(2, n // 1000)}, m = {m}, labelled pairs = {pairs}")
    log(f"{'stage':<11} {'wall s':>8} {'driver MB':>10} {'worker MB':>10} {'anon MB':>8} {'shm MB':>7} {'spilled':>10} {'files':>7}  "
        "the largest worker ran")
    for s in STAGES:
        if s not in st:
            continue
        x = st[s]
        files = f"{x['files']}" + (f"+{x['ledger_files']}" if x["ledger_files"] else "")
        log(f"{s:<11} {x['wall_s']:>8.1f} {x['driver_rss_mb']:>10.0f} {x['worker_rss_mb']:>10.0f} {x['worker_anon_mb']:>8.0f} {x['worker_shm_mb']:>7.0f} "
            f"{fmt_bytes(x['spilled_bytes']):>10} {files:>7}  {x['worker'][:80]}{'' if x['finished'] else '  (did not finish)'}")
    log(f"driver peak (whole run) {r['driver_rss_mb']:.0f} MB; spill files on disk at most {fmt_bytes(r['spill_peak_on_disk_bytes'])}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000], help="texts per run")
    ap.add_argument("--out", default=None, help="write every figure as JSON here")
    ap.add_argument("--work", default=None, help="folder for inputs and run directories (default: a temporary one, removed)")
    ap.add_argument("--keep", action="store_true", help="keep each size's inputs and run directory (default: removed after its figures; "
                    "its config.yaml and run.log stay in --work)")
    ap.add_argument("--rows-per-file", type=int, default=100_000, help="rows per JSONL input file")
    ap.add_argument("--encoder", default=None, help="the static encoder's folder (default: built once under ~/.cache/cqg-ray/bench/)")
    a = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    log(cpu_line())
    log(f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    log(NOTE)
    log(f"code: {code_line()}")
    t0 = time.time()
    encoder = static_encoder(a.encoder)
    log(f"static encoder: {encoder} ({time.time() - t0:.1f} s)")
    sentences = read_texts(DATA, 10**9, min_chars=20)
    work = a.work or tempfile.mkdtemp(prefix="cqg-scale-")
    results: dict[int, dict] = {}
    try:
        for n in a.sizes:
            r = results[n] = run_size(n, work, encoder, sentences, a.rows_per_file, log)
            print_size(r, log)
            if not a.keep:  # the inputs, run directory and spill files go; the config and the run's log stay (with --work)
                for sub in ("input", "run", "spill"):
                    shutil.rmtree(os.path.join(work, f"n{n}", sub), ignore_errors=True)
    finally:
        if not a.work and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"cpu": cpu_line(), "code": code_line(), "note": NOTE, "sizes": {str(n): r for n, r in results.items()}}, f, indent=1)
    ok = {n: r for n, r in results.items() if r["rc"] == 0}
    if len(ok) < 2:
        log("fewer than two sizes finished: no growth figures")
        return 1
    w, d, stage = growth(ok)
    small, large = min(ok), max(ok)
    log(f"growth {size_name(large)} over {size_name(small)}: worker peak of the largest stage ({stage}) "
        f"{ok[large]['stages'][stage]['worker_rss_mb']:.0f} / {ok[small]['stages'][stage]['worker_rss_mb']:.0f} MB (target <= 1.5); "
        f"driver peak {ok[large]['driver_rss_mb']:.0f} / {ok[small]['driver_rss_mb']:.0f} MB (target <= 1.3)")
    st_l, st_s = ok[large]["stages"], ok[small]["stages"]
    anon = max((s for s in st_l if s in st_s and st_s[s]["worker_anon_mb"]), key=lambda s: st_l[s]["worker_anon_mb"])
    log(f"private memory (RssAnon, without the object store's pages) of the stage with the largest at {size_name(large)} ({anon}): "
        f"{st_l[anon]['worker_anon_mb']:.0f} / {st_s[anon]['worker_anon_mb']:.0f} MB = {st_l[anon]['worker_anon_mb'] / st_s[anon]['worker_anon_mb']:.3f}")
    for line in growth_lines(w, d):
        log(line)
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
